//! `/TOTVS_BROKER_QUERY` on the port of a broker in process, spoken to as monitoring
//! scripts and browsers do: every command, the limits, forwarding left exact around queries, and the
//! contracts of the TOTVS answers that the public monitors parse (tests/fixtures/captures).
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use harness::*;
use scraper::{ElementRef, Html, Selector};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What Firefox and Chromium send as `Accept` for a page.
const BROWSER_ACCEPT: &str =
    "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8";

async fn get(broker: &InProcess, path: &str) -> HttpResponse {
    http_get(broker.addr(), path, &[]).await
}

/// The JSON object of the server `address`.
fn server_json<'a>(status: &'a Value, address: &str) -> &'a Value {
    status["servers"]
        .as_array()
        .expect("servers is an array")
        .iter()
        .find(|s| s["server"] == address)
        .unwrap_or_else(|| panic!("no server {address} in {status:#}"))
}

/// `HH:MM:SS` with each field in range.
fn is_clock(text: &str) -> bool {
    let parts: Vec<&str> = text.split(':').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()))
        && parts[0].parse::<u32>().unwrap() < 24
        && parts[1].parse::<u32>().unwrap() < 60
        && parts[2].parse::<u32>().unwrap() < 60
}

/// `DD/MM/YYYY` with each field in range.
fn is_date(text: &str) -> bool {
    let parts: Vec<&str> = text.split('/').collect();
    parts.len() == 3
        && [2, 2, 4]
            .iter()
            .zip(&parts)
            .all(|(len, p)| p.len() == *len && p.bytes().all(|b| b.is_ascii_digit()))
        && (1..=31).contains(&parts[0].parse::<u32>().unwrap())
        && (1..=12).contains(&parts[1].parse::<u32>().unwrap())
}

/// Reads exactly `n` bytes, or fails the test with what came.
async fn read_n(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(DEADLINE, stream.read_exact(&mut buf))
        .await
        .expect("bytes within the deadline")
        .expect("bytes before the connection closed");
    buf
}

/// With `server` stopped and monitoring off, sends clients through a ROUND_ROBIN broker
/// until one of them has tried `server` and so quarantined it.
async fn quarantine_by_clients(broker: &InProcess, server: &TestServer) {
    let quarantined = format!("{} quarantined", server.name);
    poll(&quarantined, Duration::ZERO, DEADLINE, async || {
        if server_json(&query_json(broker.addr()).await, &server.address())["inquarantine"] == true
        {
            return Ok(());
        }
        // Failover sends the client to another server; only the attempt matters here.
        let _ = ask(broker.addr()).await;
        Err(format!("events:\n{}", broker.events.text()))
    })
    .await
}

/// Polls the JSON answer, as `eventually` polls, until `wanted` holds for it; returns it.
async fn json_when(broker: &InProcess, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    until(what, async || {
        let status = query_json(broker.addr()).await;
        if wanted(&status) {
            return Ok(status);
        }
        let events = broker.events.text();
        Err(format!("last answer:\n{status:#}\nlog:\n{events}"))
    })
    .await
}

/// Polls PING until it answers `status`; returns the answer.
async fn ping_until(broker: &InProcess, status: u16) -> HttpResponse {
    until(&format!("PING to answer {status}"), async || {
        let answer = get(broker, "/TOTVS_BROKER_QUERY/PING").await;
        if answer.status == status {
            return Ok(answer);
        }
        Err(format!("last: {} {}", answer.status, answer.text()))
    })
    .await
}

/// Sends raw bytes (ignoring a reset: the broker may answer and close before reading all of
/// an oversized request) and reads the one answer.
async fn send_raw(addr: SocketAddr, bytes: &[u8]) -> HttpResponse {
    let mut connection = HttpConnection::connect(addr).await;
    let _ = connection.stream.write_all(bytes).await;
    connection
        .read_response(false)
        .await
        .expect("an answer to the raw request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_answers_on_the_broker_port() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "")).await;

    let status = get(&broker, "/TOTVS_BROKER_QUERY/STATUS").await;
    assert_eq!(status.status, 200);
    assert_eq!(
        status.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(status.text().contains("Servers (2)"), "{}", status.text());
    assert!(status.text().contains(&a.address()));

    let refreshing = get(&broker, "/TOTVS_BROKER_QUERY/STATUS?refresh=5")
        .await
        .text();
    let refresh = Selector::parse("meta[http-equiv=refresh]").unwrap();
    let meta = Html::parse_document(&refreshing)
        .select(&refresh)
        .map(|m| m.value().attr("content").unwrap().to_string())
        .collect::<Vec<_>>();
    assert_eq!(meta, ["5"], "?refresh=5 reloads every 5 s");
    assert_eq!(
        Html::parse_document(&status.text())
            .select(&refresh)
            .count(),
        0,
        "no reload unless asked"
    );

    let cfg = get(&broker, "/TOTVS_BROKER_QUERY/CFG").await;
    assert_eq!(cfg.status, 200);
    assert_eq!(cfg.header("content-type"), Some("text/html; charset=utf-8"));
    let page = Html::parse_document(&cfg.text());
    let rows: Vec<Vec<String>> = page
        .select(&Selector::parse("tr").unwrap())
        .map(|tr| {
            tr.select(&Selector::parse("td").unwrap())
                .map(|td| td.text().collect::<String>())
                .collect()
        })
        .filter(|cells: &Vec<String>| cells.len() == 3)
        .collect();
    let row = |key: &str| {
        rows.iter()
            .find(|r| r[0] == key)
            .unwrap_or_else(|| panic!("no {key} row in CFG: {rows:?}"))
    };
    // Set in the file: its line; left out: marked as the default.
    assert!(row("MONITORING_TYPE")[2].starts_with("line "), "{rows:?}");
    assert_eq!(row("QUERY_MAX_CONNECTIONS")[1], "64");
    assert_eq!(row("QUERY_MAX_CONNECTIONS")[2], "default");
    assert!(row("REMOTE_SERVER_02")[1].contains(&b.addr.port().to_string()));

    let ping = get(&broker, "/TOTVS_BROKER_QUERY/PING").await;
    assert_eq!(ping.status, 200);
    assert!(
        ping.header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    assert!(!ping.body.is_empty() && ping.body.len() < 200, "short text");

    let json = get(&broker, "/TOTVS_BROKER_QUERY/JSON").await;
    assert_eq!(json.status, 200);
    assert_eq!(json.header("content-type"), Some("application/json"));
    let servers: Vec<String> = json.json()["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["server"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(servers, [a.address(), b.address()]);

    let metrics = get(&broker, "/TOTVS_BROKER_QUERY/METRICS").await;
    assert_eq!(metrics.status, 200);
    assert_eq!(
        metrics.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(
        metrics
            .text()
            .contains("appbroker_server_active_connections{")
    );

    let detail = get(
        &broker,
        &format!("/TOTVS_BROKER_QUERY/ServerStatus/{}", b.address()),
    )
    .await;
    assert_eq!(detail.status, 200);
    assert!(
        detail.text().contains("(REMOTE_SERVER_02)"),
        "{}",
        detail.text()
    );
    assert!(!detail.text().contains(&a.address()), "only b's detail");

    let unknown = get(&broker, "/TOTVS_BROKER_QUERY/ServerStatus/127.0.0.1:1").await;
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    // What there is, to pick from.
    let listed = format!("its servers are {}, {}", a.address(), b.address());
    assert!(unknown.text().contains(&listed), "{}", unknown.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_status_shows_the_quarantine_history() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "SORT_METHOD=ROUND_ROBIN")).await;
    b.stop().await;
    quarantine_by_clients(&broker, &b).await;

    let detail = get(
        &broker,
        &format!("/TOTVS_BROKER_QUERY/SERVERSTATUS/{}", b.address()),
    )
    .await;
    assert_eq!(detail.status, 200);
    let page = Html::parse_document(&detail.text());
    let headings: Vec<String> = page
        .select(&Selector::parse("h2").unwrap())
        .map(|h| h.text().collect())
        .collect();
    assert!(
        headings.iter().any(|h| h == "Quarantine history (1)"),
        "{headings:?}"
    );
    // The episode: start, end (still going), duration, reason, error, released.
    let episode: Vec<String> = page
        .select(&Selector::parse("table tr").unwrap())
        .nth(1)
        .expect("one episode row")
        .select(&Selector::parse("td").unwrap())
        .map(|td| td.text().collect())
        .collect();
    assert_eq!(episode.len(), 6, "{episode:?}");
    assert_eq!(episode[1], "ongoing");
    assert_eq!(episode[3], "client connect");
    assert!(episode[4].contains("refused"), "{episode:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_and_prefix_ignore_case() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let status = get(&broker, "/totvs_broker_query/status").await;
    assert_eq!(status.status, 200);
    assert!(status.text().contains("Servers (1)"));
    let ping = get(&broker, "/TOTVS_BROKER_QUERY/Ping").await;
    assert_eq!(ping.status, 200);
    let json = get(&broker, "/Totvs_Broker_Query/json").await;
    assert_eq!(json.json()["servers"][0]["server"], a.address().as_str());
    let detail = get(
        &broker,
        &format!("/totvs_broker_query/serverstatus/{}", a.address()),
    )
    .await;
    assert_eq!(detail.status, 200);
    assert_eq!(a.accepted(), 0, "no query reached the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_line_in_several_segments_is_still_a_query() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let mut connection = HttpConnection::connect(broker.addr()).await;
    connection.stream.set_nodelay(true).unwrap();
    // Each write leaves at once as its own segment; the broker may read them one by one.
    for piece in [
        &b"GE"[..],
        b"T /totvs_BR",
        b"OKER_QUERY",
        b"/PING HTTP/1.1\r\n",
        b"Host: x\r\n\r\n",
    ] {
        connection.stream.write_all(piece).await.unwrap();
        connection.stream.flush().await.unwrap();
    }
    let answer = connection.read_response(false).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(a.accepted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_answers_several_requests_on_one_connection() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let mut connection = HttpConnection::connect(broker.addr()).await;
    let first = connection
        .request("GET", "/TOTVS_BROKER_QUERY/PING", &[])
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    assert_ne!(first.header("connection"), Some("close"));
    let second = connection
        .request("GET", "/TOTVS_BROKER_QUERY/JSON", &[])
        .await
        .unwrap();
    assert_eq!(second.status, 200);
    assert_eq!(second.json()["servers"][0]["server"], a.address().as_str());
    // A later request on the same connection is still the broker's, whatever its path.
    let third = connection
        .request("GET", "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .unwrap();
    assert_eq!(third.status, 200);
    assert_eq!(a.accepted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_path_answers_html_to_browsers_and_json_to_scripts() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let html = http_get(
        broker.addr(),
        "/TOTVS_BROKER_QUERY",
        &[("Accept", BROWSER_ACCEPT)],
    )
    .await;
    assert_eq!(html.status, 200);
    assert_eq!(
        html.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(html.text().contains("Servers (1)"));

    // peder1981's monitor: lower case, no headers of its own.
    for accept in [None, Some("*/*"), Some("application/json")] {
        let headers: Vec<(&str, &str)> = accept.iter().map(|a| ("Accept", *a)).collect();
        for path in [
            "/TOTVS_BROKER_QUERY",
            "/totvs_broker_query",
            "/totvs_broker_query/",
        ] {
            let answer = http_get(broker.addr(), path, &headers).await;
            assert_eq!(answer.status, 200, "{path} with Accept {accept:?}");
            assert_eq!(
                answer.header("content-type"),
                Some("application/json"),
                "{path} with Accept {accept:?}"
            );
            // The monitor decides by the first byte.
            assert!(
                answer.body.starts_with(b"{"),
                "{path} with Accept {accept:?}"
            );
            assert_eq!(answer.json()["servers"][0]["server"], a.address().as_str());
        }
    }
    // STATUS stays HTML and JSON stays JSON whatever the Accept.
    let status = http_get(
        broker.addr(),
        "/TOTVS_BROKER_QUERY/STATUS",
        &[("Accept", "application/json")],
    )
    .await;
    assert_eq!(
        status.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let json = http_get(
        broker.addr(),
        "/TOTVS_BROKER_QUERY/JSON",
        &[("Accept", BROWSER_ACCEPT)],
    )
    .await;
    assert_eq!(json.header("content-type"), Some("application/json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_answers_headers_without_a_body() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let mut connection = HttpConnection::connect(broker.addr()).await;
    let head = connection
        .request("HEAD", "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    // Had the broker sent the page after the head, it would be read here as the next answer.
    let ping = connection
        .request("GET", "/TOTVS_BROKER_QUERY/PING", &[])
        .await
        .unwrap();
    assert_eq!(ping.status, 200);
    assert!(ping.text().starts_with("OK"), "{:?}", ping.text());
    assert_eq!(a.accepted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_command_is_404_listing_the_commands() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let answer = get(&broker, "/TOTVS_BROKER_QUERY/USERINFO").await;
    assert_eq!(answer.status, 404);
    let text = answer.text();
    for command in ["STATUS", "CFG", "PING", "JSON", "METRICS", "SERVERSTATUS"] {
        assert!(text.contains(command), "{command} missing from:\n{text}");
    }
    assert_eq!(a.accepted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_line_over_8_kib_is_414() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let path = format!("/TOTVS_BROKER_QUERY/STATUS?x={}", "y".repeat(9 * 1024));
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let answer = send_raw(broker.addr(), request.as_bytes()).await;
    assert_eq!(answer.status, 414, "{}", answer.text());
    // Just under the limit is still answered.
    let path = format!("/TOTVS_BROKER_QUERY/STATUS?x={}", "y".repeat(7 * 1024));
    assert_eq!(get(&broker, &path).await.status, 200);
    assert_eq!(a.accepted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_over_16_kib_is_431() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let mut request = String::from("GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for i in 0..20 {
        request.push_str(&format!("X-Filler-{i}: {}\r\n", "z".repeat(1000)));
    }
    request.push_str("\r\n");
    assert!(request.len() > 16 * 1024);
    let answer = send_raw(broker.addr(), request.as_bytes()).await;
    assert_eq!(answer.status, 431, "{}", answer.text());
    // Headers of a few KiB are fine.
    let filler = "z".repeat(4000);
    let answer = http_get(
        broker.addr(),
        "/TOTVS_BROKER_QUERY/PING",
        &[("X-Filler", &filler)],
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(a.accepted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_sequence_is_exact_with_queries_in_between() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let mut ini = ini_for(&[], "SORT_METHOD=ROUND_ROBIN");
    ini.push_str(&format!(
        "REMOTE_SERVER_01={} 1\nREMOTE_SERVER_02={} 3\n",
        a.ini(),
        b.ini()
    ));
    let broker = InProcess::start(&ini).await;
    let commands = [
        "PING", "JSON", "STATUS", "METRICS", "CFG", "", "PING", "JSON",
    ];
    let mut order = Vec::new();
    for command in commands {
        let path = format!("/TOTVS_BROKER_QUERY/{command}");
        assert_eq!(get(&broker, &path).await.status, 200, "{path}");
        order.push(ask(broker.addr()).await.unwrap());
    }
    // The same sequence as without queries (tests/balancing.rs).
    assert_eq!(order, ["b", "a", "b", "b", "b", "a", "b", "b"]);
    assert_eq!(
        a.accepted() + b.accepted(),
        8,
        "only the clients reached servers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_bytes_stay_exact_after_a_query() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    assert_eq!(get(&broker, "/TOTVS_BROKER_QUERY/PING").await.status, 200);

    // Every byte value but the echo server's line end, twice over.
    let mut line: Vec<u8> = (0..=255u8).filter(|b| *b != b'\n').collect();
    line.extend_from_within(..);
    line.push(b'\n');
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    client.write_all(&line).await.unwrap();
    let mut expected = b"a: ".to_vec();
    expected.extend_from_slice(&line);
    assert_eq!(read_n(&mut client, expected.len()).await, expected);

    // Only a connection's first bytes are looked at: later on, a query line is client data.
    let query = b"GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\n";
    client.write_all(query).await.unwrap();
    let mut expected = b"a: ".to_vec();
    expected.extend_from_slice(query);
    assert_eq!(read_n(&mut client, expected.len()).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_http_paths_reach_the_server_untouched() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let requests: [&[u8]; 4] = [
        b"GET /rest/x HTTP/1.1\r\nHost: broker\r\nAccept: */*\r\n\r\n",
        // A longer name that only starts like the query path.
        b"GET /TOTVS_BROKER_QUERYX HTTP/1.1\r\nHost: broker\r\n\r\n",
        // Any method on another path.
        b"POST /rest/TOTVS_BROKER_QUERY/PING HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: broker\r\n\r\n",
    ];
    for (i, request) in requests.iter().enumerate() {
        let mut client = TcpStream::connect(broker.addr()).await.unwrap();
        client.write_all(request).await.unwrap();
        // The echo server answers each line with `a: <line>`.
        let expected: Vec<u8> = request
            .split_inclusive(|b| *b == b'\n')
            .flat_map(|l| [b"a: ".as_slice(), l].concat())
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&read_n(&mut client, expected.len()).await),
            String::from_utf8_lossy(&expected)
        );
        assert_eq!(a.accepted(), i + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_never_reach_a_server_nor_count_as_clients() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "")).await;
    let mut connection = HttpConnection::connect(broker.addr()).await;
    for path in [
        "/TOTVS_BROKER_QUERY",
        "/TOTVS_BROKER_QUERY/STATUS",
        "/TOTVS_BROKER_QUERY/CFG",
        "/TOTVS_BROKER_QUERY/PING",
        "/TOTVS_BROKER_QUERY/METRICS",
        "/TOTVS_BROKER_QUERY/NOSUCHTHING",
    ] {
        connection.request("GET", path, &[]).await.unwrap();
        get(&broker, path).await;
    }
    let status = query_json(broker.addr()).await;
    assert_eq!(status["totalConnectionsHistory"], 0, "{status:#}");
    assert_eq!(status["lastConnectionTime"], "-");
    // The query connection still open is not a client either.
    assert_eq!(status["active_connections"], 0, "{status:#}");
    assert_eq!((a.accepted(), b.accepted()), (0, 0));

    // A client does count: the same figures move.
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
    let status = query_json(broker.addr()).await;
    assert_eq!(status["totalConnectionsHistory"], 1, "{status:#}");
    assert!(is_clock(status["lastConnectionTime"].as_str().unwrap()));
    assert_eq!(a.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_do_not_raise_the_peak_of_simultaneous_clients() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    // Two query connections open at once, each answered.
    let mut first = HttpConnection::connect(broker.addr()).await;
    let mut second = HttpConnection::connect(broker.addr()).await;
    for connection in [&mut first, &mut second] {
        let ping = connection
            .request("GET", "/TOTVS_BROKER_QUERY/PING", &[])
            .await
            .unwrap();
        assert_eq!(ping.status, 200);
    }
    // The page shows it as "Maximum simultaneous connections (peak N)": clients, not queries.
    let status = query_json(broker.addr()).await;
    assert_eq!(status["peak_connections"], 0, "{status:#}");
    let (_held, _) = hold(broker.addr()).await;
    assert_eq!(query_json(broker.addr()).await["peak_connections"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_gets_the_banner_of_a_server_first_backend() {
    let a = TestServer::with_banner("a", "220 appserver ready\r\n").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    // The client sends nothing: the server speaks first, through the broker.
    let banner = read_n(&mut client, "220 appserver ready\r\n".len()).await;
    assert_eq!(banner, b"220 appserver ready\r\n");
    // Then the conversation goes on as usual.
    assert_eq!(exchange(&mut client, "hello").await.unwrap(), "a");
    assert_eq!(a.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_request_does_not_hold_up_other_queries() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let mut slow = HttpConnection::connect(broker.addr()).await;
    slow.stream
        .write_all(b"GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\n")
        .await
        .unwrap();
    let ping = get(&broker, "/TOTVS_BROKER_QUERY/PING").await;
    assert_eq!(ping.status, 200);
    assert_eq!(
        ask(broker.addr()).await.unwrap(),
        "a",
        "proxying goes on too"
    );
    // The slow one is still being waited for, and answered once it finishes.
    slow.stream.write_all(b"Host: x\r\n\r\n").await.unwrap();
    let answer = slow.read_response(false).await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(a.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_are_answered_with_every_server_down() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "")).await;
    a.stop().await;
    b.stop().await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    client.write_all(b"hello\n").await.unwrap();
    assert!(closed_at_once(client).await, "no server for a client");

    assert_eq!(get(&broker, "/TOTVS_BROKER_QUERY/PING").await.status, 200);
    let status = query_json(broker.addr()).await;
    for server in [&a, &b] {
        assert_eq!(
            server_json(&status, &server.address())["inquarantine"],
            true,
            "{status:#}"
        );
    }
    assert_eq!(status["unserved_connections"], 1);
    let page = get(&broker, "/TOTVS_BROKER_QUERY/STATUS").await;
    assert_eq!(page.status, 200);
    assert_eq!(page.text().matches("class='inQuarantine'").count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_are_answered_at_max_connections() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "MAX_CONNECTIONS=2")).await;
    let (_one, _) = hold(broker.addr()).await;
    let (_two, _) = hold(broker.addr()).await;

    let ping = get(&broker, "/TOTVS_BROKER_QUERY/PING").await;
    assert_eq!(ping.status, 200);
    let status = query_json(broker.addr()).await;
    assert_eq!(status["active_connections"], 2, "{status:#}");

    let mut third = TcpStream::connect(broker.addr()).await.unwrap();
    third.write_all(b"hello\n").await.unwrap();
    assert!(closed_at_once(third).await, "a client past MAX_CONNECTIONS");
    assert_eq!(a.accepted(), 2);
    assert_eq!(query_json(broker.addr()).await["rejected_connections"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_query_line_does_not_take_a_client_place() {
    let a = TestServer::start("a").await;
    // The longest QUERY_SNIFF_TIMEOUT, so the stalled line below is still being waited for
    // when the client arrives (after it, it would be forwarded as a client itself).
    let ini = ini_for(&[&a], "MAX_CONNECTIONS=1\nQUERY_SNIFF_TIMEOUT=5s");
    let broker = InProcess::start(&ini).await;
    // A request line that stops where it could still be a query (it may arrive in several
    // segments): the broker waits for the rest, but a slow query is not a client.
    let mut stalled = TcpStream::connect(broker.addr()).await.unwrap();
    stalled.write_all(b"GET /TOTVS_BROKER_QUERY").await.unwrap();
    // Connections are accepted in order: once a later one is answered, this one is in.
    assert_eq!(get(&broker, "/TOTVS_BROKER_QUERY/PING").await.status, 200);
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    assert_eq!(
        exchange(&mut client, "hello").await.ok().as_deref(),
        Some("a"),
        "the one client place went to a query; events:\n{}",
        broker.events.text()
    );
    // The stalled request is still answered once it is complete.
    stalled.write_all(b"/PING HTTP/1.1\r\n\r\n").await.unwrap();
    let answer = HttpConnection::on(stalled)
        .read_response(false)
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_max_connections_caps_unfinished_queries() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "QUERY_MAX_CONNECTIONS=2")).await;
    // A whole request line without its end, and one that stops right after the query path:
    // both are queries, and hold a place while their head does not come. (One that stops
    // mid-path is no query yet and holds no place: tests/query_access.rs.)
    let (held, refused) = hold_query_places(
        broker.addr(),
        &[
            b"GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\n",
            b"HEAD /TOTVS_BROKER_QUERY ",
        ],
    )
    .await;
    assert!(
        refused.text().contains("QUERY_MAX_CONNECTIONS"),
        "{}",
        refused.text()
    );
    assert_eq!(
        ask(broker.addr()).await.unwrap(),
        "a",
        "proxying still works"
    );

    // Their places come back when they leave.
    drop(held);
    ping_until(&broker, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_shows_in_json_within_a_monitor_round() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let ini = ini_for(
        &[&a, &b],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=200ms\nQUARANTINE_TIME=120",
    );
    let broker = InProcess::start(&ini).await;
    let status = query_json(broker.addr()).await;
    assert_eq!(server_json(&status, &b.address())["inquarantine"], false);
    assert_eq!(server_json(&status, &b.address())["quarantine"], "-");

    b.stop().await;
    let status = json_when(&broker, "b in quarantine", |status| {
        server_json(status, &b.address())["inquarantine"] == true
    })
    .await;
    let quarantined = server_json(&status, &b.address());
    assert!(
        is_clock(quarantined["quarantine"].as_str().unwrap()),
        "{quarantined}"
    );
    assert!(
        is_clock(quarantined["quarantine_entry_time"].as_str().unwrap()),
        "{quarantined}"
    );
    assert_eq!(quarantined["state"], "quarantined");
    assert_eq!(quarantined["reason"], "monitor");
    let healthy = server_json(&status, &a.address());
    assert_eq!(healthy["inquarantine"], false);
    assert_eq!(healthy["quarantine"], "-");

    b.resume().await;
    let status = json_when(&broker, "b released", |status| {
        server_json(status, &b.address())["inquarantine"] == false
    })
    .await;
    let released = server_json(&status, &b.address());
    assert_eq!(released["quarantine"], "-", "{released}");
    assert_eq!(released["quarantine_entry_time"], "-", "{released}");
    // Its error is history once a check passed: kept with its time, not shown.
    assert_eq!(released["last_error"], "connection refused", "{released}");
    assert!(
        released["last_error_epoch_ms"].as_u64().is_some(),
        "{released}"
    );
    assert_eq!(released["last_error_current"], false, "{released}");
    let page = get(&broker, "/TOTVS_BROKER_QUERY/STATUS").await.text();
    assert_eq!(
        state_cell(&page, &b.address()),
        "<span class='badge ok'>available</span>"
    );
}

/// The state cell of the server at `address` on a STATUS page, without its `<td>`.
fn state_cell(page: &str, address: &str) -> String {
    let row = page
        .split("<tr>")
        .find(|row| row.contains(&format!("ServerStatus/{address}\"")))
        .unwrap_or_else(|| panic!("no row of {address}:\n{page}"));
    let cells: Vec<&str> = row.split("<td").collect();
    let cell = cells[4];
    cell[cell.find('>').unwrap() + 1..cell.find("</td>").unwrap()].to_string()
}

/// Without a monitor, a server whose quarantine ran out is shown with the error that put it
/// there, and when, until a client's connect to it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_connect_error_is_shown_until_a_connect_succeeds() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let ini = ini_for(
        &[&a, &b],
        "SORT_METHOD=ROUND_ROBIN\nMONITORING_TYPE=DISABLED\nQUARANTINE_TIME=200ms",
    );
    let broker = InProcess::start(&ini).await;
    b.stop().await;
    quarantine_by_clients(&broker, &b).await;
    let status = json_when(&broker, "b's quarantine over", |status| {
        server_json(status, &b.address())["inquarantine"] == false
    })
    .await;
    let over = server_json(&status, &b.address());
    assert_eq!(
        over["last_error_current"], true,
        "nothing proved since: {over}"
    );
    let at = over["last_error_epoch_ms"].as_u64().unwrap();
    let page = get(&broker, "/TOTVS_BROKER_QUERY/STATUS").await.text();
    let cell = state_cell(&page, &b.address());
    assert!(
        cell.contains("available")
            && cell.contains(&format!(
                "Error at {}: connection refused",
                appbroker::support::clock::time_of_day(at)
            )),
        "{cell}"
    );

    b.resume().await;
    poll("b reached", Duration::ZERO, DEADLINE, async || {
        let name = ask(broker.addr()).await.expect("answered");
        if name == "b" { Ok(()) } else { Err(name) }
    })
    .await;
    let page = get(&broker, "/TOTVS_BROKER_QUERY/STATUS").await.text();
    assert_eq!(
        state_cell(&page, &b.address()),
        "<span class='badge ok'>available</span>",
        "a client reached it: the error is history"
    );
    let server = query_json(broker.addr()).await["servers"][1].clone();
    assert_eq!(server["last_error_current"], false, "{server}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_allow_denies_other_addresses_with_403() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "QUERY_ALLOW=10.0.0.0/8")).await;
    for path in [
        "/TOTVS_BROKER_QUERY",
        "/TOTVS_BROKER_QUERY/STATUS",
        "/TOTVS_BROKER_QUERY/JSON",
        "/TOTVS_BROKER_QUERY/PING",
    ] {
        let answer = get(&broker, path).await;
        assert_eq!(answer.status, 403, "{path}: {}", answer.text());
        assert!(
            !answer.text().contains(&a.address()),
            "{path} gives no server address away"
        );
    }
    // A denied query is not forwarded either; clients go on as usual.
    assert_eq!(a.accepted(), 0);
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_allow_admits_listed_addresses() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "QUERY_ALLOW=10.0.0.0/8, 127.0.0.1")).await;
    assert_eq!(get(&broker, "/TOTVS_BROKER_QUERY/PING").await.status, 200);
    assert_eq!(get(&broker, "/TOTVS_BROKER_QUERY/JSON").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_enabled_0_forwards_query_requests_like_any_bytes() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "QUERY_ENABLED=0")).await;
    let request = b"GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\nHost: broker\r\n\r\n";
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    client.write_all(request).await.unwrap();
    let expected = b"a: GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\na: Host: broker\r\na: \r\n";
    assert_eq!(
        String::from_utf8_lossy(&read_n(&mut client, expected.len()).await),
        String::from_utf8_lossy(expected)
    );
    assert_eq!(a.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_answers_503_during_shutdown_grace() {
    let a = TestServer::start("a").await;
    // A grace far longer than the test: the broker is killed when the test ends.
    let ini = ini_for(&[&a], "").replace("[General]\n", "[General]\nSHUTDOWN_GRACE=60s\n");
    let broker = InProcess::start(&ini).await;
    let (mut held, _) = hold(broker.addr()).await;
    assert_eq!(get(&broker, "/TOTVS_BROKER_QUERY/PING").await.status, 200);

    broker.broker.shutdown();
    broker
        .events
        .wait_for("the drain", |e| *e == appbroker::Event::Draining)
        .await;
    let ping = get(&broker, "/TOTVS_BROKER_QUERY/PING").await;
    assert_eq!(ping.status, 503, "{}", ping.text());
    assert_eq!(query_json(broker.addr()).await["draining"], true);
    // Clients are still served, old and new.
    assert_eq!(exchange(&mut held, "still there").await.unwrap(), "a");
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_balancers_each_show_their_own_and_link_to_the_other() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n\
         [BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
         MONITORING_TYPE=DISABLED\nREMOTE_SERVER_01={}\n\
         [BALANCE_WEB_SERVICES]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT2@\n\
         MONITORING_TYPE=DISABLED\nREMOTE_SERVER_01={}\n",
        a.ini(),
        b.ini()
    );
    let broker = InProcess::start(&ini).await;
    let sides = [
        (
            broker.addr(),
            "BALANCE_SMART_CLIENT_DESKTOP",
            &a,
            broker.addr2(),
            "BALANCE_WEB_SERVICES",
        ),
        (
            broker.addr2(),
            "BALANCE_WEB_SERVICES",
            &b,
            broker.addr(),
            "BALANCE_SMART_CLIENT_DESKTOP",
        ),
    ];
    for (addr, section, server, other, other_section) in sides {
        let status = http_get(addr, "/TOTVS_BROKER_QUERY/JSON", &[]).await.json();
        assert_eq!(status["balancer"], section);
        let servers: Vec<&str> = status["servers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["server"].as_str().unwrap())
            .collect();
        assert_eq!(
            servers,
            [server.address()],
            "{section} shows its own servers"
        );

        let page = http_get(addr, "/TOTVS_BROKER_QUERY/STATUS", &[])
            .await
            .text();
        let page = Html::parse_document(&page);
        let title: String = page
            .select(&Selector::parse("title").unwrap())
            .next()
            .unwrap()
            .text()
            .collect();
        assert!(title.contains(section), "{title}");
        let link = format!("http://{other}/TOTVS_BROKER_QUERY/STATUS");
        let anchor = page
            .select(&Selector::parse("a[href]").unwrap())
            .find(|a| a.value().attr("href") == Some(&link))
            .unwrap_or_else(|| panic!("no link {link} on {section}'s page"));
        assert!(anchor.text().collect::<String>().contains(other_section));
    }
}

/// The text a reader sees on `html`: every text node, the stylesheet's left out.
fn visible_text(html: &str) -> String {
    let page = Html::parse_document(html);
    page.root_element()
        .descendants()
        .filter_map(|node| node.value().as_text().map(|t| (node, t)))
        .filter(|(node, _)| {
            node.parent()
                .and_then(ElementRef::wrap)
                .is_none_or(|e| e.value().name() != "style")
        })
        .map(|(_, t)| t.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portuguese_labels_follow_the_totvs_page() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let ini = ini_for(&[&a, &b], "SORT_METHOD=ROUND_ROBIN")
        .replace("[General]\n", "[General]\nLANGUAGE=pt-BR\n");
    let broker = InProcess::start(&ini).await;
    b.stop().await;
    quarantine_by_clients(&broker, &b).await;
    let page = get(&broker, "/TOTVS_BROKER_QUERY/STATUS").await.text();
    assert!(page.contains("<th>Quarentena</th>"), "{page}");
    assert!(
        page.contains("Servers (2)"),
        "the heading monitors look for stays"
    );
    // Every word in Portuguese: the errors, the chart's axis; said once, not twice.
    let text = visible_text(&page);
    for english in [
        "connection refused",
        "now",
        " s ",
        "active connections",
        "quarantined",
    ] {
        assert!(
            !text.contains(english),
            "{english:?} on the pt-BR page:\n{text}"
        );
    }
    for portuguese in ["conexão recusada", "agora", "em quarentena"] {
        assert!(text.contains(portuguese), "{portuguese:?} missing:\n{text}");
    }
    // One count of active connections (`0 conexões ativas`, `1 conexão ativa`), not a label
    // saying it again above it (`Conexões ativas 0 conexões ativas`).
    assert_eq!(
        text.matches("conexões ativas").count() + text.matches("conexão ativa").count(),
        1,
        "{text}"
    );
    assert!(!text.contains("Conexões ativas 0") && !text.contains("Conexões ativas 1"));
    let detail = get(
        &broker,
        &format!("/TOTVS_BROKER_QUERY/ServerStatus/{}", b.address()),
    )
    .await
    .text();
    let text = visible_text(&detail);
    assert!(!text.contains("connection refused"), "{text}");
    assert!(text.contains("conexão de cliente"), "{text}");
    let english = InProcess::start(&ini_for(&[&a], "")).await;
    let page = get(&english, "/TOTVS_BROKER_QUERY/STATUS").await.text();
    assert!(!page.contains("Quarentena"), "English by default");
}

/// tbarbito/protheus-broker-monitor's reading of the STATUS page, as in its Python: for every
/// `<a href>` matching `ServerStatus/([\d.]+):(\d+)`, the third `<td>` of its `<tr>`.
fn tbarbito_quarantine_cells(html: &str) -> Vec<((String, u16), String)> {
    let page = Html::parse_document(html);
    let mut found = Vec::new();
    for a in page.select(&Selector::parse("a[href]").unwrap()) {
        let href = a.value().attr("href").unwrap();
        let Some((_, rest)) = href.split_once("ServerStatus/") else {
            continue;
        };
        let Some((ip, port)) = rest.split_once(':') else {
            continue;
        };
        let digits: String = port.chars().take_while(char::is_ascii_digit).collect();
        if ip.is_empty() || !ip.chars().all(|c| c.is_ascii_digit() || c == '.') || digits.is_empty()
        {
            continue;
        }
        let tr = a
            .ancestors()
            .filter_map(ElementRef::wrap)
            .find(|e| e.value().name() == "tr")
            .expect("the link is in a table row");
        let cells: Vec<String> = tr
            .select(&Selector::parse("td").unwrap())
            .map(|td| td.text().collect::<String>().trim().to_string())
            .collect();
        found.push(((ip.to_string(), digits.parse().unwrap()), cells[2].clone()));
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_table_keeps_the_contract_of_the_monitors() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "SORT_METHOD=ROUND_ROBIN")).await;
    b.stop().await;
    quarantine_by_clients(&broker, &b).await;
    let html = get(&broker, "/totvs_broker_query/status").await.text();

    let cells = tbarbito_quarantine_cells(&html);
    let ports: Vec<u16> = cells.iter().map(|((_, port), _)| *port).collect();
    assert_eq!(ports, [a.addr.port(), b.addr.port()], "{cells:?}");
    assert!(cells.iter().all(|((ip, _), _)| ip == "127.0.0.1"));
    assert_eq!(cells[0].1, "-", "available: a bare dash");
    assert!(
        is_clock(&cells[1].1),
        "quarantined: the end time, not {:?}",
        cells[1].1
    );

    let page = Html::parse_document(&html);
    let table = page
        .select(&Selector::parse("table").unwrap())
        .find(|t| t.html().contains("ServerStatus/"))
        .expect("the server table");
    // `Servers (N)` comes before the table (peder1981's monitor searches from it).
    let heading = html.find("Servers (2)").expect("Servers (2) heading");
    let first_row = html.find("ServerStatus/").unwrap();
    assert!(heading < first_row);
    let header: Vec<String> = table
        .select(&Selector::parse("th").unwrap())
        .map(|th| th.text().collect())
        .collect();
    assert_eq!(header[..3], ["Server", "Connections", "Quarantine"]);
    for tr in table.select(&Selector::parse("tr").unwrap()) {
        if !tr.html().contains("ServerStatus/") {
            continue;
        }
        assert_eq!(
            tr.select(&Selector::parse("th").unwrap()).count(),
            0,
            "a data row with a <th>: {}",
            tr.html()
        );
        let first = tr.select(&Selector::parse("td").unwrap()).next().unwrap();
        let link = first.select(&Selector::parse("a").unwrap()).next().unwrap();
        let text: String = link.text().collect();
        assert_eq!(
            link.value().attr("href").unwrap(),
            format!("/TOTVS_BROKER_QUERY/ServerStatus/{text}")
        );
    }
    // The quarantined row stands out by its state cell's TOTVS class; rows open with a
    // plain `<tr>` (peder1981's monitor splits the table on it).
    let quarantined_rows: Vec<String> = table
        .select(&Selector::parse("tr").unwrap())
        .filter(|tr| {
            tr.select(&Selector::parse("td.inQuarantine").unwrap())
                .next()
                .is_some()
        })
        .map(|tr| {
            tr.select(&Selector::parse("a").unwrap())
                .next()
                .unwrap()
                .text()
                .collect()
        })
        .collect();
    assert_eq!(
        quarantined_rows,
        [b.address()],
        "the quarantined row stands out"
    );
    assert_eq!(
        html.matches("<tr>").count(),
        3,
        "the header and both servers' rows open with a plain <tr>:\n{html}"
    );
}

/// The JSON type of a value, as a monitor sees it.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every field of `captured` is in `ours` with the same JSON type.
fn same_fields(captured: &Value, ours: &Value, at: &str) {
    for (name, value) in captured.as_object().expect("an object") {
        let mine = ours
            .get(name)
            .unwrap_or_else(|| panic!("{at}{name} missing from ours:\n{ours:#}"));
        assert_eq!(
            kind(mine),
            kind(value),
            "{at}{name}: ours is {mine}, TOTVS's {value}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_is_a_superset_of_the_captured_totvs_schema() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/captures/peder1981-monitor__broker_json_real.json"
    );
    let captured: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(
        !captured["servers"].as_array().unwrap().is_empty(),
        "the capture has servers"
    );

    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    let mut ini = ini_for(&[], "SORT_METHOD=ROUND_ROBIN");
    ini.push_str(&format!(
        "REMOTE_SERVER_01={}\nREMOTE_SERVER_02={}\nREMOTE_SERVER_03={} 0\n",
        a.ini(),
        b.ini(),
        c.ini()
    ));
    let broker = InProcess::start(&ini).await;
    let _held: Vec<_> = [
        hold(broker.addr()).await,
        hold(broker.addr()).await,
        hold(broker.addr()).await,
    ]
    .into_iter()
    .map(|(stream, _)| stream)
    .collect();
    let ours = query_json(broker.addr()).await;

    same_fields(&captured, &ours, "");
    same_fields(&captured["total"], &ours["total"], "total.");
    let servers = ours["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 3);
    for (i, server) in servers.iter().enumerate() {
        same_fields(&captured["servers"][0], server, &format!("servers[{i}]."));
    }

    for field in ["date", "startedDate", "lastConnectionDate"] {
        assert!(
            is_date(ours[field].as_str().unwrap()),
            "{field}: {}",
            ours[field]
        );
    }
    for field in ["time", "startedTime", "lastConnectionTime"] {
        assert!(
            is_clock(ours[field].as_str().unwrap()),
            "{field}: {}",
            ours[field]
        );
    }
    let connections: Vec<u64> = servers
        .iter()
        .map(|s| s["connections"].as_u64().unwrap())
        .collect();
    assert_eq!(
        connections,
        [2, 1, 0],
        "weights 1, 1, 0 and three clients held"
    );
    assert_eq!(ours["total"]["connections"], 3, "the sum over servers");
    assert_eq!(ours["totalConnectionsHistory"], 3);
    assert_eq!(ours["apiVersion"], "1.1");
    assert_eq!(servers[2]["disabled"], true, "weight 0");
    assert_eq!(servers[0]["disabled"], false);
    for server in servers {
        let address = server["server"].as_str().unwrap();
        assert!(address.starts_with("127.0.0.1:"), "{address}");
        assert_eq!(server["quarantine"], "-");
        assert_eq!(server["quarantine_entry_time"], "-");
        assert_eq!(server["inquarantine"], false);
    }
}

/// One sample line of the Prometheus text format: name, labels, value.
fn parse_sample(line: &str) -> (String, Vec<(String, String)>, f64) {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    assert!(
        !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()),
        "bad metric name in {line:?}"
    );
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inside) = rest.strip_prefix('{') {
        let close = inside
            .find('}')
            .unwrap_or_else(|| panic!("unclosed labels: {line:?}"));
        for pair in inside[..close].split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .unwrap_or_else(|| panic!("label without '=': {line:?}"));
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or_else(|| panic!("unquoted label value: {line:?}"));
            labels.push((key.to_string(), value.to_string()));
        }
        rest = &inside[close + 1..];
    }
    let value = rest
        .strip_prefix(' ')
        .unwrap_or_else(|| panic!("no space before the value: {line:?}"));
    let value: f64 = value
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {value:?} in {line:?}"));
    (name.to_string(), labels, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let ini = ini_for(
        &[&a, &b],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=200ms",
    );
    let broker = InProcess::start(&ini).await;
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
    // The relay counts bytes once it has written them, so the client may have read its echo
    // before the last of them is counted: the figures asserted below are asked for only once
    // the broker has counted the client's end.
    broker.events.wait_for_ended(1).await;
    // The check families have samples once a monitor round has run.
    let text = until("check samples", async || {
        let text = get(&broker, "/TOTVS_BROKER_QUERY/METRICS").await.text();
        if text.matches("appbroker_server_check_up{").count() == 2 {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;

    let mut samples = Vec::new();
    let mut typed = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.split_whitespace().collect();
            if words.first() == Some(&"TYPE") {
                assert!(["counter", "gauge"].contains(&words[2]), "type of {line:?}");
                typed.push(words[1].to_string());
            }
            continue;
        }
        samples.push(parse_sample(line));
    }
    let value = |name: &str, server: Option<&str>| -> f64 {
        samples
            .iter()
            .find(|(n, labels, _)| {
                n == name
                    && labels.contains(&("balancer".into(), "BALANCE_SMART_CLIENT_DESKTOP".into()))
                    && server.is_none_or(|s| labels.contains(&("server".into(), s.into())))
            })
            .unwrap_or_else(|| panic!("no sample {name} {server:?} in:\n{text}"))
            .2
    };
    let per_server = [
        "server_active_connections",
        "server_connections_total",
        "server_failed_connects_total",
        "server_bytes_to_server_total",
        "server_bytes_to_client_total",
        "server_in_quarantine",
        "server_quarantines_total",
        "server_weight",
        "server_check_duration_seconds",
        "server_check_up",
    ];
    for family in per_server {
        let name = format!("appbroker_{family}");
        assert!(typed.contains(&name), "# TYPE {name} missing");
        for server in [&a, &b] {
            value(&name, Some(&server.address()));
        }
    }
    let per_balancer = [
        "balancer_accepted_clients_total",
        "balancer_rejected_clients_total",
        "balancer_unserved_clients_total",
        "balancer_active_clients",
        "balancer_max_connections",
        "balancer_draining",
        "start_time_seconds",
    ];
    for family in per_balancer {
        let name = format!("appbroker_{family}");
        assert!(typed.contains(&name), "# TYPE {name} missing");
        value(&name, None);
    }
    // The figures say what happened: one client, to a, "ping\n" and its echo.
    assert_eq!(
        value("appbroker_balancer_accepted_clients_total", None),
        1.0
    );
    assert_eq!(
        value("appbroker_server_connections_total", Some(&a.address())),
        1.0
    );
    assert_eq!(
        value("appbroker_server_connections_total", Some(&b.address())),
        0.0
    );
    assert_eq!(
        value("appbroker_server_bytes_to_server_total", Some(&a.address())),
        5.0
    );
    assert_eq!(
        value("appbroker_server_bytes_to_client_total", Some(&a.address())),
        8.0
    );
    assert_eq!(value("appbroker_server_check_up", Some(&b.address())), 1.0);
    assert_eq!(value("appbroker_balancer_max_connections", None), 10000.0);
}

/// The language a page is in, by its `<html lang>`.
fn page_language(html: &str) -> String {
    let page = Html::parse_document(html);
    let root = page.root_element();
    root.value().attr("lang").unwrap_or_default().to_string()
}

/// Every link of a page to one of its own pages (STATUS, CFG, ServerStatus): what a reader
/// clicks on to go on reading in the page's language.
fn page_links(html: &str) -> Vec<String> {
    let page = Html::parse_document(html);
    let links = Selector::parse("a[href]").unwrap();
    page.select(&links)
        .filter_map(|a| a.value().attr("href"))
        .filter(|href| {
            let upper = href.to_ascii_uppercase();
            ["/STATUS", "/CFG", "/SERVERSTATUS/"]
                .iter()
                .any(|page| upper.contains(&format!("/TOTVS_BROKER_QUERY{page}")))
        })
        .map(str::to_string)
        .collect()
}

/// A STATUS page through `broker`, asked with `path`'s query and `accept_language`, if any:
/// its language, after checking it says it varies by `Accept-Language`.
async fn language_of(broker: &Broker, path: &str, accept_language: Option<&str>) -> String {
    let headers: Vec<(&str, &str)> = accept_language
        .map(|value| ("Accept-Language", value))
        .into_iter()
        .collect();
    let answer = http_get(broker.addr(), path, &headers).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let vary = answer
        .header("vary")
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(vary.contains("accept-language"), "Vary: {vary:?} on {path}");
    page_language(&answer.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_language_is_the_one_asked_then_the_files_then_the_browsers() {
    // Through the binary: a broker whose file says nothing of LANGUAGE, and one whose does.
    let a = TestServer::start("a").await;
    let unset = Broker::start(&ini_for(&[&a], "")).await;
    let set =
        Broker::start(&ini_for(&[&a], "").replace("[General]\n", "[General]\nLANGUAGE=en\n")).await;
    let status = "/TOTVS_BROKER_QUERY/STATUS";
    // The browser's Accept-Language, by its q-values: Portuguese of any region is pt-BR.
    for (header, wanted) in [
        (None, "en"),
        (Some("pt-BR,pt;q=0.9,en-US;q=0.8,en;q=0.7"), "pt-BR"),
        (Some("pt-PT"), "pt-BR"),
        (Some("PT-br"), "pt-BR"),
        (Some("en-US,en;q=0.9,pt-BR;q=0.8"), "en"),
        (Some("fr-FR, pt;q=0.5"), "pt-BR"),
        (Some("en;q=0.4, pt;q=0.6"), "pt-BR"),
        (Some("pt;q=0, en"), "en"),
        (Some("de, fr;q=0.9"), "en"),
        (Some("*"), "en"),
        (Some("pt;q=nonsense"), "en"),
        (Some("portuguese"), "en"),
        (Some(",,;q=, pt"), "pt-BR"),
    ] {
        assert_eq!(
            language_of(&unset, status, header).await,
            wanted,
            "Accept-Language: {header:?}"
        );
    }
    // LANGUAGE set in the file wins over the browser's; `?lang=` over both.
    let portuguese_browser = Some("pt-BR,pt;q=0.9");
    assert_eq!(language_of(&set, status, portuguese_browser).await, "en");
    for (broker, header) in [(&unset, None), (&set, portuguese_browser)] {
        for (asked, wanted) in [("pt-BR", "pt-BR"), ("en", "en"), ("pt-br", "pt-BR")] {
            let path = format!("{status}?lang={asked}");
            let got = language_of(broker, &path, header).await;
            assert_eq!(got, wanted, "{path} with Accept-Language {header:?}");
        }
    }
    // An unknown `lang` is no ask at all.
    assert_eq!(
        language_of(&unset, &format!("{status}?lang=xx"), None).await,
        "en"
    );
    for path in [
        "/TOTVS_BROKER_QUERY/CFG?lang=pt-BR".to_string(),
        format!(
            "/TOTVS_BROKER_QUERY/ServerStatus/{}?lang=pt-BR",
            a.address()
        ),
    ] {
        assert_eq!(language_of(&unset, &path, None).await, "pt-BR", "{path}");
    }
    // Asked with `?lang=`, a page's links keep it: the next page is in the same language.
    let page = http_get(unset.addr(), &format!("{status}?lang=pt-BR&refresh=5"), &[])
        .await
        .text();
    let links = page_links(&page);
    assert!(links.len() >= 4, "{links:?}");
    for link in &links {
        assert!(link.contains("lang=pt-BR"), "{link} drops the language");
    }
    // What the public monitors read stays as it is, in either language.
    for header in [None, portuguese_browser] {
        let headers: Vec<(&str, &str)> =
            header.map(|v| ("Accept-Language", v)).into_iter().collect();
        let page = http_get(unset.addr(), status, &headers).await.text();
        assert!(page.contains("Servers (1)"), "{page}");
        assert!(page.contains("<th>Server</th>"), "{page}");
    }
}

/// The text of the facts' box labelled `label` on a STATUS page.
fn fact_value(html: &str, label: &str) -> String {
    let page = Html::parse_document(html);
    let facts = Selector::parse(".fact").unwrap();
    let labels = Selector::parse(".label").unwrap();
    let values = Selector::parse(".value").unwrap();
    page.select(&facts)
        .find(|fact| {
            fact.select(&labels)
                .next()
                .is_some_and(|l| l.text().collect::<String>() == label)
        })
        .and_then(|fact| fact.select(&values).next())
        .map(|v| v.text().collect::<String>())
        .unwrap_or_else(|| panic!("no fact {label:?} on the page"))
}

/// `YYYY-MM-DD` with each field in range.
fn is_iso_date(text: &str) -> bool {
    let parts: Vec<&str> = text.split('-').collect();
    parts.len() == 3
        && [4, 2, 2]
            .iter()
            .zip(&parts)
            .all(|(len, p)| p.len() == *len && p.bytes().all(|b| b.is_ascii_digit()))
        && (1..=12).contains(&parts[1].parse::<u32>().unwrap())
        && (1..=31).contains(&parts[2].parse::<u32>().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn english_pages_write_dates_in_iso_8601_and_portuguese_ones_as_totvs_does() {
    // Through the binary: `06/12/2026` reads as June 12 to an English reader.
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&a], "")).await;
    let (_held, _) = hold(broker.addr()).await;
    let status = "/TOTVS_BROKER_QUERY/STATUS";
    let english = http_get(broker.addr(), status, &[]).await.text();
    for label in ["Started", "Now", "Last connection"] {
        let value = fact_value(&english, label);
        let (date, time) = value
            .split_once(' ')
            .unwrap_or_else(|| panic!("{label}: {value:?}"));
        assert!(
            is_iso_date(date) && is_clock(time),
            "{label}: {value:?} is not YYYY-MM-DD HH:MM:SS"
        );
    }
    let portuguese = http_get(broker.addr(), &format!("{status}?lang=pt-BR"), &[])
        .await
        .text();
    for label in ["Iniciou operação", "Agora", "Última conexão"] {
        let value = fact_value(&portuguese, label);
        let (time, date) = value
            .split_once(' ')
            .unwrap_or_else(|| panic!("{label}: {value:?}"));
        assert!(
            is_clock(time) && is_date(date),
            "{label}: {value:?} is not HH:MM:SS DD/MM/YYYY"
        );
    }
    // The TOTVS JSON's dates stay as monitors parse them, whatever the page's language.
    let json = http_get(
        broker.addr(),
        "/TOTVS_BROKER_QUERY/JSON",
        &[("Accept-Language", "en-US")],
    )
    .await
    .json();
    for field in ["date", "startedDate", "lastConnectionDate"] {
        assert!(
            is_date(json[field].as_str().unwrap()),
            "{field}: {}",
            json[field]
        );
    }
}
