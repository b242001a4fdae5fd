//! Servers that go down and come back one at a time while clients keep coming: every
//! exchange is served, byte for byte, by whichever servers are up, and the broker quarantines
//! and releases as they flap.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use appbroker::Event;
use harness::*;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_lose_nothing_while_servers_flap() {
    let mut servers = Vec::new();
    for name in ["a", "b", "c"] {
        servers.push(FaultServer::start(name, Behaviour::Healthy).await);
    }
    let ini = ini_over(
        &servers.iter().map(FaultServer::ini).collect::<Vec<_>>(),
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=100ms\nCONNECT_TIMEOUT=1s",
    );
    let broker = InProcess::start(&ini).await;
    broker.events.wait_for_round(3, 0).await;

    // One server at a time goes down for 250 ms, then up for 100 ms before the next: never
    // all down at once.
    const CYCLES: usize = 6;
    let stop = CancellationToken::new();
    let cycles = Arc::new(AtomicUsize::new(0));
    let flapping = tokio::spawn({
        let (stop, cycles) = (stop.clone(), Arc::clone(&cycles));
        async move {
            let mut turn = 0;
            while !stop.is_cancelled() {
                let server = &mut servers[turn % 3];
                server.down().await;
                tokio::time::sleep(Duration::from_millis(250)).await;
                server.up().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                turn += 1;
                cycles.store(turn, Ordering::SeqCst);
            }
            servers
        }
    });

    // Two clients in a loop until every server has gone down twice and 300 exchanges are
    // done (bounded by the deadline), each exchange with its own bytes.
    let exchanges = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for client in 0..2u64 {
        let (addr, exchanges, failures, done) = (
            broker.addr(),
            Arc::clone(&exchanges),
            Arc::clone(&failures),
            Arc::clone(&done),
        );
        loops.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !done.load(Ordering::SeqCst) {
                let len = 1 + (i * 997 + client * 131) % 3000;
                let line: String = pattern((client << 20) | i, 0, len as usize)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                let result = async {
                    let mut stream = TcpStream::connect(addr).await?;
                    exact_exchange(&mut stream, &line, &["a", "b", "c"]).await
                }
                .await;
                if let Err(e) = result {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("client {client} exchange {i}: {e}"));
                }
                exchanges.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        }));
    }
    eventually("the flapping and the exchanges to be done", || {
        cycles.load(Ordering::SeqCst) >= CYCLES && exchanges.load(Ordering::SeqCst) >= 300
    })
    .await;
    done.store(true, Ordering::SeqCst);
    for client in loops {
        within("a client loop", client).await.unwrap();
    }
    stop.cancel();
    let _servers = within("the flapping", flapping).await.unwrap();

    let failures = failures.lock().unwrap().clone();
    let events = &broker.events;
    let quarantines = events.count(|e| matches!(e, Event::Quarantined { .. }));
    let releases = events.count(|e| matches!(e, Event::Released { .. }));
    eprintln!(
        "{} exchanges over {} down-and-up cycles; {quarantines} quarantines and {releases} \
         releases",
        exchanges.load(Ordering::SeqCst),
        cycles.load(Ordering::SeqCst),
    );
    assert!(
        failures.is_empty(),
        "{} of {} exchanges failed while at least one server was up: {failures:#?}\nevents:\n{}",
        failures.len(),
        exchanges.load(Ordering::SeqCst),
        events.text()
    );
    assert!(quarantines > 0, "events:\n{}", events.text());
    assert!(releases > 0, "events:\n{}", events.text());
    assert_eq!(
        events.count(|e| matches!(e, Event::Unserved { .. })),
        0,
        "a client found no server"
    );
}
