//! The PROXY protocol and per-client limits on the TCP path, spoken to as a front balancer
//! (HAProxy's `send-proxy` and `send-proxy-v2`) and as the clients behind it: the header's
//! client is the one the broker relays for, lets query and counts; a front balancer's check
//! (v2 `LOCAL`) is answered, never forwarded; a missing, late or broken header is refused,
//! and so is one from a source that may not send it (a silent one is forwarded after one
//! `QUERY_SNIFF_TIMEOUT`, not one per step that watches it); servers that read the header get one,
//! the monitor's checks included; `MAX_CONNECTIONS_PER_CLIENT` closes one client's extra
//! connection and no one else's (an HTTP balancer's with a 503 and `Retry-After`); an HTTP
//! balancer's `X-Forwarded-For` names the header's client, and a trusted L7 proxy's
//! `X-Forwarded-For` (`HTTP_TRUSTED_PROXIES`) names the client for `X-Real-IP` and
//! `QUERY_ALLOW`, and for `MAX_CONNECTIONS_PER_CLIENT`, which counts that client's requests in
//! hand rather than the proxy's connections; an HTTP balancer's server connections with `SEND_PROXY_PROTOCOL` each name
//! one client and serve only its requests.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering::SeqCst;

use appbroker::Event;
use harness::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The v2 signature every binary header begins with.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// Connects to `addr` from the loopback address `source` (Linux answers every 127/8 address
/// on `lo`), so one test can be a front balancer and a direct client.
async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((source, 0))).unwrap();
    let stream = socket.connect(addr).await.expect("connect to broker");
    stream.set_nodelay(true).unwrap();
    stream
}

/// A version 1 header for `client`, as HAProxy's `send-proxy` writes it.
fn v1(client: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let family = if client.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {family} {} {} {} {}\r\n",
        client.ip(),
        destination.ip(),
        client.port(),
        destination.port()
    )
    .into_bytes()
}

/// A version 2 `PROXY` header for an IPv6 `client`, as `send-proxy-v2` writes it, with a TLV
/// (an AWS VPC endpoint id) the broker must skip.
fn v2_ipv6(client: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let (SocketAddr::V6(client), SocketAddr::V6(destination)) = (client, destination) else {
        panic!("IPv6 addresses");
    };
    let tlv = [&[0xea, 0, 5, 0x01][..], b"vpce"].concat();
    let mut header = V2_SIGNATURE.to_vec();
    header.extend_from_slice(&[0x21, 0x21]);
    header.extend_from_slice(&((36 + tlv.len()) as u16).to_be_bytes());
    header.extend_from_slice(&client.ip().octets());
    header.extend_from_slice(&destination.ip().octets());
    header.extend_from_slice(&client.port().to_be_bytes());
    header.extend_from_slice(&destination.port().to_be_bytes());
    header.extend_from_slice(&tlv);
    header
}

/// A version 2 `LOCAL` header: the front balancer's own health check.
fn v2_local() -> Vec<u8> {
    let mut header = V2_SIGNATURE.to_vec();
    header.extend_from_slice(&[0x20, 0x00, 0, 0]);
    header
}

/// True when the broker closes `stream` (end of stream or reset) within the deadline.
async fn closed_by_broker(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// The client address of the `ConnectionEnded` event that ended last with `server`, once the
/// connection to it has ended.
async fn ended_client(broker: &InProcess, server: &str) -> SocketAddr {
    let event = broker
        .events
        .wait_for(
            "a connection's end",
            |e| matches!(e, Event::ConnectionEnded { server: s, .. } if s == server),
        )
        .await;
    match event {
        Event::ConnectionEnded { client, .. } => client,
        _ => unreachable!(),
    }
}

/// Sends `header` then a line, and returns the name of the server that echoed it.
async fn relay_line(stream: &mut TcpStream, header: &[u8], line: &str) -> String {
    stream.write_all(header).await.unwrap();
    within("the server's answer", exchange(stream, line))
        .await
        .expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_a_header_names_is_the_one_relayed_for() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "PROXY_PROTOCOL=1")).await;
    // Version 1, sent in pieces, the client's first line in the same segment as its end.
    let client: SocketAddr = "192.0.2.7:56324".parse().unwrap();
    let header = v1(client, broker.addr());
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream.write_all(&header[..9]).await.unwrap();
    let answer = relay_line(&mut stream, &header[9..], "hello").await;
    assert_eq!(answer, "a");
    drop(stream);
    assert_eq!(ended_client(&broker, &a.address()).await, client);

    // Version 2 over IPv6, its TLV skipped, through the same broker.
    let client: SocketAddr = "[2001:db8::7]:40001".parse().unwrap();
    let header = v2_ipv6(client, "[2001:db8::1]:5000".parse().unwrap());
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    assert_eq!(relay_line(&mut stream, &header, "again").await, "a");
    drop(stream);
    broker
        .events
        .wait_for(
            "the IPv6 client's end",
            |e| matches!(e, Event::ConnectionEnded { client: c, .. } if *c == client),
        )
        .await;
    assert_eq!(a.accepted(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_balancers_check_is_answered_and_never_forwarded() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "PROXY_PROTOCOL=1")).await;
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream.write_all(&v2_local()).await.unwrap();
    let mut connection = HttpConnection::on(stream);
    let ping = connection
        .request("GET", "/TOTVS_BROKER_QUERY/PING", &[])
        .await
        .unwrap();
    assert_eq!(ping.status, 200, "{}", ping.text());
    // A check that sends anything else is closed, and no server hears of it.
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream.write_all(&v2_local()).await.unwrap();
    stream.write_all(b"hello\n").await.unwrap();
    assert!(closed_by_broker(&mut stream).await);
    assert_eq!(a.accepted(), 0);
    assert_eq!(broker.state().active, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_valid_header_in_time_is_closed_never_forwarded() {
    let a = TestServer::start("a").await;
    let ini = ini_for(&[&a], "PROXY_PROTOCOL=1\nPROXY_PROTOCOL_TIMEOUT=300ms");
    let broker = InProcess::start(&ini).await;
    // A client that speaks first, without a header.
    let mut plain = TcpStream::connect(broker.addr()).await.unwrap();
    plain.write_all(b"hello\n").await.unwrap();
    assert!(closed_by_broker(&mut plain).await);
    // A header that never ends.
    let mut late = TcpStream::connect(broker.addr()).await.unwrap();
    late.write_all(b"PROXY TCP4 192.0.2.7").await.unwrap();
    assert!(closed_by_broker(&mut late).await);
    // A broken one, and a lying version 2 length.
    let mut broken = TcpStream::connect(broker.addr()).await.unwrap();
    broken
        .write_all(b"PROXY TCP4 192.0.2.999 10.0.0.1 1 2\r\nhello\n")
        .await
        .unwrap();
    assert!(closed_by_broker(&mut broken).await);
    let mut lying = TcpStream::connect(broker.addr()).await.unwrap();
    let mut header = V2_SIGNATURE.to_vec();
    header.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
    lying.write_all(&header).await.unwrap();
    assert!(closed_by_broker(&mut lying).await);
    broker
        .events
        .wait_for_count("four refusals", 4, |e| {
            matches!(e, Event::ProxyHeaderRefused { .. })
        })
        .await;
    assert_eq!(a.accepted(), 0);
    let refusals = broker.state().proxy_refusals;
    assert_eq!(
        refusals.iter().map(|(_, n)| n).sum::<u64>(),
        4,
        "{refusals:?}"
    );
    assert!(
        refusals.iter().any(|(cause, _)| *cause == "timed_out"),
        "{refusals:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_not_listed_are_served_directly_and_may_not_send_a_header() {
    let a = TestServer::start("a").await;
    let front = Ipv4Addr::new(127, 0, 0, 3);
    let direct = Ipv4Addr::new(127, 0, 0, 4);
    let ini = ini_for(
        &[&a],
        "PROXY_PROTOCOL=1\nPROXY_PROTOCOL_FROM=127.0.0.3/32\nQUERY_SNIFF_TIMEOUT=200ms",
    );
    let broker = InProcess::start(&ini).await;
    let header = v1("192.0.2.7:1000".parse().unwrap(), broker.addr());
    // The front balancer's client.
    let mut proxied = connect_from(front, broker.addr()).await;
    assert_eq!(relay_line(&mut proxied, &header, "one").await, "a");
    drop(proxied);
    assert_eq!(
        ended_client(&broker, &a.address()).await,
        "192.0.2.7:1000".parse().unwrap()
    );
    // A direct client is itself.
    let mut plain = connect_from(direct, broker.addr()).await;
    assert_eq!(relay_line(&mut plain, b"", "two").await, "a");
    let own = plain.local_addr().unwrap();
    drop(plain);
    broker
        .events
        .wait_for(
            "the direct client's end",
            |e| matches!(e, Event::ConnectionEnded { client, .. } if *client == own),
        )
        .await;
    // A direct client that claims to be someone else is refused.
    let mut claiming = connect_from(direct, broker.addr()).await;
    claiming.write_all(&header).await.unwrap();
    // The broker may have closed already: a reset here is the refusal too.
    let _ = claiming.write_all(b"three\n").await;
    assert!(closed_by_broker(&mut claiming).await);
    broker
        .events
        .wait_for(
            "the refusal",
            |e| matches!(e, Event::ProxyHeaderRefused { cause, .. } if *cause == "not_allowed"),
        )
        .await;
    assert_eq!(a.accepted(), 2);
}

/// A server-first server (it speaks before its client does): greets each connection with
/// `hello`.
async fn greeting_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = stream.write_all(b"hello\n").await;
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_direct_client_waits_for_one_sniff_not_two() {
    let server = greeting_server().await;
    let sniff = std::time::Duration::from_secs(2);
    let extra = format!(
        "PROXY_PROTOCOL=1\nPROXY_PROTOCOL_FROM=127.0.0.3/32\nQUERY_SNIFF_TIMEOUT=2s\n\
         REMOTE_SERVER_01=127.0.0.1 {}",
        server.port()
    );
    let broker = InProcess::start(&ini_for(&[], &extra)).await;
    // A direct client of a server-first protocol says nothing: the broker watches it for a
    // header it may not send, then for a query, in one QUERY_SNIFF_TIMEOUT between them.
    let started = std::time::Instant::now();
    let mut client = connect_from(Ipv4Addr::new(127, 0, 0, 4), broker.addr()).await;
    let mut greeting = [0u8; 6];
    tokio::time::timeout(4 * sniff, client.read_exact(&mut greeting))
        .await
        .expect("the server's greeting")
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(&greeting, b"hello\n");
    assert!(
        waited >= sniff,
        "forwarded before the sniff's end: {waited:?}"
    );
    // Two waits would take four seconds; one, two and the broker's own steps (a wide margin:
    // the bound tells one wait from two, not how fast the broker is).
    assert!(waited < sniff * 7 / 4, "{waited:?}: waited twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_allow_judges_the_client_a_header_names() {
    let a = TestServer::start("a").await;
    let ini = ini_for(&[&a], "PROXY_PROTOCOL=1\nQUERY_ALLOW=192.0.2.7");
    let broker = InProcess::start(&ini).await;
    for (client, status) in [("192.0.2.7:1000", 200), ("192.0.2.8:1000", 403)] {
        let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
        stream
            .write_all(&v1(client.parse().unwrap(), broker.addr()))
            .await
            .unwrap();
        let mut connection = HttpConnection::on(stream);
        let answer = connection
            .request("GET", "/TOTVS_BROKER_QUERY/PING", &[])
            .await
            .unwrap();
        assert_eq!(answer.status, status, "{client}: {}", answer.text());
    }
    // The JSON and the STATUS page name the client who asked, not the front balancer.
    for path in ["/TOTVS_BROKER_QUERY/JSON", "/TOTVS_BROKER_QUERY/STATUS"] {
        let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
        let client = "192.0.2.7:1001".parse().unwrap();
        stream.write_all(&v1(client, broker.addr())).await.unwrap();
        let front = stream.local_addr().unwrap().to_string();
        let answer = HttpConnection::on(stream)
            .request("GET", path, &[])
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{path}");
        assert!(
            answer.text().contains("192.0.2.7:1001"),
            "{path}: {}",
            answer.text()
        );
        assert!(!answer.text().contains(&front), "{path}: {}", answer.text());
    }
}

/// A server that reads the PROXY protocol: it keeps each connection's first `n` bytes.
async fn header_reader(n: usize) -> (SocketAddr, tokio::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut first = vec![0u8; n];
                let read = tokio::time::timeout(DEADLINE, stream.read_exact(&mut first)).await;
                if matches!(read, Ok(Ok(_))) {
                    let _ = tx.send(first).await;
                }
            });
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_read_the_header_get_the_clients_and_checks_get_unknown_or_local() {
    for version in [1, 2] {
        let client: SocketAddr = "192.0.2.7:56324".parse().unwrap();
        let destination: SocketAddr = "198.51.100.1:5000".parse().unwrap();
        let expected = match version {
            1 => v1(client, destination),
            _ => {
                let mut header = V2_SIGNATURE.to_vec();
                header.extend_from_slice(&[0x21, 0x11, 0, 12, 192, 0, 2, 7, 198, 51, 100, 1]);
                header.extend_from_slice(&[0xdc, 0x04, 0x13, 0x88]);
                header
            }
        };
        let (server, mut headers) = header_reader(expected.len()).await;
        let ini = format!(
            "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\n\
             LOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\nPROXY_PROTOCOL=1\n\
             SEND_PROXY_PROTOCOL={version}\nMONITORING_TYPE=DISABLED\n\
             REMOTE_SERVER_01=127.0.0.1 {}\n",
            server.port()
        );
        let broker = InProcess::start(&ini).await;
        let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
        stream.write_all(&v1(client, destination)).await.unwrap();
        stream.write_all(b"hello\n").await.unwrap();
        let got = within("the server's header", headers.recv()).await.unwrap();
        assert_eq!(got, expected, "version {version}");
    }
    // The monitor's checks: UNKNOWN under version 1, LOCAL under version 2.
    for (version, expected) in [(1, b"PROXY UNKNOWN\r\n".to_vec()), (2, v2_local())] {
        let (server, mut headers) = header_reader(expected.len()).await;
        let ini = format!(
            "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\n\
             LOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
             SEND_PROXY_PROTOCOL={version}\nMONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=100ms\n\
             REMOTE_SERVER_01=127.0.0.1 {}\n",
            server.port()
        );
        let _broker = InProcess::start(&ini).await;
        let got = within("a check's header", headers.recv()).await.unwrap();
        assert_eq!(got, expected, "version {version}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_per_client_that_client_is_closed_and_others_served() {
    let a = TestServer::start("a").await;
    let ini = ini_for(&[&a], "PROXY_PROTOCOL=1\nMAX_CONNECTIONS_PER_CLIENT=2");
    let broker = InProcess::start(&ini).await;
    let busy: SocketAddr = "192.0.2.7:1".parse().unwrap();
    let mut held = Vec::new();
    for (n, port) in [1001u16, 1002].into_iter().enumerate() {
        let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
        let client = SocketAddr::new(busy.ip(), port);
        let line = format!("held {n}");
        let answer = relay_line(&mut stream, &v1(client, broker.addr()), &line).await;
        assert_eq!(answer, "a");
        held.push(stream);
    }
    // A third from the same address, by the same front balancer: closed at once.
    let mut third = TcpStream::connect(broker.addr()).await.unwrap();
    third
        .write_all(&v1(SocketAddr::new(busy.ip(), 1003), broker.addr()))
        .await
        .unwrap();
    let _ = third.write_all(b"third\n").await; // a reset is the refusal too
    assert!(closed_by_broker(&mut third).await);
    let limited = broker
        .events
        .wait_for("the refusal", |e| matches!(e, Event::ClientLimited { .. }))
        .await;
    assert!(
        matches!(limited, Event::ClientLimited { client, open: 2, .. } if client == busy.ip()),
        "{limited:?}"
    );
    // Another client is served; the two held still are.
    let mut other = TcpStream::connect(broker.addr()).await.unwrap();
    let header = v1("192.0.2.8:1".parse().unwrap(), broker.addr());
    assert_eq!(relay_line(&mut other, &header, "other").await, "a");
    for (n, stream) in held.iter_mut().enumerate() {
        let answer = within("a held connection", exchange(stream, &format!("still {n}")))
            .await
            .unwrap();
        assert_eq!(answer, "a");
    }
    assert_eq!(broker.state().client_limited, 1);
    // Once one of them ends, the client may connect again.
    drop(held.pop());
    eventually("the client's count goes down", || {
        broker.state().clients_counted == 2 && broker.state().active == 2
    })
    .await;
    let mut again = TcpStream::connect(broker.addr()).await.unwrap();
    let header = v1(SocketAddr::new(busy.ip(), 1004), broker.addr());
    assert_eq!(relay_line(&mut again, &header, "again").await, "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_balancer_forwards_for_the_client_a_header_names() {
    let origin = Origin::start().await;
    let broker = InProcess::start(&http_ini(&[origin.addr], "PROXY_PROTOCOL=1")).await;
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream
        .write_all(&v1("192.0.2.7:56324".parse().unwrap(), broker.addr()))
        .await
        .unwrap();
    let mut connection = HttpConnection::on(stream);
    let answer = connection.request("GET", "/page", &[]).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = &origin.seen()[0];
    assert_eq!(seen.headers["x-forwarded-for"], "192.0.2.7");
    assert_eq!(seen.headers["x-real-ip"], "192.0.2.7");
}

/// A kept-alive connection to an HTTP balancer for `client`, through a front balancer's
/// version 1 header, with one request answered.
async fn http_client_of(broker: &InProcess, client: &str) -> (HttpConnection, u16) {
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    let header = v1(client.parse().unwrap(), broker.addr());
    stream.write_all(&header).await.unwrap();
    let mut connection = HttpConnection::on(stream);
    let answer = connection.request("GET", "/page", &[]).await.unwrap();
    (connection, answer.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_per_client_an_http_client_gets_a_503_and_others_are_served() {
    let origin = Origin::start().await;
    let extra = "PROXY_PROTOCOL=1\nMAX_CONNECTIONS_PER_CLIENT=2";
    let broker = InProcess::start(&http_ini(&[origin.addr], extra)).await;
    let mut held = Vec::new();
    for port in [1001, 1002] {
        let (connection, status) = http_client_of(&broker, &format!("192.0.2.7:{port}")).await;
        assert_eq!(status, 200);
        held.push(connection);
    }
    // A third of the same client: a 503 saying when to come back, then the close.
    let mut third = TcpStream::connect(broker.addr()).await.unwrap();
    let header = v1("192.0.2.7:1003".parse().unwrap(), broker.addr());
    third.write_all(&header).await.unwrap();
    let mut third = HttpConnection::on(third);
    let answer = third.request("GET", "/page", &[]).await.unwrap();
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(answer.header("retry-after"), Some("5"));
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(closed_by_broker(&mut third.stream).await);
    let limited = broker
        .events
        .wait_for("the refusal", |e| matches!(e, Event::ClientLimited { .. }))
        .await;
    assert!(
        matches!(limited, Event::ClientLimited { open: 2, .. }),
        "{limited:?}"
    );
    assert_eq!(broker.state().client_limited, 1);
    assert_eq!(
        origin.seen().len(),
        2,
        "the refused request never reached a server"
    );
    // Another client is served, and the client's two connections still are.
    let (_other, status) = http_client_of(&broker, "192.0.2.8:1").await;
    assert_eq!(status, 200);
    for connection in &mut held {
        let answer = connection.request("GET", "/again", &[]).await.unwrap();
        assert_eq!(answer.status, 200);
    }
    // Once one of them ends, the client may connect again. The count of two clients does
    // not tell when the broker saw the close: connecting again is polled until served.
    drop(held.pop());
    within("the client served again", async {
        while http_client_of(&broker, "192.0.2.7:1004").await.1 != 200 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// `path` asked by a client at `source` with `X-Forwarded-For: chain` (none when empty).
async fn forwarded_request(
    broker: &InProcess,
    source: Ipv4Addr,
    path: &str,
    chain: &str,
) -> HttpResponse {
    let stream = connect_from(source, broker.addr()).await;
    let headers: &[(&str, &str)] = if chain.is_empty() {
        &[]
    } else {
        &[("X-Forwarded-For", chain)]
    };
    let mut connection = HttpConnection::on(stream);
    connection.request("GET", path, headers).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_x_forwarded_for_names_the_http_client() {
    let origin = Origin::start().await;
    let ini = http_ini(&[origin.addr], "HTTP_TRUSTED_PROXIES=127.0.0.1, 10.0.0.0/8")
        .replace("QUERY_ALLOW=127.0.0.1", "QUERY_ALLOW=203.0.113.9");
    let broker = InProcess::start(&ini).await;
    let proxy = Ipv4Addr::LOCALHOST;
    let chain = "198.51.100.1, 203.0.113.9, 10.0.0.2";
    // From the trusted proxy: the chain's last address not trusted is the client; the
    // chain goes on as received, plus the proxy.
    let answer = forwarded_request(&broker, proxy, "/page", chain).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = origin.seen().pop().unwrap();
    assert_eq!(
        seen.headers["x-forwarded-for"],
        format!("{chain}, 127.0.0.1")
    );
    assert_eq!(seen.headers["x-real-ip"], "203.0.113.9");
    // QUERY_ALLOW judges that client, not the proxy.
    let ping = "/TOTVS_BROKER_QUERY/PING";
    for (chain, status) in [(chain, 200), ("198.51.100.1", 403), ("", 403)] {
        let answer = forwarded_request(&broker, proxy, ping, chain).await;
        assert_eq!(answer.status, status, "{chain:?}: {}", answer.text());
    }
    // A chain whose last entry is no address: the client is unknown (never the proxy), is
    // refused every query and named to the server by no X-Real-IP.
    let malformed = "203.0.113.9:443";
    let answer = forwarded_request(&broker, proxy, ping, malformed).await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    forwarded_request(&broker, proxy, "/page", malformed).await;
    let seen = origin.seen().pop().unwrap();
    assert_eq!(seen.headers.get("x-real-ip"), None, "{:?}", seen.headers);
    // From a peer not trusted, the chain is passed on but not believed.
    let stranger = Ipv4Addr::new(127, 0, 0, 2);
    let answer = forwarded_request(&broker, stranger, ping, chain).await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    forwarded_request(&broker, stranger, "/page", chain).await;
    let seen = origin.seen().pop().unwrap();
    assert_eq!(
        seen.headers["x-forwarded-for"],
        format!("{chain}, 127.0.0.2")
    );
    assert_eq!(seen.headers["x-real-ip"], "127.0.0.2");
}

/// `path` asked on the trusted proxy's kept-alive `connection` for `client`, whom its
/// `X-Forwarded-For` names.
async fn proxied(connection: &mut HttpConnection, path: &str, client: &str) -> HttpResponse {
    let headers = [("X-Forwarded-For", client)];
    connection.request("GET", path, &headers).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_max_connections_per_client_counts_each_clients_requests() {
    let origin = Origin::start().await;
    let extra = "HTTP_TRUSTED_PROXIES=127.0.0.1\nMAX_CONNECTIONS_PER_CLIENT=2";
    let broker = InProcess::start(&http_ini(&[origin.addr], extra)).await;
    // The proxy's own connections are not counted: more than the limit, all served.
    let mut connections = Vec::new();
    for n in 0..4 {
        let mut connection = HttpConnection::connect(broker.addr()).await;
        let answer = proxied(&mut connection, "/page", &format!("198.51.100.{n}")).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        connections.push(connection);
    }
    // One client's two requests in hand at once, on two of them...
    let busy = "203.0.113.5";
    let mut holding = Vec::new();
    for mut connection in connections.drain(..2) {
        holding.push(tokio::spawn(async move {
            proxied(&mut connection, "/hold", busy).await.status
        }));
    }
    eventually("both requests held at the origin", || {
        origin.held.load(SeqCst) == 2
    })
    .await;
    // ...and its third is answered 503 on the proxy's connection, which goes on to serve
    // another client.
    let answer = proxied(&mut connections[0], "/page", busy).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(answer.header("retry-after"), Some("5"));
    assert_ne!(answer.header("connection"), Some("close"));
    let answer = proxied(&mut connections[0], "/page", "203.0.113.6").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let limited = broker
        .events
        .wait_for("the refusal", |e| matches!(e, Event::ClientLimited { .. }))
        .await;
    let Event::ClientLimited { client, open, .. } = limited else {
        unreachable!()
    };
    assert_eq!((client.to_string().as_str(), open), (busy, 2));
    assert_eq!(broker.state().client_limited, 1);
    // Once its requests are answered, the client is served again.
    origin.release(2);
    for held in holding {
        assert_eq!(held.await.unwrap(), 200);
    }
    eventually("no client counted", || broker.state().clients_counted == 0).await;
    let answer = proxied(&mut connections[1], "/page", busy).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// An HTTP server that reads the PROXY protocol (version 1): each connection's header line
/// kept, then each request answered with the connection's number and that line, kept alive.
async fn proxy_reading_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for number in 0u32.. {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve_with_header(stream, number));
        }
    });
    addr
}

/// One connection of [`proxy_reading_origin`]: its header, then its requests (heads alone).
async fn serve_with_header(mut stream: TcpStream, number: u32) {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 1024];
    let mut header = None;
    loop {
        let Ok(n) = stream.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        bytes.extend_from_slice(&chunk[..n]);
        if header.is_none() {
            let Some(end) = bytes.windows(2).position(|w| w == b"\r\n") else {
                continue;
            };
            header = Some(String::from_utf8_lossy(&bytes[..end]).into_owned());
            bytes.drain(..end + 2);
        }
        while let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            bytes.drain(..end + 4);
            let body = format!("{number} {}", header.as_deref().unwrap_or(""));
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_balancers_server_connections_name_one_client_and_serve_only_it() {
    let origin = proxy_reading_origin().await;
    let broker = InProcess::start(&http_ini(&[origin], "SEND_PROXY_PROTOCOL=1")).await;
    // More clients than worker threads (the pool is per worker): two of them share one, and
    // its pool, whatever the machine.
    let workers = std::thread::available_parallelism().map_or(1, usize::from);
    let mut clients = Vec::new();
    for n in 0..=workers.min(200) as u8 {
        let source = Ipv4Addr::new(127, 0, 1, n + 2);
        let stream = connect_from(source, broker.addr()).await;
        let port = stream.local_addr().unwrap().port();
        clients.push((HttpConnection::on(stream), source, port));
    }
    // Requests go round the clients, each on its kept-alive connection: every answer comes
    // over a server connection whose header names the client that asked.
    let mut used = std::collections::HashMap::<u32, Ipv4Addr>::new();
    for round in 0..3 {
        for (connection, source, port) in &mut clients {
            let answer = connection.request("GET", "/who", &[]).await.unwrap();
            assert_eq!(answer.status, 200, "{}", answer.text());
            let text = answer.text();
            let (number, header) = text.split_once(' ').unwrap();
            let expected = format!(
                "PROXY TCP4 {source} 127.0.0.1 {port} {}",
                broker.addr().port()
            );
            assert_eq!(header, expected, "round {round}");
            let owner = used.entry(number.parse().unwrap()).or_insert(*source);
            assert_eq!(
                owner, source,
                "server connection {number} served two clients"
            );
        }
    }
    // Each client's connections were kept for it: fewer server connections than requests.
    assert!(
        used.len() < 3 * clients.len(),
        "no server connection was reused: {used:?}"
    );
}

// ---- trust and limits behind an L7 proxy, a front balancer's check on an HTTP port --------

/// A raw HTTP server of these tests' own, its behaviour chosen by the request's path: every
/// head it receives kept as it came; `/hold` answered once the test releases it; `/ws`
/// switched to `websocket` (`101`), then every byte echoed until the broker closes; anything
/// else `200` with `ok`. Heads only (the tests send no bodies), kept alive.
struct PathServer {
    addr: SocketAddr,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    release: std::sync::Arc<tokio::sync::Semaphore>,
}

impl PathServer {
    async fn start() -> PathServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = PathServer {
            addr: listener.local_addr().unwrap(),
            heads: Default::default(),
            held: Default::default(),
            release: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let (heads, held, release) = (
            server.heads.clone(),
            server.held.clone(),
            server.release.clone(),
        );
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (heads, held, release) = (heads.clone(), held.clone(), release.clone());
                tokio::spawn(serve_paths(stream, heads, held, release));
            }
        });
        server
    }

    /// The heads received for `path`.
    fn heads_for(&self, path: &str) -> Vec<String> {
        let heads = self.heads.lock().unwrap();
        let line = format!("GET {path} ");
        heads
            .iter()
            .filter(|h| h.starts_with(&line))
            .cloned()
            .collect()
    }
}

/// One connection of [`PathServer`], request by request.
async fn serve_paths(
    mut stream: TcpStream,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    release: std::sync::Arc<tokio::sync::Semaphore>,
) {
    loop {
        let head = read_head(&mut stream).await;
        if !head.ends_with(b"\r\n\r\n") {
            return;
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let path = head.split(' ').nth(1).unwrap_or_default().to_string();
        heads.lock().unwrap().push(head);
        if path == "/ws" {
            let switch = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                          Connection: Upgrade\r\n\r\n";
            if stream.write_all(switch.as_bytes()).await.is_ok() {
                let (mut from, mut to) = stream.split();
                let _ = tokio::io::copy(&mut from, &mut to).await;
            }
            return;
        }
        if path == "/hold" {
            held.fetch_add(1, SeqCst);
            release.acquire().await.unwrap().forget();
        }
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        if stream.write_all(answer).await.is_err() {
            return;
        }
    }
}

/// The value of header `name` (any case) in a raw head, when it has one.
fn head_value(head: &str, name: &str) -> Option<String> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
}

/// `GET path` on `connection`, with `X-Forwarded-For: chain` (none when `chain` is `None`).
async fn chained(connection: &mut HttpConnection, path: &str, chain: Option<&str>) -> HttpResponse {
    let headers: Vec<(&str, &str)> = chain.map(|c| ("X-Forwarded-For", c)).into_iter().collect();
    connection.request("GET", path, &headers).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_item_in_a_trusted_chain_makes_the_client_unknown_never_the_proxy() {
    let server = PathServer::start().await;
    // QUERY_ALLOW admits the proxy (127.0.0.1): a client taken for it would read CFG.
    let extra = "HTTP_TRUSTED_PROXIES=127.0.0.1\nMAX_CONNECTIONS_PER_CLIENT=1";
    let broker = InProcess::start(&http_ini(&[server.addr], extra)).await;
    let mut proxy = HttpConnection::connect(broker.addr()).await;
    let cfg = "/TOTVS_BROKER_QUERY/CFG";
    // Walked from the right, an unusable item met before any untrusted address: unknown.
    let unknown = [
        "203.0.113.9, unknown",
        "203.0.113.9:80",
        "203.0.113.9,,",
        "unknown",
    ];
    for (n, chain) in unknown.iter().enumerate() {
        let answer = chained(&mut proxy, cfg, Some(chain)).await;
        assert_eq!(answer.status, 403, "{chain:?}: {}", answer.text());
        let path = format!("/page{n}");
        let answer = chained(&mut proxy, &path, Some(chain)).await;
        assert_eq!(answer.status, 200, "{chain:?}: {}", answer.text());
        let head = server.heads_for(&path).pop().unwrap();
        assert_eq!(head_value(&head, "x-real-ip"), None, "{chain:?}: {head}");
        assert_eq!(
            head_value(&head, "x-forwarded-for"),
            Some(format!("{chain}, 127.0.0.1")),
            "the chain goes on as received"
        );
    }
    // An untrusted address met first is the client, whatever lies left of it.
    for chain in ["unknown, 203.0.113.9", " , 203.0.113.9"] {
        let answer = chained(&mut proxy, cfg, Some(chain)).await;
        assert_eq!(answer.status, 403, "{chain:?}: {}", answer.text());
        chained(&mut proxy, "/named", Some(chain)).await;
        let head = server.heads_for("/named").pop().unwrap();
        assert_eq!(
            head_value(&head, "x-real-ip").as_deref(),
            Some("203.0.113.9")
        );
    }
    // No chain at all: the proxy's own request (its health check).
    let answer = chained(&mut proxy, cfg, None).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    // Unknown clients share one count under MAX_CONNECTIONS_PER_CLIENT, apart from the proxy.
    let addr = broker.addr();
    let holding = tokio::spawn(async move {
        let mut connection = HttpConnection::connect(addr).await;
        chained(&mut connection, "/hold", Some("unknown"))
            .await
            .status
    });
    eventually("the unknown client's request held", || {
        server.held.load(SeqCst) == 1
    })
    .await;
    let mut other = HttpConnection::connect(broker.addr()).await;
    let answer = chained(&mut other, "/page", Some("1.2.3.4:80")).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    for chain in [None, Some("203.0.113.9")] {
        let answer = chained(&mut other, "/page", chain).await;
        assert_eq!(answer.status, 200, "{chain:?}: {}", answer.text());
    }
    server.release.add_permits(1);
    assert_eq!(holding.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_client_is_sent_on_under_a_proxy_header_that_names_no_one() {
    let origin = proxy_reading_origin().await;
    let extra = "HTTP_TRUSTED_PROXIES=127.0.0.1\nSEND_PROXY_PROTOCOL=1";
    let broker = InProcess::start(&http_ini(&[origin], extra)).await;
    let mut proxy = HttpConnection::connect(broker.addr()).await;
    let answer = chained(&mut proxy, "/who", Some("unknown")).await;
    let text = answer.text();
    let (_, header) = text.split_once(' ').unwrap();
    assert_eq!(header, "PROXY UNKNOWN", "{text}");
    // The next request, naming a client, never reuses the connection that named no one.
    let answer = chained(&mut proxy, "/who", Some("203.0.113.9")).await;
    let text = answer.text();
    let (_, header) = text.split_once(' ').unwrap();
    assert!(header.starts_with("PROXY TCP4 203.0.113.9 "), "{text}");
}

/// Asks `/ws` for an upgrade to WebSocket on a new connection from the trusted proxy, for
/// `client`: the connection, once its answer's head is read, and that head.
async fn websocket_for(broker: SocketAddr, client: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(broker).await.unwrap();
    let request = format!(
        "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         X-Forwarded-For: {client}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = within("the upgrade's answer", read_head(&mut stream)).await;
    (stream, String::from_utf8_lossy(&head).into_owned())
}

/// Whether `stream`, a tunnel to the echoing server, echoes `bytes`.
async fn echoes(stream: &mut TcpStream, bytes: &[u8]) -> bool {
    stream.write_all(bytes).await.unwrap();
    let mut back = vec![0u8; bytes.len()];
    within("the echo", stream.read_exact(&mut back))
        .await
        .is_ok()
        && back == bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_a_websocket_counts_for_its_client_while_it_is_open() {
    let server = PathServer::start().await;
    let extra = "HTTP_TRUSTED_PROXIES=127.0.0.1\nMAX_CONNECTIONS_PER_CLIENT=3";
    let broker = InProcess::start(&http_ini(&[server.addr], extra)).await;
    let busy = "203.0.113.5";
    let mut tunnels = Vec::new();
    for _ in 0..3 {
        let (mut stream, head) = websocket_for(broker.addr(), busy).await;
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        assert!(echoes(&mut stream, b"ping").await);
        tunnels.push(stream);
    }
    // Its fourth while the three are open: 503, never upgraded.
    let (_, head) = websocket_for(broker.addr(), busy).await;
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert_eq!(head_value(&head, "retry-after").as_deref(), Some("5"));
    assert_eq!(
        server.heads_for("/ws").len(),
        3,
        "the fourth reached no server"
    );
    // Another client of the proxy is served.
    let (mut other, head) = websocket_for(broker.addr(), "203.0.113.6").await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(echoes(&mut other, b"pong").await);
    // Once one of its tunnels ends, the client may open another.
    drop(tunnels.pop());
    within("a tunnel for the client again", async {
        loop {
            let (mut stream, head) = websocket_for(broker.addr(), busy).await;
            if head.starts_with("HTTP/1.1 101 ") {
                assert!(echoes(&mut stream, b"again").await);
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_balancers_front_check_may_query_and_is_never_forwarded() {
    let server = PathServer::start().await;
    let extra = "PROXY_PROTOCOL=1\nMAX_CONNECTIONS_PER_CLIENT=1";
    let broker = InProcess::start(&http_ini(&[server.addr], extra)).await;
    // HAProxy's `check-send-proxy` with an `httpchk` of READY: answered, and no client (two
    // at once from one front balancer, past a limit of one per client).
    let mut checks = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
        stream.write_all(&v2_local()).await.unwrap();
        let mut check = HttpConnection::on(stream);
        let ready = check
            .request("GET", "/TOTVS_BROKER_QUERY/READY", &[])
            .await
            .unwrap();
        assert_eq!(ready.status, 200, "{}", ready.text());
        checks.push(check);
    }
    // Any other request on a check's connection: refused with a page saying why, never
    // forwarded, on a connection kept or new.
    let check = &mut checks[1];
    let answer = check.request("GET", "/page", &[]).await.unwrap();
    assert_eq!(answer.status, 403, "{}", answer.text());
    assert!(answer.text().contains("LOCAL"), "{}", answer.text());
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream.write_all(&v2_local()).await.unwrap();
    let answer = HttpConnection::on(stream)
        .request("GET", "/app", &[])
        .await
        .unwrap();
    assert_eq!(answer.status, 403, "{}", answer.text());
    assert!(
        server.heads.lock().unwrap().is_empty(),
        "a check reached a server"
    );
    // A client the header names is served as ever.
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream
        .write_all(&v1("192.0.2.7:1000".parse().unwrap(), broker.addr()))
        .await
        .unwrap();
    let answer = HttpConnection::on(stream)
        .request("GET", "/app", &[])
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
}
