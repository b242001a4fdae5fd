//! The HTTP session cookie as an attacker and as real clients send it, through the
//! real broker: only cookies the broker signed count (forged ones reach no server an operator
//! took out and make no session), a rotation with `SESSION_SECRET_PREVIOUS` and a restart on
//! the generated secret keep sessions, the upgrade window honours the cookies of the version
//! before for one `SESSION_TIMEOUT`; and the `Cookie` header is read as bytes: whatever an
//! application's cookie holds, affinity holds and the broker's cookie never reaches a server
//! (raw servers of the test's own record the exact head they received).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use appbroker::balancer::rules::overrides::{Hold, Mode};
use appbroker::http_balancer::sessions::{CookieKeys, Kept, OwnSecret, Ticket};
use appbroker::tls::files::Passphrase;
use harness::{
    Broker, HttpConnection, HttpResponse, InProcess, Origin, SESSION_SECRET, http_get, raw_origin,
    read_head, run_cli, session_secret_line, signed_cookie, signed_cookie_for, signed_cookie_with,
    unbound_cookie_with, weighted_http_ini,
};
use tokio::io::AsyncWriteExt;

/// [`weighted_http_ini`] with the tests' `SESSION_SECRET`, over two loopback origins (ids 01 and 02).
async fn two_origins(extra: &str) -> (Origin, Origin, InProcess) {
    let (a, b) = (Origin::start().await, Origin::start().await);
    let text = weighted_http_ini(&session_secret_line(), &[(a.addr, 1), (b.addr, 1)], extra);
    let broker = InProcess::start(&text).await;
    (a, b, broker)
}

/// One GET of `path` on a new connection, with `cookie` as the whole `Cookie` header.
async fn get(broker: SocketAddr, path: &str, cookie: Option<&str>) -> HttpResponse {
    let headers: Vec<(&str, &str)> = cookie.map(|c| ("Cookie", c)).into_iter().collect();
    http_get(broker, path, &headers).await
}

/// Asks `addr` with the `old` cookie every 100 ms until the window that honours it has closed:
/// its answers set a cookie of 02 (the old cookie's server) until then, one starting with
/// `anew` after.
async fn window_closes(addr: SocketAddr, old: &str, anew: &str) {
    let every = std::time::Duration::from_millis(100);
    harness::poll(
        "the window to close",
        every,
        harness::DEADLINE,
        async || {
            let answer = get(addr, "/after", Some(old)).await;
            let set = set_cookie(&answer).expect("a cookie set either way");
            if set.starts_with(anew) {
                return Ok(());
            }
            assert!(set.starts_with("02."), "{set}");
            Err(set)
        },
    )
    .await
}

/// The broker's cookie an answer sets, if any.
fn set_cookie(answer: &HttpResponse) -> Option<String> {
    let line = answer.header("set-cookie")?;
    let value = line
        .strip_prefix("TOTVS_BROKER_SH_001=")
        .and_then(|rest| rest.split_once(';'))
        .map(|(value, _)| value.to_string());
    Some(value.unwrap_or_else(|| panic!("unexpected Set-Cookie {line}")))
}

/// True when `value` was signed with `secret` for `[BALANCE_HTTP]`.
fn signed_with(secret: &str, value: &str) -> bool {
    let keys = CookieKeys::new(secret.as_bytes(), None, None);
    Ticket::parse(value.as_bytes()).is_some_and(|t| keys.verify("BALANCE_HTTP", &t))
}

/// Paths each origin served, in order.
fn paths(origin: &Origin) -> Vec<String> {
    origin.seen().into_iter().map(|s| s.target).collect()
}

/// A cookie of the right form for server `id` that no secret signed: forged, or what the
/// broker set before cookies were signed. One per `n`.
fn forged(id: &str, n: usize) -> String {
    format!("TOTVS_BROKER_SH_001={id}.{n:0>22}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_cookie_never_reaches_a_disabled_server_and_is_never_a_session() {
    let (a, b, broker) = two_origins("").await;
    // An operator takes 02 out: compromised, keep users off.
    let balancer = broker.broker.control().balancers()[0].clone();
    let server = balancer.find_server("02").unwrap();
    balancer.hold(
        &server,
        Hold {
            mode: Mode::Disabled,
            reason: "compromised".into(),
            by: "the test".into(),
            since_wall_ms: 0,
        },
    );
    // Five forged cookies naming it, each sent twice (a value brought back is a session).
    for n in 0..5 {
        for round in 0..2 {
            let answer = get(
                broker.addr(),
                &format!("/forged/{n}/{round}"),
                Some(&forged("02", n)),
            )
            .await;
            assert_eq!(answer.status, 200);
            let set = set_cookie(&answer).expect("balanced as without a cookie: a new one set");
            assert!(
                set.starts_with("01.") && signed_with(SESSION_SECRET, &set),
                "{set}"
            );
        }
    }
    assert_eq!(
        paths(&b),
        Vec::<String>::new(),
        "the disabled server was reached"
    );
    assert_eq!(paths(&a).len(), 10);
    let answer = harness::query_json(broker.addr()).await;
    assert_eq!(answer["total"]["sessions"], 0, "{answer:#}");
    assert_eq!(answer["totalSessionsHistory"], 0, "{answer:#}");
    // A cookie the broker signed for 02 still goes there: a disabled server keeps its
    // sessions, as before.
    let answer = get(
        broker.addr(),
        "/signed",
        Some(&format!("TOTVS_BROKER_SH_001={}", signed_cookie("02", 1))),
    )
    .await;
    assert_eq!((answer.status, set_cookie(&answer)), (200, None));
    assert_eq!(paths(&b), ["/signed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_forged_cookies_on_one_connection_make_no_session() {
    const FORGED: usize = 20_000;
    const BATCH: usize = 200;
    let (_a, _b, broker) = two_origins("LOG_REQUESTS=0").await;
    let mut connection = HttpConnection::connect(broker.addr()).await;
    // Pipelined in batches: the requests as fast as one connection carries them.
    for start in (0..FORGED).step_by(BATCH) {
        let mut requests = Vec::new();
        for n in start..start + BATCH {
            let id = if n % 2 == 0 { "01" } else { "02" };
            requests.extend_from_slice(
                format!(
                    "GET /status/200 HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {}\r\n\r\n",
                    forged(id, n)
                )
                .as_bytes(),
            );
        }
        connection.stream.write_all(&requests).await.unwrap();
        for n in start..start + BATCH {
            let answer = connection.read_response(false).await.unwrap();
            assert_eq!(answer.status, 200, "request {n}");
        }
    }
    let answer = harness::query_json(broker.addr()).await;
    assert_eq!(answer["totalSessionsHistory"], 0, "{answer:#}");
    assert_eq!(answer["total"]["sessions"], 0, "{answer:#}");
    assert_eq!(answer["servers"][0]["sessions"], 0, "{answer:#}");
    assert_eq!(answer["servers"][1]["sessions"], 0, "{answer:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_with_session_secret_previous_keeps_the_session() {
    const OLD: &str = "the secret before the rotation, 32 characters or more";
    const NEW: &str = "the secret after the rotation, 32 characters or more";
    let (a, b) = (Origin::start().await, Origin::start().await);
    let servers = [(a.addr, 1), (b.addr, 1)];
    let broker = InProcess::start(&weighted_http_ini(
        &format!("SESSION_SECRET={OLD}"),
        &servers,
        "",
    ))
    .await;
    let cookie = set_cookie(&get(broker.addr(), "/first", None).await).unwrap();
    let header = format!("TOTVS_BROKER_SH_001={cookie}");
    assert_eq!(
        set_cookie(&get(broker.addr(), "/again", Some(&header)).await),
        None
    );
    let (id, on) = if cookie.starts_with("01.") {
        ("01", &a)
    } else {
        ("02", &b)
    };
    // The new secret signs, the old one still counts: the session stays, signed anew.
    let reloaded = broker
        .reload(&weighted_http_ini(
            &format!("SESSION_SECRET={NEW}\nSESSION_SECRET_PREVIOUS={OLD}"),
            &servers,
            "",
        ))
        .await;
    let changes = reloaded.changes.join("; ");
    assert!(
        changes.contains("[General] SESSION_SECRET changed (not shown)"),
        "{changes}"
    );
    assert!(
        changes.contains("[General] SESSION_SECRET_PREVIOUS (empty) -> (set)"),
        "{changes}"
    );
    assert!(
        !changes.contains(OLD) && !changes.contains(NEW),
        "{changes}"
    );
    let answer = get(broker.addr(), "/rotated", Some(&header)).await;
    assert_eq!(answer.status, 200);
    let renewed = set_cookie(&answer).expect("signed anew with the new secret");
    assert!(
        renewed.starts_with(&format!("{id}.")) && signed_with(NEW, &renewed),
        "{renewed}"
    );
    let renewed_header = format!("TOTVS_BROKER_SH_001={renewed}");
    assert_eq!(
        set_cookie(&get(broker.addr(), "/renewed", Some(&renewed_header)).await),
        None
    );
    assert!(
        paths(on).ends_with(&["/again".into(), "/rotated".into(), "/renewed".into()]),
        "{:?}",
        paths(on)
    );
    // One session all along.
    let answer = harness::query_json(broker.addr()).await;
    assert_eq!(answer["total"]["sessions"], 1, "{answer:#}");
    assert_eq!(answer["totalSessionsHistory"], 1, "{answer:#}");
    // The old secret dropped: its cookies no longer count; the renewed one does.
    broker
        .reload(&weighted_http_ini(
            &format!("SESSION_SECRET={NEW}"),
            &servers,
            "",
        ))
        .await;
    assert_eq!(
        set_cookie(&get(broker.addr(), "/kept", Some(&renewed_header)).await),
        None
    );
    assert!(set_cookie(&get(broker.addr(), "/old", Some(&header)).await).is_some());
}

/// The broker's own secret as the secret file would give it, made `age_ms` ago.
fn own_secret_made(age_ms: u64) -> OwnSecret {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    OwnSecret {
        secret: Passphrase::new("an own secret of the upgrade window tests, 43c"),
        kept: Kept::Created("test.state.secret".into()),
        since_wall_ms: Some(now - age_ms),
        bound_since_wall_ms: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_window_honours_an_old_cookie_signing_it_anew_then_stops() {
    // 01 drains (weight 0); 02 holds a request in hand, so that a request balanced without
    // a cookie goes to 03: where an old cookie naming 02 lands says whether it was honoured.
    let (a, b, c) = (
        Origin::start().await,
        Origin::start().await,
        Origin::start().await,
    );
    let servers = [(a.addr, 0), (b.addr, 1), (c.addr, 1)];
    let text = |timeout: &str| {
        weighted_http_ini(
            &session_secret_line(),
            &servers,
            &format!("SESSION_TIMEOUT={timeout}"),
        )
    };
    let broker = InProcess::start_with(&text("60m"), |bound| {
        bound.with_own_secret(own_secret_made(0))
    })
    .await;
    let held = hold_on_02(&broker, &b).await;
    // In the window: honoured on 02, and signed anew for 02.
    let old = "TOTVS_BROKER_SH_001=02.q3VdAbCdEfGhIjKlMnOpQr";
    let answer = get(broker.addr(), "/old", Some(old)).await;
    assert_eq!(answer.status, 200);
    let anew = set_cookie(&answer).expect("signed anew");
    assert!(
        anew.starts_with("02.") && signed_with(SESSION_SECRET, &anew),
        "{anew}"
    );
    assert_eq!(paths(&b), ["/old"]);
    let header = format!("TOTVS_BROKER_SH_001={anew}");
    assert_eq!(
        set_cookie(&get(broker.addr(), "/anew", Some(&header)).await),
        None
    );
    assert_eq!(paths(&b), ["/old", "/anew"]);
    // Never for a server that takes no new clients: an old cookie naming the draining 01 is
    // no cookie.
    let answer = get(
        broker.addr(),
        "/drained",
        Some("TOTVS_BROKER_SH_001=01.q3VdAbCdEfGhIjKlMnOpQr"),
    )
    .await;
    assert!(set_cookie(&answer).unwrap().starts_with("03."));
    assert_eq!(
        (paths(&a).len(), paths(&c)),
        (0, vec!["/drained".to_string()])
    );
    // The old cookie never was a session: the held request's and the one signed anew are.
    assert_eq!(
        harness::query_json(broker.addr()).await["totalSessionsHistory"],
        2
    );
    // SESSION_TIMEOUT now a second: the window (a second after the start) closes, and the old
    // cookie is no cookie from then on.
    broker.reload(&text("1s")).await;
    window_closes(broker.addr(), old, "03.").await;
    release_02(&b, held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_opened_longer_than_a_session_timeout_ago_honours_nothing() {
    // 02 holds a request in hand: a request balanced without a cookie goes to 01.
    let (a, b) = (Origin::start().await, Origin::start().await);
    let servers = [(a.addr, 1), (b.addr, 1)];
    let broker = InProcess::start_with(
        &weighted_http_ini(&session_secret_line(), &servers, "SESSION_TIMEOUT=10m"),
        |bound| bound.with_own_secret(own_secret_made(11 * 60 * 1000)),
    )
    .await;
    let held = hold_on_02(&broker, &b).await;
    for n in 0..3 {
        let answer = get(broker.addr(), &format!("/old/{n}"), Some(&forged("02", n))).await;
        assert!(set_cookie(&answer).unwrap().starts_with("01."));
    }
    assert_eq!((paths(&a).len(), paths(&b).len()), (3, 0));
    // The held request's session only.
    assert_eq!(
        harness::query_json(broker.addr()).await["totalSessionsHistory"],
        1
    );
    release_02(&b, held).await;
}

/// Lets [`hold_on_02`]'s request answer; it must be a 200.
async fn release_02(b: &Origin, held: tokio::task::JoinHandle<HttpResponse>) {
    b.release(1);
    let answer = harness::within("the held request", held).await.unwrap();
    assert_eq!(answer.status, 200);
}

/// A request with a session on 02 held there until the test releases it (`b` is 02): 02 has
/// a request in hand, which a pick counts against it.
async fn hold_on_02(broker: &InProcess, b: &Origin) -> tokio::task::JoinHandle<HttpResponse> {
    let (addr, cookie) = (
        broker.addr(),
        format!("TOTVS_BROKER_SH_001={}", signed_cookie("02", 1)),
    );
    let held = tokio::spawn(async move { get(addr, "/hold", Some(&cookie)).await });
    harness::eventually("02 holding a request", || {
        b.held.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    held
}

// ---- through the binary: the generated secret and its file -----------------------------

/// An HTTP balancer over `servers` for the binary, without `SESSION_SECRET`.
fn binary_ini(general: &str, servers: &[(SocketAddr, u32)]) -> String {
    weighted_http_ini(general, servers, "").replace("SHUTDOWN_TIMEOUT=5", "SHUTDOWN_TIMEOUT=1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_generated_secret_keeps_the_session() {
    let (a, b) = (Origin::start().await, Origin::start().await);
    let mut broker = Broker::start(&binary_ini("", &[(a.addr, 1), (b.addr, 1)])).await;
    let line = broker
        .wait_for_log("session cookies are signed with a secret generated now and kept in")
        .await;
    let file = broker.dir.path().join("appserver.state.secret");
    assert!(line.contains(&file.display().to_string()), "{line}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{file:?}");
    let kept = std::fs::read_to_string(&file).unwrap();
    let cookie = set_cookie(&get(broker.addr(), "/first", None).await).unwrap();
    let header = format!("TOTVS_BROKER_SH_001={cookie}");
    assert_eq!(
        set_cookie(&get(broker.addr(), "/again", Some(&header)).await),
        None
    );

    broker.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(broker.wait_exit().await.success());
    let dir = std::mem::replace(&mut broker.dir, tempfile::tempdir().unwrap());
    let restarted = Broker::spawn_file(dir, broker.config_path.clone(), broker.ports.clone(), &[]);
    restarted.wait_for_log("broker ready").await;
    let line = restarted
        .wait_for_log("session cookies are signed with the secret kept in")
        .await;
    assert!(line.contains("the same SESSION_SECRET on both"), "{line}");
    let answer = get(restarted.addr(), "/restarted", Some(&header)).await;
    assert_eq!((answer.status, set_cookie(&answer)), (200, None));
    let on = if cookie.starts_with("01.") { &a } else { &b };
    assert_eq!(paths(on), ["/first", "/again", "/restarted"]);
    assert_eq!(
        std::fs::read_to_string(restarted.dir.path().join("appserver.state.secret")).unwrap(),
        kept
    );
    // The secret itself is never logged.
    let secret: serde_json::Value = serde_json::from_str(&kept).unwrap();
    let secret = secret["secret"].as_str().unwrap();
    assert!(!broker.log_text().contains(secret) && !restarted.log_text().contains(secret));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_state_file_or_a_secret_a_warning_says_sessions_move_on_restart() {
    let a = Origin::start().await;
    let broker = Broker::start(&binary_ini("STATE_FILE=0", &[(a.addr, 1)])).await;
    let line = broker
        .wait_for_log("session cookies are signed with a secret generated for this run only")
        .await;
    assert!(
        line.contains("WARN") && line.contains("STATE_FILE=0 and no SESSION_SECRET"),
        "{line}"
    );
    assert!(line.contains("set SESSION_SECRET to keep them"), "{line}");
    assert!(!broker.dir.path().join("appserver.state.secret").exists());
    // With the key set, the line says so, and the value appears nowhere.
    let secret = "a configured secret that must never be printed";
    let set = Broker::start(&binary_ini(
        &format!("STATE_FILE=0\nSESSION_SECRET={secret}"),
        &[(a.addr, 1)],
    ))
    .await;
    set.wait_for_log("session cookies are signed with SESSION_SECRET")
        .await;
    let cfg = get(set.addr(), "/TOTVS_BROKER_QUERY/CFG", None)
        .await
        .text();
    assert!(cfg.contains("(set)") && !cfg.contains(secret), "{cfg}");
    assert!(!set.log_text().contains(secret));
    // A cookie it signed is one a broker with the same key takes (a pair).
    let value = signed_cookie_with(secret, "01", 7);
    let answer = get(
        set.addr(),
        "/",
        Some(&format!("TOTVS_BROKER_SH_001={value}")),
    )
    .await;
    assert_eq!((answer.status, set_cookie(&answer)), (200, None));
}

#[test]
fn check_prints_a_secret_as_set_and_an_error_never_repeats_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("appserver.ini");
    let secret = "a configured secret that must never be printed";
    let text = weighted_http_ini(
        &format!("SESSION_SECRET={secret}"),
        &[("127.0.0.1:8080".parse().unwrap(), 1)],
        "",
    )
    .replace("@PORT@", "8000");
    std::fs::write(&path, &text).unwrap();
    let (code, stdout, stderr) = run_cli(&["--check", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("; SESSION_SECRET=(set) (a secret is never printed)"),
        "{stdout}"
    );
    assert!(!stdout.contains(secret) && !stderr.contains(secret));
    // The printout reads back (without the secret).
    let printed = dir.path().join("printed.ini");
    std::fs::write(&printed, &stdout).unwrap();
    let (code, _, stderr) = run_cli(&["--check", "--config", printed.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    std::fs::write(&path, text.replace(secret, "too-short-secret")).unwrap();
    let (code, _, stderr) = run_cli(&["--check", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("[General] SESSION_SECRET: the value (not shown) is 16 characters long; a secret needs at least 32"),
        "{stderr}"
    );
    assert!(!stderr.contains("too-short-secret"), "{stderr}");
}

// ---- the Cookie header as bytes -------------------------------------------------------------

/// A raw server that answers every request `200 ok` on a kept-alive connection and records
/// the exact head each one had.
async fn recording_server() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let heads: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let recorded = Arc::clone(&heads);
    let (addr, _) = raw_origin(move |mut stream, _| {
        let heads = Arc::clone(&recorded);
        async move {
            loop {
                let head = read_head(&mut stream).await;
                if !head.ends_with(b"\r\n\r\n") {
                    return;
                }
                heads.lock().unwrap().push(head);
                let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                if stream.write_all(answer).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, heads)
}

/// The values of the `cookie` lines of a recorded head, as bytes.
fn cookie_lines(head: &[u8]) -> Vec<Vec<u8>> {
    head.split(|&b| b == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            line[..colon]
                .eq_ignore_ascii_case(b"cookie")
                .then(|| line[colon + 1..].trim_ascii().to_vec())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_byte_in_another_cookie_keeps_affinity_and_the_broker_cookie_from_the_server() {
    let (one, one_heads) = recording_server().await;
    let (two, two_heads) = recording_server().await;
    let broker = InProcess::start(&weighted_http_ini(
        &session_secret_line(),
        &[(one, 1), (two, 1)],
        "LOG_REQUESTS=0",
    ))
    .await;
    let ours = format!("TOTVS_BROKER_SH_001={}", signed_cookie("02", 1));
    let mut connection = HttpConnection::connect(broker.addr()).await;
    let mut expected: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut ask = async |cookies: &[&[u8]], forwarded: &[&[u8]]| {
        let mut request = b"GET /b HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec();
        for cookie in cookies {
            request.extend_from_slice(b"Cookie: ");
            request.extend_from_slice(cookie);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"\r\n");
        connection.stream.write_all(&request).await.unwrap();
        let answer = connection.read_response(false).await.unwrap();
        let shown = String::from_utf8_lossy(&request).into_owned();
        assert_eq!(answer.status, 200, "{shown}");
        assert_eq!(answer.header("set-cookie"), None, "affinity lost: {shown}");
        forwarded.iter().map(|c| c.to_vec()).collect::<Vec<_>>()
    };
    // Every byte from 0x80 to 0xFF inside an application cookie, before and after ours.
    for byte in 0x80..=0xffu8 {
        let lang = [&b"lang=S"[..], &[byte], b"o"].concat();
        let before = [&lang[..], b"; ", ours.as_bytes(), b"; theme=dark"].concat();
        let after = [ours.as_bytes(), b"; x=", &[byte], b"; ", &lang[..]].concat();
        let kept_before = [&lang[..], b"; theme=dark"].concat();
        let kept_after = [&b"x="[..], &[byte], b"; ", &lang[..]].concat();
        expected.push(ask(&[&before], &[&kept_before]).await);
        expected.push(ask(&[&after], &[&kept_after]).await);
    }
    // Blanks around its name, commas of old clients, quotes, a header of its own.
    let utf8 = "nome=São Paulo".as_bytes();
    for (cookies, forwarded) in [
        (
            vec![format!("a=1; TOTVS_BROKER_SH_001 ={}", signed_cookie("02", 1)).into_bytes()],
            vec![b"a=1".to_vec()],
        ),
        (
            vec![format!("a=1, {ours}, b=2").into_bytes()],
            vec![b"a=1, b=2".to_vec()],
        ),
        (
            vec![format!("TOTVS_BROKER_SH_001=\"{}\"; b=2", signed_cookie("02", 1)).into_bytes()],
            vec![b"b=2".to_vec()],
        ),
        (
            vec![utf8.to_vec(), ours.clone().into_bytes()],
            vec![utf8.to_vec()],
        ),
        (vec![ours.clone().into_bytes()], vec![]),
    ] {
        let cookies: Vec<&[u8]> = cookies.iter().map(Vec::as_slice).collect();
        let forwarded: Vec<&[u8]> = forwarded.iter().map(Vec::as_slice).collect();
        expected.push(ask(&cookies, &forwarded).await);
    }
    drop(connection);
    let heads = two_heads.lock().unwrap().clone();
    assert!(
        one_heads.lock().unwrap().is_empty(),
        "a request left its session's server"
    );
    assert_eq!(heads.len(), expected.len());
    for (head, wanted) in heads.iter().zip(&expected) {
        assert!(
            !head.windows(19).any(|w| w == b"TOTVS_BROKER_SH_001"),
            "the broker's cookie reached the server: {}",
            String::from_utf8_lossy(head)
        );
        assert_eq!(
            &cookie_lines(head),
            wanted,
            "{}",
            String::from_utf8_lossy(head)
        );
    }
}

// ---- one client minting cookies in bulk ---------------------------------------------------

/// Sends `requests` (each `(cookie, client)`, the client named in `X-Forwarded-For` to a
/// broker that trusts the test as a proxy) pipelined on one connection in batches; the cookie
/// each answer sets (`None` when it sets none).
async fn pipelined(broker: SocketAddr, requests: &[(Option<String>, &str)]) -> Vec<Option<String>> {
    const BATCH: usize = 200;
    let mut connection = HttpConnection::connect(broker).await;
    let mut set = Vec::with_capacity(requests.len());
    for batch in requests.chunks(BATCH) {
        let mut bytes = Vec::new();
        for (cookie, client) in batch {
            let cookie = cookie
                .as_ref()
                .map(|c| format!("Cookie: TOTVS_BROKER_SH_001={c}\r\n"))
                .unwrap_or_default();
            bytes.extend_from_slice(
                format!(
                    "GET /status/200 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: {client}\r\n\
                     {cookie}\r\n"
                )
                .as_bytes(),
            );
        }
        connection.stream.write_all(&bytes).await.unwrap();
        for _ in batch {
            let answer = connection.read_response(false).await.unwrap();
            assert_eq!(answer.status, 200);
            set.push(set_cookie(&answer));
        }
    }
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_minted_in_bulk_by_one_client_move_new_sessions_by_its_cap_at_most() {
    const CAP: u64 = 4;
    const FLOOD: &str = "203.0.113.66";
    let (a, b) = (Origin::start().await, Origin::start().await);
    let extra = format!(
        "LOG_REQUESTS=0\nHTTP_TRUSTED_PROXIES=127.0.0.1\nHTTP_MAX_SESSIONS_PER_CLIENT={CAP}"
    );
    let text = weighted_http_ini(&session_secret_line(), &[(a.addr, 1), (b.addr, 1)], &extra);
    let broker = Broker::start(&text).await;
    // 2,000 requests without a cookie, each given a valid one; those naming 01 kept and each
    // brought back once, as the attack did.
    let mints: Vec<(Option<String>, &str)> = (0..2000).map(|_| (None, FLOOD)).collect();
    let for_01: Vec<(Option<String>, &str)> = pipelined(broker.addr(), &mints)
        .await
        .into_iter()
        .flatten()
        .filter(|c| c.starts_with("01."))
        .map(|c| (Some(c), FLOOD))
        .collect();
    assert!(
        for_01.len() >= 900,
        "{} of 2000 minted for 01",
        for_01.len()
    );
    let replayed = pipelined(broker.addr(), &for_01).await;
    assert!(
        replayed.iter().all(Option::is_none),
        "each a valid session cookie"
    );
    // At most the cap counted on 01, and said so by the JSON and the page.
    let answer = get(broker.addr(), "/TOTVS_BROKER_QUERY/JSON", None)
        .await
        .json();
    assert_eq!(answer["servers"][0]["sessions"], CAP, "{answer:#}");
    assert_eq!(answer["total"]["sessions"], CAP, "{answer:#}");
    let page = get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", None)
        .await
        .text();
    assert!(
        page.contains(&format!("<b>{CAP} active sessions</b>"))
            || page.contains(&format!("<b>{CAP} sessões ativas</b>")),
        "{page}"
    );
    let warned = broker
        .wait_for_log("HTTP_MAX_SESSIONS_PER_CLIENT (4) reached by client")
        .await;
    assert!(warned.contains(&format!("client={FLOOD}")), "{warned}");
    assert_eq!(
        broker.count_logs("HTTP_MAX_SESSIONS_PER_CLIENT (4) reached"),
        1
    );
    // 20 new browsers, each from an address of its own, a first request and one more: as if
    // the flood had added CAP sessions to 01, the first CAP go to 02, then they alternate.
    let mut on_01 = 0;
    for n in 1..=20 {
        let client = format!("198.51.100.{n}");
        let first = pipelined(broker.addr(), &[(None, client.as_str())]).await;
        let cookie = first[0].clone().expect("a cookie for a new browser");
        pipelined(broker.addr(), &[(Some(cookie.clone()), client.as_str())]).await;
        on_01 += usize::from(cookie.starts_with("01."));
    }
    eprintln!(
        "20 new browsers after the flood: {on_01} on 01, {} on 02",
        20 - on_01
    );
    assert!(
        (6..=10).contains(&on_01),
        "{on_01} of 20 new browsers on 01, where 8 would be as if the flood added {CAP}"
    );
    // The flood's sessions still hold their server (no new cookie), uncounted.
    let again = pipelined(broker.addr(), &for_01[..50]).await;
    assert!(again.iter().all(Option::is_none), "{again:?}");
    let answer = get(broker.addr(), "/TOTVS_BROKER_QUERY/JSON", None)
        .await
        .json();
    assert_eq!(
        answer["servers"][0]["sessions"],
        CAP + on_01 as u64,
        "{answer:#}"
    );
}

// ---- a cookie is bound to the balancer that issued it -----------------------------------

/// Two HTTP balancers, `[BALANCE_HTTP_PUBLIC]` on `@PORT@` and `[BALANCE_HTTP_INTERNAL]` on
/// `@PORT2@`, each over two origins of its own (ids 01 and 02: other AppServers), with the
/// tests' `SESSION_SECRET` and `extra` in each section.
fn public_and_internal(public: [&Origin; 2], internal: [&Origin; 2], extra: &str) -> String {
    let section = |name: &str, port: &str, origins: [&Origin; 2]| {
        format!(
            "[{name}]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT={port}\nQUERY_ALLOW=127.0.0.1\n\
             MONITORING_TYPE=DISABLED\n{extra}\nREMOTE_SERVER_01=127.0.0.1 {}\n\
             REMOTE_SERVER_02=127.0.0.1 {}\n",
            origins[0].addr.port(),
            origins[1].addr.port()
        )
    };
    format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n{}{}{}",
        session_secret_line(),
        section("BALANCE_HTTP_PUBLIC", "@PORT@", public),
        section("BALANCE_HTTP_INTERNAL", "@PORT2@", internal)
    )
}

/// A cookie `broker` issues for its server 02, asked for until it comes.
async fn minted_for_02(broker: SocketAddr) -> String {
    for n in 0..20 {
        let cookie = set_cookie(&get(broker, &format!("/mint/{n}"), None).await).unwrap();
        if cookie.starts_with("02.") {
            return cookie;
        }
    }
    panic!("no cookie for 02 in 20 requests");
}

/// Four origins: `[BALANCE_HTTP_PUBLIC]`'s 01 and 02, then `[BALANCE_HTTP_INTERNAL]`'s.
async fn four_origins() -> [Origin; 4] {
    [
        Origin::start().await,
        Origin::start().await,
        Origin::start().await,
        Origin::start().await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_minted_on_one_balancer_is_no_session_on_another() {
    let [pub_01, pub_02, int_01, int_02] = four_origins().await;
    let text = public_and_internal([&pub_01, &pub_02], [&int_01, &int_02], "");
    let broker = InProcess::start(&text).await;
    let public = minted_for_02(broker.addr()).await;
    // The operator takes INTERNAL's 02 out: compromised, keep users off.
    let internal = broker.broker.control().balancers()[1].clone();
    let server = internal.find_server("02").unwrap();
    internal.hold(
        &server,
        Hold {
            mode: Mode::Disabled,
            reason: "compromised".into(),
            by: "the test".into(),
            since_wall_ms: 0,
        },
    );
    let header = format!("TOTVS_BROKER_SH_001={public}");
    for n in 0..3 {
        let answer = get(broker.addr2(), &format!("/internal/{n}"), Some(&header)).await;
        assert_eq!(answer.status, 200);
        let set = set_cookie(&answer).expect("balanced as without a cookie");
        assert!(set.starts_with("01."), "{set}");
    }
    assert_eq!(
        paths(&int_02),
        Vec::<String>::new(),
        "the disabled server was reached"
    );
    assert_eq!(paths(&int_01).len(), 3);
    let answer = get(broker.addr2(), "/TOTVS_BROKER_QUERY/JSON", None)
        .await
        .json();
    assert_eq!(answer["totalSessionsHistory"], 0, "{answer:#}");
    // On its own balancer it is a session, on its own 02.
    let answer = get(broker.addr(), "/public", Some(&header)).await;
    assert_eq!((answer.status, set_cookie(&answer)), (200, None));
    assert!(paths(&pub_02).contains(&"/public".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_window_honours_another_balancers_cookie_and_the_earlier_form_lasts_its_window() {
    let [pub_01, pub_02, int_01, int_02] = four_origins().await;
    let text = |timeout: &str| {
        public_and_internal(
            [&pub_01, &pub_02],
            [&int_01, &int_02],
            &format!("SESSION_TIMEOUT={timeout}"),
        )
    };
    // Both upgrade windows open: unsigned cookies, and those of the earlier form.
    let mut own = own_secret_made(0);
    own.bound_since_wall_ms = own.since_wall_ms;
    let broker = InProcess::start_with(&text("60m"), move |bound| {
        bound.with_own_secret(own.clone())
    })
    .await;
    let public = minted_for_02(broker.addr()).await;
    // INTERNAL's 02 holds a request, so a request balanced without a cookie goes to its 01:
    // where PUBLIC's cookie lands says whether a window honoured it.
    let internal = broker.addr2();
    let held_cookie = format!(
        "TOTVS_BROKER_SH_001={}",
        signed_cookie_for(SESSION_SECRET, "BALANCE_HTTP_INTERNAL", "02", 1)
    );
    let held = tokio::spawn(async move { get(internal, "/hold", Some(&held_cookie)).await });
    harness::eventually("02 holding a request", || {
        int_02.held.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let answer = get(
        internal,
        "/bound",
        Some(&format!("TOTVS_BROKER_SH_001={public}")),
    )
    .await;
    assert!(set_cookie(&answer).unwrap().starts_with("01."));
    assert_eq!(paths(&int_01), ["/bound"]);
    // A cookie of the earlier form naming 02: the same session in its window, bound anew.
    let old = format!(
        "TOTVS_BROKER_SH_001={}",
        unbound_cookie_with(SESSION_SECRET, "02", 7)
    );
    let answer = get(internal, "/old", Some(&old)).await;
    let anew = set_cookie(&answer).expect("bound anew");
    let keys = CookieKeys::new(SESSION_SECRET.as_bytes(), None, None);
    let ticket = Ticket::parse(anew.as_bytes()).unwrap();
    assert!(anew.starts_with("02.") && keys.verify("BALANCE_HTTP_INTERNAL", &ticket));
    assert!(!keys.verify("BALANCE_HTTP_PUBLIC", &ticket));
    assert_eq!(paths(&int_02), ["/old"]);
    // SESSION_TIMEOUT now a second: the window closes, and the earlier form is no cookie.
    broker.reload(&text("1s")).await;
    window_closes(internal, &old, "01.").await;
    int_02.release(1);
    assert_eq!(
        harness::within("the held request", held)
            .await
            .unwrap()
            .status,
        200
    );
}

/// The binary on `servers` with the tests' `SESSION_SECRET`, on a fresh directory or, with
/// `earlier_state`, one where a broker left its state file (an upgrade).
fn started_where(servers: &[(SocketAddr, u32)], earlier_state: bool) -> Broker {
    let text = binary_ini(&session_secret_line(), servers);
    let dir = tempfile::tempdir().unwrap();
    let ports = harness::free_ports();
    let config = dir.path().join("appserver.ini");
    std::fs::write(
        &config,
        harness::fill_placeholders(&text, &ports, dir.path()),
    )
    .unwrap();
    if earlier_state {
        let state = "{\"appbroker_state\":1,\"written_epoch_ms\":0,\"servers\":[]}";
        std::fs::write(dir.path().join("appserver.state"), state).unwrap();
    }
    Broker::spawn_file(dir, config, ports, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_install_opens_no_window_for_unsigned_cookies_and_an_upgrade_does() {
    const WINDOW: &str = "an unsigned cookie naming a server that takes new clients is honoured";
    let (a, b) = (Origin::start().await, Origin::start().await);
    let servers = [(a.addr, 1), (b.addr, 1)];
    for earlier_state in [false, true] {
        let broker = started_where(&servers, earlier_state);
        broker.wait_for_log("broker ready").await;
        assert_eq!(
            broker.has_log(WINDOW),
            earlier_state,
            "{}",
            broker.log_text()
        );
        // 02 holds a request: a request balanced without a cookie goes to 01.
        let (addr, cookie) = (
            broker.addr(),
            format!("TOTVS_BROKER_SH_001={}", signed_cookie("02", 1)),
        );
        let held = tokio::spawn(async move { get(addr, "/hold", Some(&cookie)).await });
        harness::eventually("02 holding a request", || {
            b.held.load(std::sync::atomic::Ordering::SeqCst) == 1
        })
        .await;
        let answer = get(addr, "/unsigned", Some(&forged("02", 1))).await;
        let set = set_cookie(&answer).unwrap();
        let expected = if earlier_state { "02." } else { "01." };
        assert!(set.starts_with(expected), "{earlier_state}: {set}");
        b.release(1);
        assert_eq!(
            harness::within("the held request", held)
                .await
                .unwrap()
                .status,
            200
        );
        b.held.store(0, std::sync::atomic::Ordering::SeqCst);
    }
}
