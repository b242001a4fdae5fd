//! HTTP session affinity through the real broker: `[BALANCE_HTTP]` in process on a
//! generated ini, loopback origin servers, the `TOTVS_BROKER_SH_001` cookie as a client
//! sends it back. Which server served a request is read from the broker's request events and
//! from what each origin saw. Real clients too: headless Chromium on the demo's page (its
//! stand-in web servers in process, which record what they served), and curl with a cookie
//! jar.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use appbroker::Event;
use appbroker::demo::StandIn;
use appbroker::demo::web::Resource;
use harness::{
    DevTools, InProcess, Origin, Reason, client, dead_addr, find_chromium, full, request, send,
    session_secret_line, signed_cookie, web_stand_ins, weighted_http_ini,
};
use hyper::header::{COOKIE, SET_COOKIE};
use hyper::{HeaderMap, StatusCode};

/// An ini with one `[BALANCE_HTTP]` on `@PORT@`, monitoring off, `extra` lines in the
/// section, and `servers` as `(address, weight)` under ids 01, 02...; the tests'
/// `SESSION_SECRET`, so that [`signed`] makes cookies the broker takes as its own.
fn ini(servers: &[(SocketAddr, u32)], extra: &str) -> String {
    weighted_http_ini(&session_secret_line(), servers, extra)
}

/// One GET of `path` on a new connection to `broker`, with `cookie` as its `Cookie` header:
/// the status, and the cookie value the answer sets, if any.
async fn get_with(
    broker: SocketAddr,
    path: &str,
    cookie: Option<&str>,
) -> (StatusCode, Option<String>) {
    let mut sender = client(broker).await;
    let mut req = request("GET", broker, path, full(""));
    if let Some(cookie) = cookie {
        req.headers_mut().insert(COOKIE, cookie.parse().unwrap());
    }
    let (status, headers, _) = send(&mut sender, req).await;
    (status, set_cookie(&headers))
}

/// `Cookie: TOTVS_BROKER_SH_001=<a value the broker signed for server id, one per n>`.
fn signed(id: &str, n: u64) -> String {
    format!("TOTVS_BROKER_SH_001={}", signed_cookie(id, n))
}

/// The value of the broker's cookie in an answer's `Set-Cookie`, checked whole.
fn set_cookie(headers: &HeaderMap) -> Option<String> {
    let line = headers.get(SET_COOKIE)?.to_str().unwrap();
    let value = line
        .strip_prefix("TOTVS_BROKER_SH_001=")
        .and_then(|rest| rest.strip_suffix("; Path=/; HttpOnly; SameSite=Lax"))
        .unwrap_or_else(|| panic!("unexpected Set-Cookie: {line}"));
    assert_cookie_shape(value);
    Some(value.to_string())
}

/// `value` is `<two-character id>.<22 characters of base64url>`.
fn assert_cookie_shape(value: &str) {
    let (id, random) = value.split_once('.').unwrap();
    assert_eq!(id.len(), 2, "{value}");
    assert_eq!(random.len(), 22, "{value}");
    assert!(
        random
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'),
        "{value}"
    );
}

/// The servers the broker's finished requests went to, in order.
fn served(broker: &InProcess) -> Vec<String> {
    broker
        .events
        .all()
        .iter()
        .filter_map(|e| match e {
            Event::Request { server, .. } => Some(server.clone().unwrap_or_default()),
            _ => None,
        })
        .collect()
}

/// Waits until the broker published `n` finished requests; returns the servers of them.
async fn served_n(broker: &InProcess, n: usize) -> Vec<String> {
    broker
        .events
        .wait_for_count("the requests", n, |e| matches!(e, Event::Request { .. }))
        .await;
    served(broker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_stays_on_its_server_across_connections() {
    let (a, b) = (Origin::start().await, Origin::start().await);
    let broker = InProcess::start(&ini(&[(a.addr, 1), (b.addr, 1)], "")).await;
    let (status, cookie) = get_with(broker.addr(), "/first", None).await;
    assert_eq!(status, StatusCode::OK);
    let cookie = cookie.expect("the first answer sets the cookie");
    let first = served_n(&broker, 1).await[0].clone();
    let expected_id = if first == a.addr.to_string() {
        "01"
    } else {
        "02"
    };
    assert!(
        cookie.starts_with(&format!("{expected_id}.")),
        "{cookie} for {first}"
    );
    // Twenty more requests, each on a new connection, with other cookies around ours.
    for i in 0..20 {
        let header = format!("lang=pt; TOTVS_BROKER_SH_001={cookie}; theme=dark");
        let (status, again) = get_with(broker.addr(), &format!("/p/{i}"), Some(&header)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(again, None, "a valid cookie is not set again");
    }
    let servers = served_n(&broker, 21).await;
    assert!(servers.iter().all(|s| *s == first), "{servers:?}");
    // The servers never saw the broker's cookie; the others reached them untouched.
    let seen: Vec<_> = a.seen().into_iter().chain(b.seen()).collect();
    assert_eq!(seen.len(), 21);
    for s in seen.iter().filter(|s| s.target.starts_with("/p/")) {
        assert_eq!(s.headers[COOKIE], "lang=pt; theme=dark");
    }
    assert!(seen[0].headers.get(COOKIE).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sessions_are_spread_by_weight() {
    let (a, b) = (Origin::start().await, Origin::start().await);
    let broker = InProcess::start(&ini(&[(a.addr, 1), (b.addr, 3)], "")).await;
    let mut ids = Vec::new();
    // Forty browsers one after the other, each bringing its cookie back once (which makes it
    // a session, what SORT_METHOD=SESSION, the HTTP default, spreads).
    for _ in 0..40 {
        let (_, cookie) = get_with(broker.addr(), "/", None).await;
        let cookie = cookie.unwrap();
        let header = format!("TOTVS_BROKER_SH_001={cookie}");
        let (status, _) = get_with(broker.addr(), "/again", Some(&header)).await;
        assert_eq!(status, StatusCode::OK);
        ids.push(cookie[..2].to_string());
    }
    let on_01 = ids.iter().filter(|id| *id == "01").count();
    assert_eq!((on_01, 40 - on_01), (10, 30), "{ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_unknown_cookies_count_as_none() {
    let a = Origin::start().await;
    let broker = InProcess::start(&ini(&[(a.addr, 1)], "")).await;
    for forged in [
        "TOTVS_BROKER_SH_001=99.AAAAAAAAAAAAAAAAAAAAAA",
        "TOTVS_BROKER_SH_001=01.short",
        "TOTVS_BROKER_SH_001=10.0.0.1:8080",
        "TOTVS_BROKER_SH_001=",
        "TOTVS_BROKER_SH_001=01.AAAAAAAAAAAAAAAAAAAA+/",
        // Of the right form, but not signed with the broker's secret.
        "TOTVS_BROKER_SH_001=01.q3VdAbCdEfGhIjKlMnOpQr",
    ] {
        let (status, cookie) = get_with(broker.addr(), "/", Some(forged)).await;
        assert_eq!(status, StatusCode::OK, "{forged}");
        assert!(cookie.expect(forged).starts_with("01."), "{forged}");
    }
    // None reached the server, nor any broker cookie at all.
    assert!(a.seen().iter().all(|s| s.headers.get(COOKIE).is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_a_failing_server_moves_and_gets_a_new_cookie() {
    let dead = dead_addr().await;
    let live = Origin::start().await;
    let broker = InProcess::start(&ini(&[(dead, 1), (live.addr, 1)], "")).await;
    let on_dead = &signed("01", 1);
    let (status, cookie) = get_with(broker.addr(), "/", Some(on_dead)).await;
    assert_eq!(status, StatusCode::OK);
    let cookie = cookie.expect("the moved session gets a new cookie");
    assert!(cookie.starts_with("02."), "{cookie}");
    broker
        .events
        .wait_for_quarantine(&dead.to_string(), Reason::Connect)
        .await;
    // In quarantine now: the old cookie goes straight to the other server, set anew.
    let (status, again) = get_with(broker.addr(), "/", Some(on_dead)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(again.unwrap().starts_with("02."));
    // The new one stays.
    let header = format!("TOTVS_BROKER_SH_001={cookie}");
    assert_eq!(
        get_with(broker.addr(), "/", Some(&header)).await,
        (StatusCode::OK, None)
    );
    let servers = served_n(&broker, 3).await;
    assert!(
        servers.iter().all(|s| *s == live.addr.to_string()),
        "{servers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_answers_503_rather_than_moving() {
    let dead = dead_addr().await;
    let live = Origin::start().await;
    let broker = InProcess::start(&ini(&[(dead, 1), (live.addr, 1)], "HTTP_STICKY_STRICT=1")).await;
    let on_dead = &signed("01", 1);
    let (status, cookie) = get_with(broker.addr(), "/", Some(on_dead)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(cookie, None, "the broker's own page sets no cookie");
    assert!(live.seen().is_empty());
    // A client without a session is served as ever.
    let (status, cookie) = get_with(broker.addr(), "/", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(cookie.unwrap().starts_with("02."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_server_keeps_its_sessions_and_gets_no_new_ones() {
    let (a, b) = (Origin::start().await, Origin::start().await);
    // 01 at weight 0: draining from the start.
    let broker = InProcess::start(&ini(&[(a.addr, 0), (b.addr, 1)], "")).await;
    let on_a = &signed("01", 1);
    for _ in 0..3 {
        assert_eq!(
            get_with(broker.addr(), "/", Some(on_a)).await,
            (StatusCode::OK, None)
        );
    }
    let (_, fresh) = get_with(broker.addr(), "/", None).await;
    assert!(fresh.unwrap().starts_with("02."));
    assert_eq!((a.seen().len(), b.seen().len()), (3, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_removed_by_a_reload_moves_its_sessions() {
    let (a, b) = (Origin::start().await, Origin::start().await);
    let broker = InProcess::start(&ini(&[(a.addr, 1), (b.addr, 1)], "")).await;
    let on_b = &signed("02", 1);
    let on_a = &signed("01", 2);
    assert_eq!(
        get_with(broker.addr(), "/", Some(on_b)).await,
        (StatusCode::OK, None)
    );
    assert_eq!(
        get_with(broker.addr(), "/", Some(on_a)).await,
        (StatusCode::OK, None)
    );
    broker.reload(&ini(&[(a.addr, 1)], "")).await;
    // The session on 01 is kept across the reload; the one on 02 moves to 01.
    assert_eq!(
        get_with(broker.addr(), "/", Some(on_a)).await,
        (StatusCode::OK, None)
    );
    let (status, moved) = get_with(broker.addr(), "/", Some(on_b)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(moved.unwrap().starts_with("01."));
    assert_eq!((a.seen().len(), b.seen().len()), (3, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_with_one_configuration_agree_on_a_cookie() {
    let (a, b) = (Origin::start().await, Origin::start().await);
    let text = ini(&[(a.addr, 1), (b.addr, 1)], "");
    let (one, two) = (InProcess::start(&text).await, InProcess::start(&text).await);
    // Sessions made on the first broker, spread over both servers.
    let mut cookies = Vec::new();
    for _ in 0..4 {
        let (_, cookie) = get_with(one.addr(), "/", None).await;
        let cookie = cookie.unwrap();
        let header = format!("TOTVS_BROKER_SH_001={cookie}");
        get_with(one.addr(), "/", Some(&header)).await;
        cookies.push(cookie);
    }
    let first = served_n(&one, 8).await;
    // Each one through the second broker reaches the same server, and keeps its cookie.
    for (i, cookie) in cookies.iter().enumerate() {
        let header = format!("TOTVS_BROKER_SH_001={cookie}");
        assert_eq!(
            get_with(two.addr(), "/", Some(&header)).await,
            (StatusCode::OK, None)
        );
        let second = served_n(&two, i + 1).await;
        assert_eq!(second[i], first[2 * i], "{cookie}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_query_answers_count_sessions_per_server_and_moves() {
    let dead = dead_addr().await;
    let live = Origin::start().await;
    let broker = InProcess::start(&ini(&[(dead, 1), (live.addr, 1)], "")).await;
    // A session on 01, whose failed connect moves it to 02; then three sessions on 02 (01 is
    // in quarantine).
    let on_dead = &signed("01", 1);
    let (status, moved) = get_with(broker.addr(), "/", Some(on_dead)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(moved.unwrap().starts_with("02."));
    for _ in 0..3 {
        let (_, cookie) = get_with(broker.addr(), "/", None).await;
        let header = format!("TOTVS_BROKER_SH_001={}", cookie.unwrap());
        get_with(broker.addr(), "/", Some(&header)).await;
    }
    let (status, _, json) = harness::get(broker.addr(), "/TOTVS_BROKER_QUERY/JSON").await;
    assert_eq!(status, StatusCode::OK);
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(json["servers"][1]["sessions"], 3, "{json:#}");
    assert_eq!(json["servers"][1]["sessions_max"], "3");
    assert_eq!(json["servers"][0]["sessions"], 0);
    assert_eq!(json["servers"][0]["sessions_max"], "1");
    assert_eq!(json["total"]["sessions"], 3);
    assert_eq!(json["totalSessionsHistory"], 4);
    assert_eq!(json["balanceMethod"], 4);
    assert_eq!(json["http"]["sessions_moved"], 1);
    let (_, _, metrics) = harness::get(broker.addr(), "/TOTVS_BROKER_QUERY/METRICS").await;
    let metrics = String::from_utf8_lossy(&metrics);
    let line = format!(
        "appbroker_http_sessions{{balancer=\"BALANCE_HTTP\",server=\"{}\"}} 3",
        live.addr
    );
    assert!(metrics.contains(&line), "{metrics}");
    assert!(
        metrics.contains("appbroker_http_sessions_moved_total{balancer=\"BALANCE_HTTP\"} 1"),
        "{metrics}"
    );
    let (_, _, page) = harness::get(
        broker.addr(),
        &format!("/TOTVS_BROKER_QUERY/ServerStatus/{}", live.addr),
    )
    .await;
    let page = String::from_utf8_lossy(&page);
    assert!(page.contains("Sessions (3, max 3)"), "{page}");
}

// ---- real clients: Chromium on the demo's page, curl with a cookie jar ---------------------

/// [`ini`] over the demo's two stand-in web servers, weight 1 each.
fn ini_over(servers: &[StandIn; 2], extra: &str) -> String {
    ini(&[(servers[0].address, 1), (servers[1].address, 1)], extra)
}

/// What `server` served, as its own record says.
fn resources(server: &StandIn) -> Vec<Resource> {
    let record = server.record().expect("a web stand-in");
    record.served().iter().map(|s| s.resource).collect()
}

/// No request a stand-in served carried the broker's cookie.
fn assert_no_broker_cookie(server: &StandIn) {
    for served in server.record().unwrap().served() {
        assert!(
            !served
                .cookie
                .as_deref()
                .unwrap_or_default()
                .contains("TOTVS_BROKER_SH_001"),
            "{served:?} reached {}",
            server.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium"]
async fn chromium_keeps_page_script_and_websocket_on_one_server_and_moves_when_it_stops() {
    let binary = find_chromium().expect("chromium on the PATH (apt-get install chromium)");
    let mut servers = web_stand_ins().await;
    let broker = InProcess::start(&ini_over(&servers, "")).await;
    let profile = tempfile::tempdir().unwrap();
    let url = format!("http://{}/", broker.addr());
    let mut browser = DevTools::open(&binary, profile.path(), &url).await;
    let echoed = |t: &str| t.contains("holds this WebSocket; echo: hello from the browser");
    let shown = browser.text_until("the WebSocket's echo", echoed).await;
    eprintln!("first load, the browser showed:\n{shown}\n");
    let cookie = browser
        .cookie("TOTVS_BROKER_SH_001")
        .await
        .expect("the browser holds the broker's cookie");
    let (held, other) = if cookie.starts_with("01.") {
        (0, 1)
    } else {
        (1, 0)
    };
    let name = servers[held].name.clone();
    for line in [
        format!("page: served by {name}"),
        format!("script: served by {name}"),
        format!("websocket: {name} holds this WebSocket"),
    ] {
        assert!(shown.contains(&line), "{line:?} not in:\n{shown}");
    }
    // The servers' own records: the page, its script and the WebSocket all on one server.
    let first = resources(&servers[held]);
    for wanted in [Resource::Page, Resource::Script, Resource::WebSocket] {
        assert!(first.contains(&wanted), "{wanted:?} not in {first:?}");
    }
    assert_eq!(resources(&servers[other]), []);

    // A second load in the same browser, its cookie brought back: the same server.
    browser.reload().await;
    harness::eventually("the second load's WebSocket", || {
        resources(&servers[held])
            .iter()
            .filter(|r| **r == Resource::WebSocket)
            .count()
            == 2
    })
    .await;
    let shown = browser.text_until("the second echo", echoed).await;
    assert!(
        shown.contains(&format!("page: served by {name}")),
        "{shown}"
    );
    assert_eq!(resources(&servers[other]), []);
    assert_eq!(
        browser.cookie("TOTVS_BROKER_SH_001").await.as_deref(),
        Some(cookie.as_str())
    );

    // Its server stopped: the page sees its WebSocket close; the next load moves to the
    // other server, with a new cookie naming it.
    servers[held].stop();
    browser
        .text_until("the WebSocket closed", |t| t.contains("(closed)"))
        .await;
    let before = resources(&servers[held]).len();
    browser.reload().await;
    harness::eventually("the moved load's WebSocket", || {
        resources(&servers[other]).contains(&Resource::WebSocket)
    })
    .await;
    let shown = browser.text_until("the echo after the move", echoed).await;
    eprintln!("after {name} stopped, the browser showed:\n{shown}\n");
    let moved_to = servers[other].name.clone();
    assert!(
        shown.contains(&format!("page: served by {moved_to}"))
            && shown.contains(&format!("script: served by {moved_to}"))
            && shown.contains(&format!("websocket: {moved_to} holds this WebSocket")),
        "{shown}"
    );
    let moved = browser
        .cookie("TOTVS_BROKER_SH_001")
        .await
        .expect("the browser holds a cookie");
    eprintln!("cookie before: {cookie}; after: {moved}");
    assert_ne!(moved, cookie);
    assert!(moved.starts_with(&format!("0{}.", other + 1)), "{moved}");
    let second = resources(&servers[other]);
    for wanted in [Resource::Page, Resource::Script, Resource::WebSocket] {
        assert!(second.contains(&wanted), "{wanted:?} not in {second:?}");
    }
    assert_eq!(resources(&servers[held]).len(), before);
    for server in &servers {
        assert_no_broker_cookie(server);
    }
}

/// `curl` on the PATH; under `CI` its absence fails the test.
fn find_curl() -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("curl"))
        .find(|candidate| candidate.is_file())
        .expect("curl on the PATH (apt-get install curl)")
}

/// The broker's cookie as curl's jar (Netscape format) holds it: (its line's fields, the
/// value).
fn jar_cookie(jar: &std::path::Path) -> Option<(Vec<String>, String)> {
    let text = std::fs::read_to_string(jar).ok()?;
    let line = text
        .lines()
        .find(|l| l.split('\t').nth(5) == Some("TOTVS_BROKER_SH_001"))?;
    let fields: Vec<String> = line.split('\t').map(str::to_string).collect();
    let value = fields.last()?.clone();
    Some((fields, value))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl"]
async fn curl_with_a_cookie_jar_stays_on_one_server() {
    let curl = find_curl();
    let (a, b) = (Origin::start().await, Origin::start().await);
    let broker = InProcess::start(&ini(&[(a.addr, 1), (b.addr, 1)], "")).await;
    let dir = tempfile::tempdir().unwrap();
    let jar = dir.path().join("jar");
    let jar_arg = jar.to_str().unwrap();
    let mut values = Vec::new();
    // Six curl processes, so six connections, each reading and writing the jar.
    for i in 0..6 {
        let url = format!("http://{}/page/{i}", broker.addr());
        let output = harness::within(
            "curl",
            tokio::process::Command::new(&curl)
                .args(["-sS", "--fail", "--max-time", "10"])
                .args(["-c", jar_arg, "-b", jar_arg, &url])
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap();
        assert!(
            output.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let (fields, value) = jar_cookie(&jar).expect("the jar holds TOTVS_BROKER_SH_001");
        // `#HttpOnly_` marks an HttpOnly cookie; path /, not secure, no expiry (a session
        // cookie).
        assert_eq!(
            fields[0],
            format!("#HttpOnly_{}", broker.addr().ip()),
            "{fields:?}"
        );
        assert_eq!(fields[2..5], ["/", "FALSE", "0"], "{fields:?}");
        values.push(value);
    }
    let value = &values[0];
    assert!(values.iter().all(|v| v == value), "{values:?}");
    assert_cookie_shape(value);
    let id = &value[..2];
    assert!(["01", "02"].contains(&id), "{value}");
    // All six on the server the cookie names; none of them brought it to the server.
    let servers = served_n(&broker, 6).await;
    let named = if id == "01" { a.addr } else { b.addr };
    assert!(
        servers.iter().all(|s| *s == named.to_string()),
        "{servers:?}"
    );
    let seen: Vec<_> = a.seen().into_iter().chain(b.seen()).collect();
    assert_eq!(seen.len(), 6);
    assert!(
        seen.iter().all(|s| s.headers.get(COOKIE).is_none()),
        "a cookie reached a server"
    );
}

// ---- session lifetime through the broker: WebSocket pin, expiry, the cap ------------------

/// A new session: a first request without a cookie, then one bringing it back. Its value.
async fn new_session(broker: &InProcess) -> String {
    let (_, cookie) = get_with(broker.addr(), "/", None).await;
    let cookie = cookie.expect("a first answer sets the cookie");
    let header = format!("TOTVS_BROKER_SH_001={cookie}");
    assert_eq!(
        get_with(broker.addr(), "/", Some(&header)).await,
        (StatusCode::OK, None)
    );
    cookie
}

/// Polls the JSON answer until `wanted` holds; the answer.
async fn json_until(
    broker: &InProcess,
    what: &str,
    wanted: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let every = std::time::Duration::from_millis(50);
    harness::poll(what, every, harness::DEADLINE, async || {
        let answer = harness::query_json(broker.addr()).await;
        if wanted(&answer) {
            Ok(answer)
        } else {
            Err(format!("{answer:#}"))
        }
    })
    .await
}

/// The live sessions per server (01, 02) and in all, from the JSON answer.
fn live(answer: &serde_json::Value) -> (u64, u64, u64) {
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    (
        n(&answer["servers"][0]["sessions"]),
        n(&answer["servers"][1]["sessions"]),
        n(&answer["total"]["sessions"]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_websocket_keeps_its_session_past_the_timeout_and_idle_ones_expire() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let servers = web_stand_ins().await;
    let broker = InProcess::start(&ini_over(&servers, "SESSION_TIMEOUT=1s")).await;
    // Session A, then a WebSocket of it.
    let a = new_session(&broker).await;
    let stream = tokio::net::TcpStream::connect(broker.addr()).await.unwrap();
    let url = format!("ws://{}/demo/ws", broker.addr());
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert(COOKIE, format!("TOTVS_BROKER_SH_001={a}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    ws.send(Message::text("ping")).await.unwrap();
    let echo = harness::within("the echo", ws.next())
        .await
        .unwrap()
        .unwrap();
    let holder = if a.starts_with("01.") { 0 } else { 1 };
    assert_eq!(
        echo,
        Message::text(format!(
            "{} holds this WebSocket; echo: ping",
            servers[holder].name
        ))
    );
    // Session C, made after A's last request, on the other server (the fewest sessions).
    let c = new_session(&broker).await;
    assert_ne!(c[..2], a[..2], "{a} {c}");
    // C ends after a second without a request; A, idle as long, is kept by its WebSocket.
    let answer = json_until(&broker, "C's end", |j| live(j).2 <= 1).await;
    let mut expected = (0, 0, 1);
    if holder == 0 {
        expected.0 = 1;
    } else {
        expected.1 = 1;
    }
    assert_eq!(live(&answer), expected, "{answer:#}");
    assert_eq!(answer["totalSessionsHistory"], 2);
    // The expired cookie still names its server: served there, not set anew, a session again.
    let header = format!("TOTVS_BROKER_SH_001={c}");
    assert_eq!(
        get_with(broker.addr(), "/", Some(&header)).await,
        (StatusCode::OK, None)
    );
    let c_record = servers[1 - holder].record().unwrap().served();
    assert_eq!(c_record.len(), 3, "{c_record:?}");
    assert_eq!(
        harness::query_json(broker.addr()).await["totalSessionsHistory"],
        3
    );
    // The WebSocket closed, A ends a timeout later too.
    ws.close(None).await.unwrap();
    while ws.next().await.is_some() {}
    drop(ws);
    json_until(&broker, "every session's end", |j| live(j) == (0, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_http_max_sessions_the_oldest_idle_is_forgotten_and_keeps_its_server() {
    let (a, b) = (Origin::start().await, Origin::start().await);
    let broker = InProcess::start(&ini(&[(a.addr, 1), (b.addr, 1)], "HTTP_MAX_SESSIONS=3")).await;
    let mut cookies = Vec::new();
    for _ in 0..5 {
        cookies.push(new_session(&broker).await);
    }
    let answer = harness::query_json(broker.addr()).await;
    assert_eq!(answer["total"]["sessions"], 3, "{answer:#}");
    assert_eq!(answer["totalSessionsHistory"], 5, "{answer:#}");
    // The oldest, forgotten, still reaches the server its cookie names, and keeps its cookie.
    let oldest = &cookies[0];
    let header = format!("TOTVS_BROKER_SH_001={oldest}");
    assert_eq!(
        get_with(broker.addr(), "/", Some(&header)).await,
        (StatusCode::OK, None)
    );
    // Eleven requests to servers, and the JSON query (served by no server) between.
    let servers: Vec<String> = served_n(&broker, 12)
        .await
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    let named = if oldest.starts_with("01.") {
        a.addr
    } else {
        b.addr
    };
    assert_eq!(servers[10], named.to_string(), "{oldest}");
    assert_eq!(servers[1], named.to_string(), "{oldest}");
    // A session again (the next oldest idle forgotten for it): still three.
    let answer = harness::query_json(broker.addr()).await;
    assert_eq!(answer["total"]["sessions"], 3, "{answer:#}");
    assert_eq!(answer["totalSessionsHistory"], 6, "{answer:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_says_sessions_moved_in_its_language() {
    for (language, one, two) in [
        ("en", "1 session moved", "2 sessions moved"),
        ("pt-BR", "1 sessão movida", "2 sessões movidas"),
    ] {
        let mut servers = web_stand_ins().await;
        let text = ini_over(&servers, "")
            .replace("[General]\n", &format!("[General]\nLANGUAGE={language}\n"));
        let broker = InProcess::start(&text).await;
        // Two sessions on 01; then 01 stops, and each moves to 02 at its next request.
        let cookies: Vec<String> = (0..2).map(|i| signed("01", i)).collect();
        for cookie in &cookies {
            assert_eq!(
                get_with(broker.addr(), "/", Some(cookie)).await,
                (StatusCode::OK, None)
            );
        }
        servers[0].stop();
        for (cookie, shown) in cookies.iter().zip([one, two]) {
            let (_, moved) = get_with(broker.addr(), "/", Some(cookie)).await;
            assert!(moved.unwrap().starts_with("02."));
            let (_, _, page) = harness::get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS").await;
            let page = String::from_utf8_lossy(&page).into_owned();
            let start = page.find("<p class='summary'>").expect("the summary");
            let summary = &page[start..start + page[start..].find("</p>").unwrap()];
            assert!(summary.contains(shown), "{language}: {summary}");
            if language != "en" {
                assert!(!summary.contains("moved"), "{summary}");
            }
        }
    }
}
