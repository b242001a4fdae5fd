//! Big bodies through the HTTP engine, both ways, with a length and chunked: every byte
//! checked against the pattern as it arrives, and the process' peak memory far below the
//! bodies' size (they stream; nothing holds a whole body).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use harness::*;
use http_body_util::BodyExt;
use hyper::StatusCode;

/// The process' peak resident memory so far, in bytes (the test fails where `/proc` cannot
/// tell: a bound on 0 would hold anything).
fn peak_rss() -> u64 {
    status_bytes("self", "VmHWM")
}

/// `size` bytes up (with a length, then chunked) and down (with a length, then chunked)
/// through the engine, on one kept-alive client connection.
async fn both_ways(size: u64) {
    let origin = Origin::start().await;
    let broker =
        LoopbackEngine::start(TestUpstreams::new(&[origin.addr]), Default::default()).await;
    let mut sender = client(broker.addr).await;
    for exact in [true, false] {
        let body = PatternBody::new(size, exact).boxed();
        let (status, _, answer) =
            send(&mut sender, request("POST", broker.addr, "/upload", body)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            answer,
            format!("{size} None"),
            "upload, length known: {exact}"
        );
    }
    for path in [format!("/bytes/{size}"), format!("/bytes/chunked/{size}")] {
        sender.ready().await.unwrap();
        let response = sender
            .send_request(request("GET", broker.addr, &path, body("")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let (seen, bad) = check_body(response.into_body()).await;
        assert_eq!((seen, bad), (size, None), "download {path}");
    }
    assert_eq!(origin.accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    eventually("four exchanges", || broker.upstreams.exchanges().len() == 4).await;
    let x = broker.upstreams.exchanges();
    assert_eq!((x[0].to_server, x[1].to_server), (size, size));
    assert_eq!((x[2].to_client, x[3].to_client), (size, size));
}

/// 1 GiB both ways, 4 GiB moved in all: about 6 s in a debug build on this
/// machine's 2 cores, so it runs with the rest of the suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gibibyte_goes_both_ways_whole_in_bounded_memory() {
    both_ways(1 << 30).await;
    let peak = peak_rss();
    eprintln!("peak resident memory: {} MiB", peak >> 20);
    assert!(
        peak < 256 << 20,
        "peak resident memory {} MiB for 1 GiB bodies: something holds a body",
        peak >> 20
    );
}
