//! Relaying through a broker in process: half-close both ways, 64 MiB each way at once, a
//! server that speaks first, a server killed or reset mid-connection; how each connection
//! ended, from the broker's events. (Its closing line: tests/log_format.rs.)
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use harness::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const MIB: u64 = 1024 * 1024;

/// A server of the test's own for behaviours `TestServer` does not have: listens on a fresh
/// port and hands the first connection to `behave`, whose result the handle returns.
async fn one_connection_server<F, Fut, T>(behave: F) -> (SocketAddr, JoinHandle<T>)
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        behave(stream).await
    });
    (addr, handle)
}

/// An ini whose only server is `addr`.
fn ini_to(addr: SocketAddr) -> String {
    let mut ini = ini_for(&[], "");
    ini.push_str(&format!("REMOTE_SERVER_01=127.0.0.1 {}\n", addr.port()));
    ini
}

/// Writes `total` bytes of stream `seed` (the pattern of tests/harness), then shuts the write
/// side down.
async fn send_and_close(mut to: impl AsyncWrite + Unpin, seed: u64, total: u64) {
    send_pattern(&mut to, seed, total).await.unwrap();
    to.shutdown().await.unwrap();
}

/// What a reader of a pattern stream got.
#[derive(Debug, PartialEq, Eq)]
struct Received {
    bytes: u64,
    /// Offset of the first byte that was not the pattern's.
    first_wrong: Option<u64>,
}

/// Reads to the end, checking every byte against stream `seed`. Keeps reading after a wrong
/// byte so the sender is never left blocked.
async fn check_pattern(mut from: impl AsyncRead + Unpin, seed: u64) -> Received {
    let mut buf = vec![0u8; 64 * 1024];
    let mut received = Received {
        bytes: 0,
        first_wrong: None,
    };
    loop {
        let n = from.read(&mut buf).await.unwrap();
        if n == 0 {
            return received;
        }
        if received.first_wrong.is_none() {
            let expected = pattern(seed, received.bytes, n);
            if let Some(i) = (0..n).find(|&i| buf[i] != expected[i]) {
                received.first_wrong = Some(received.bytes + i as u64);
            }
        }
        received.bytes += n as u64;
    }
}

/// Reads one line (through `\n`) a byte at a time, so nothing after it is consumed.
async fn read_line(stream: &mut TcpStream) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        let n = within("a line", stream.read(&mut byte)).await.unwrap();
        assert_ne!(n, 0, "closed after {:?}", String::from_utf8_lossy(&line));
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

#[test]
fn the_pattern_is_the_same_whatever_the_chunking() {
    let whole = pattern(7, 0, 100);
    let pieces = [pattern(7, 0, 3), pattern(7, 3, 50), pattern(7, 53, 47)].concat();
    assert_eq!(whole, pieces);
    assert_ne!(pattern(7, 0, 64), pattern(8, 0, 64));
    // A chunk in the wrong place is caught: positions do not repeat.
    assert_ne!(pattern(7, 0, 8), pattern(7, 8, 8));
    assert_ne!(pattern(7, 0, 8), pattern(7, 1, 8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_half_close_still_gets_the_whole_answer() {
    // The server answers only once it has seen the end of the request, as HTTP/1.0 clients
    // and many batch protocols expect.
    let (addr, server) = one_connection_server(|mut stream| async move {
        let mut request = Vec::new();
        stream.read_to_end(&mut request).await.unwrap();
        send_and_close(stream, 3, MIB).await;
        request
    })
    .await;
    let broker = InProcess::start(&ini_to(addr)).await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    let local = client.local_addr().unwrap();
    client.write_all(b"send me everything\n").await.unwrap();
    client.shutdown().await.unwrap();

    let received = within("the answer", check_pattern(&mut client, 3)).await;
    assert_eq!(
        received,
        Received {
            bytes: MIB,
            first_wrong: None
        }
    );
    let request = within("the server", server).await.unwrap();
    assert_eq!(request, b"send me everything\n");
    let ended = broker.events.wait_for_end(local).await;
    assert_eq!(ended.ended_by, End::Closed(Side::Client));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_half_close_still_takes_everything_the_client_sends() {
    // The server says goodbye and shuts its side first, but keeps reading.
    let (addr, server) = one_connection_server(|mut stream| async move {
        stream.write_all(b"bye\n").await.unwrap();
        stream.shutdown().await.unwrap();
        check_pattern(stream, 4).await
    })
    .await;
    let broker = InProcess::start(&ini_to(addr)).await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    let local = client.local_addr().unwrap();

    let mut goodbye = Vec::new();
    within("the server's end", client.read_to_end(&mut goodbye))
        .await
        .unwrap();
    assert_eq!(goodbye, b"bye\n");
    // The client's direction is still open after the server's ended.
    within("the upload", send_and_close(&mut client, 4, MIB)).await;
    let received = within("the server", server).await.unwrap();
    assert_eq!(
        received,
        Received {
            bytes: MIB,
            first_wrong: None
        }
    );
    let ended = broker.events.wait_for_end(local).await;
    assert_eq!(ended.ended_by, End::Closed(Side::Server));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_mib_each_way_at_once_arrive_intact() {
    const SIZE: u64 = 64 * MIB;
    // Each side sends its own stream while reading the other's, so both directions are full
    // at the same time and neither can wait for the other.
    let (addr, server) = one_connection_server(|stream| async move {
        let (read, write) = stream.into_split();
        let sending = tokio::spawn(send_and_close(write, 2, SIZE));
        let received = check_pattern(read, 1).await;
        sending.await.unwrap();
        received
    })
    .await;
    let broker = InProcess::start(&ini_to(addr)).await;
    let client = TcpStream::connect(broker.addr()).await.unwrap();
    let local = client.local_addr().unwrap();
    let (read, write) = client.into_split();
    let sending = tokio::spawn(send_and_close(write, 1, SIZE));

    let to_client = within("the download", check_pattern(read, 2)).await;
    within("the upload", sending).await.unwrap();
    let to_server = within("the server", server).await.unwrap();
    let intact = Received {
        bytes: SIZE,
        first_wrong: None,
    };
    assert_eq!(to_server, intact, "client to server");
    assert_eq!(to_client, intact, "server to client");
    let ended = broker.events.wait_for_end(local).await;
    assert_eq!(
        (ended.bytes_from_client, ended.bytes_to_client),
        (SIZE, SIZE)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_speaks_first_is_heard_before_the_client_sends() {
    let a = TestServer::with_banner("a", "220 a ready\r\n").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    // Nothing sent yet: the broker must connect to the server and pass its greeting on.
    assert_eq!(read_line(&mut client).await, "220 a ready\r\n");
    assert_eq!(exchange(&mut client, "hello").await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_connection_closes_its_client_only() {
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "SORT_METHOD=CONNECTION")).await;
    let (mut on_a, name) = hold(broker.addr()).await;
    assert_eq!(name, "a");
    let (mut on_b, name) = hold(broker.addr()).await;
    assert_eq!(name, "b");

    // a's client keeps talking until its connection ends, so a dies with bytes in flight.
    let answered = Arc::new(AtomicUsize::new(0));
    let talking = tokio::spawn({
        let answered = Arc::clone(&answered);
        async move {
            for i in 0.. {
                match exchange(&mut on_a, &format!("line {i}")).await {
                    Ok(name) => assert_eq!(name, "a"),
                    Err(e) => return e,
                }
                answered.fetch_add(1, Ordering::SeqCst);
            }
            unreachable!()
        }
    });
    eventually("a's client to be talking", || {
        answered.load(Ordering::SeqCst) >= 5
    })
    .await;
    a.stop().await;
    let error = within("a's client to see the end", talking).await.unwrap();
    // `exchange` gives TimedOut when no reply came and the connection stayed open: a hang.
    assert!(
        matches!(
            error.kind(),
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
        ),
        "a's client did not see its connection end: {error}"
    );
    // b's client never noticed.
    for _ in 0..3 {
        assert_eq!(exchange(&mut on_b, "still there?").await.unwrap(), "b");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_reset_resets_the_client() {
    let (addr, server) = one_connection_server(|stream| async move {
        let mut request = [0u8; 6];
        let mut stream = stream;
        stream.read_exact(&mut request).await.unwrap();
        // Linger 0: closing sends RST instead of FIN.
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(stream);
    })
    .await;
    let broker = InProcess::start(&ini_to(addr)).await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    let local = client.local_addr().unwrap();
    client.write_all(b"hello\n").await.unwrap();
    within("the server", server).await.unwrap();

    let mut buf = [0u8; 64];
    let read = within("the client to see the reset", client.read(&mut buf)).await;
    // An abort must reach the client as one: a clean end of stream could pass for a complete
    // answer.
    assert!(
        matches!(&read, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "client read {read:?} after the server reset"
    );
    let ended = broker.events.wait_for_end(local).await;
    assert!(
        matches!(ended.ended_by, End::Error(Side::Server, _)),
        "{ended:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_resets_the_server() {
    let (addr, server) = one_connection_server(|mut stream| async move {
        let mut request = [0u8; 6];
        stream.read_exact(&mut request).await.unwrap();
        stream.write_all(b"ok\n").await.unwrap();
        let mut buf = [0u8; 64];
        stream.read(&mut buf).await
    })
    .await;
    let broker = InProcess::start(&ini_to(addr)).await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    client.write_all(b"hello\n").await.unwrap();
    assert_eq!(read_line(&mut client).await, "ok\n");
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(client);

    let read = within("the server to see the reset", server).await.unwrap();
    assert!(
        matches!(&read, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "server read {read:?} after the client reset"
    );
}
