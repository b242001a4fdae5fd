//! Operating from the browser (`/TOTVS_BROKER_QUERY/ADMIN`), as users and attackers would: off
//! without `ADMIN_USERS`; a user of a real htpasswd file (`htpasswd -B`) disables and enables
//! a server through the page's confirmation and its form, and `ctl show`, the JSON and the log
//! agree; every forged or unsigned action refused with its status and nothing changed; plain
//! HTTP refused from an address off this host, directly or through a front's PROXY protocol
//! header; ADMIN's answers unframeable and unstored, the public pages unchanged; a thousand
//! wrong passwords slowed, logged once, while the user signs in from another address; wrong
//! passwords from thousands of addresses while a signed-in user goes on at once and every
//! sign-in is answered within its bounds; a restart and its cooldown; an HTTP
//! balancer's page; release of an operator's and of the monitor's quarantine; cut, of that
//! server's clients only; a client whose sign-in waited counted once; a reload reading the
//! users again; `--check` refusing an MD5 file; Chromium signing in and clicking disable, and
//! the screenshots at 1280 and 390 px.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use harness::*;
use serde_json::Value;

/// The page's path.
const ADMIN: &str = "/TOTVS_BROKER_QUERY/ADMIN";

/// The tests' session secret, so a test can sign a token as the broker would.
const SECRET: &str = "a session secret of thirty-two characters or more";

/// An htpasswd file of bcrypt entries made by the real `htpasswd -B` (apache2-utils):
/// `ana` / `right horse`, `bob` / `bobs password`.
fn users_file(dir: &Path) -> PathBuf {
    users_file_of_cost(dir, 5)
}

/// The same, its hashes of bcrypt's `cost` (`htpasswd -B -C`; 5 is its default).
fn users_file_of_cost(dir: &Path, cost: u32) -> PathBuf {
    let path = dir.join("users");
    for (i, (user, password)) in [("ana", "right horse"), ("bob", "bobs password")]
        .iter()
        .enumerate()
    {
        let mut command = Command::new("htpasswd");
        command.arg("-B").arg("-b").arg("-C").arg(cost.to_string());
        if i == 0 {
            command.arg("-c");
        }
        command.arg(&path).arg(user).arg(password);
        let (code, out, err) = run_bounded(command);
        assert_eq!(
            code, 0,
            "htpasswd (apache2-utils) makes the users file: {out}{err}"
        );
    }
    path
}

/// `Basic` credentials of `user` and `password`.
fn basic(user: &str, password: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = format!("{user}:{password}").into_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    format!("Basic {out}")
}

/// The `[General]` lines of a broker whose page of actions is on, for the users in `users`.
fn general(users: &Path) -> String {
    format!("ADMIN_USERS={}\nSESSION_SECRET={SECRET}\n", users.display())
}

/// A TCP balancer over `servers` with `extra` keys ([`ini_for`]'s), its page of actions on
/// for the users in `users`.
fn admin_ini(servers: &[&TestServer], extra: &str, users: &Path) -> String {
    ini_for(servers, extra).replace("[General]\n", &format!("[General]\n{}", general(users)))
}

/// A request to the page: `method`, the path after ADMIN, its lines, its body.
fn request(method: &str, target: &str, lines: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut text = format!("{method} {ADMIN}{target} HTTP/1.1\r\nHost: broker.test\r\n");
    for (name, value) in lines {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" {
        text.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
        text.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    text.push_str("\r\n");
    text.push_str(body);
    text.into_bytes()
}

/// `ana`'s token, as the confirmation of disabling `server` carries it.
async fn token(addr: SocketAddr, authorization: &str, server: &str) -> String {
    let target = format!("?action=disable&server={server}");
    let page = raw_request(
        addr,
        &request("GET", &target, &[("Authorization", authorization)], ""),
    )
    .await;
    assert_eq!(page.status, 200, "{page:?}");
    let text = page.text();
    let at = text
        .find("name='token' value='")
        .expect("the confirmation carries the token");
    let rest = &text[at + "name='token' value='".len()..];
    rest[..rest.find('\'').unwrap()].to_string()
}

/// POSTs `form` with `lines` to `addr`'s page.
async fn post(addr: SocketAddr, lines: &[(&str, &str)], form: &str) -> Answer {
    raw_request(addr, &request("POST", "", lines, form)).await
}

/// Server `id`'s state as the JSON query gives it: (inquarantine, disabled by an operator).
async fn json_server(addr: SocketAddr, n: usize) -> Value {
    query_json(addr).await["servers"][n].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_admin_users_the_page_is_not_there() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "")).await;
    let answer = raw_request(broker.addr(), &request("GET", "", &[], "")).await;
    assert_eq!(answer.status, 404, "{answer:?}");
    assert!(answer.header("www-authenticate").is_none());
    let ana = basic("ana", "right horse");
    let form = "action=disable&server=01&token=x";
    let answer = post(broker.addr(), &[("Authorization", &ana)], form).await;
    assert_eq!(answer.status, 404, "{answer:?}");
    assert!(broker.state().servers[0].overrides.hold.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_disables_and_enables_a_server_and_ctl_and_the_json_agree() {
    let dir = tempfile::tempdir().unwrap();
    let users = users_file(dir.path());
    let receiver = WebhookReceiver::start().await;
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let alerts = format!("ALERT_WEBHOOK=http://127.0.0.1:{}/", receiver.addr.port());
    let ini = admin_ini(&[&a, &b], &alerts, &users);
    let broker = Broker::start(&ini).await;
    let ana = basic("ana", "right horse");
    let token = token(broker.addr(), &ana, "02").await;
    let form = format!("action=disable&server=02&token={token}");
    let done = post(broker.addr(), &[("Authorization", &ana)], &form).await;
    assert_eq!(done.status, 303, "{done:?}");
    assert_eq!(
        done.header("location").as_deref(),
        Some("/TOTVS_BROKER_QUERY/ADMIN?done=disable&server=02")
    );
    let shown = ctl_show(&broker);
    assert_eq!(shown["servers"][1]["state"], "disabled", "{shown}");
    assert_eq!(
        shown["servers"][1]["overrides"]["hold"]["by"],
        "web:ana@127.0.0.1"
    );
    assert_eq!(json_server(broker.addr(), 1).await["disabled"], true);
    let page = raw_request(
        broker.addr(),
        &request(
            "GET",
            "?done=disable&server=02",
            &[("Authorization", &ana)],
            "",
        ),
    )
    .await;
    assert!(page.text().contains("disable 02: done"), "{page:?}");
    assert!(page.text().contains("10.") || page.text().contains("127.0.0.1"));
    broker.wait_for_log("disabled by web:ana@127.0.0.1").await;
    // Sent to alerts as ctl's are, with who asked.
    let alert = receiver.wait_for("server_disabled").await;
    assert_eq!(alert["who"], "web:ana@127.0.0.1", "{alert}");
    let form = format!("action=enable&server=02&token={token}");
    assert_eq!(
        post(broker.addr(), &[("Authorization", &ana)], &form)
            .await
            .status,
        303
    );
    assert_eq!(ctl_show(&broker)["servers"][1]["state"], "available");
    assert_eq!(json_server(broker.addr(), 1).await["disabled"], false);
    // Nothing of the credential is written anywhere.
    assert!(!broker.log_text().contains("right horse"));
    assert!(!broker.log_text().contains(ana.trim_start_matches("Basic ")));
    let state =
        std::fs::read_to_string(broker.dir.path().join("appserver.state")).unwrap_or_default();
    assert!(!state.contains("right horse"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_answers_are_never_framed_nor_stored_and_the_public_pages_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let users = users_file(dir.path());
    let a = TestServer::start("a").await;
    let ini = admin_ini(&[&a], "", &users);
    let broker = InProcess::start(&ini).await;
    let ana = basic("ana", "right horse");
    let signed = [("Authorization", ana.as_str())];
    for (what, target, lines) in [
        ("the page", "", &signed[..]),
        ("a confirmation", "?action=disable&server=01", &signed[..]),
        ("the challenge", "", &[][..]),
    ] {
        let answer = raw_request(broker.addr(), &request("GET", target, lines, "")).await;
        assert_eq!(
            answer.header("x-frame-options").as_deref(),
            Some("DENY"),
            "{what}"
        );
        assert_eq!(
            answer.header("content-security-policy").as_deref(),
            Some("frame-ancestors 'none'"),
            "{what}"
        );
        assert_eq!(
            answer.header("cache-control").as_deref(),
            Some("no-store"),
            "{what}"
        );
    }
    for public in ["/TOTVS_BROKER_QUERY/STATUS", "/TOTVS_BROKER_QUERY/JSON"] {
        let answer = raw_request(broker.addr(), &get_of(public)).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert!(answer.header("x-frame-options").is_none(), "{public}");
        assert!(
            answer.header("content-security-policy").is_none(),
            "{public}"
        );
        assert_eq!(
            answer.header("cache-control").as_deref(),
            Some("no-cache"),
            "{public}"
        );
    }
}

/// `ctl show --json`'s first balancer.
fn ctl_show(broker: &Broker) -> Value {
    let mut command = Command::new(binary());
    command
        .arg("ctl")
        .arg("--config")
        .arg(&broker.config_path)
        .args(["show", "--json"]);
    own_admin_dirs(&mut command, broker.dir.path());
    let (code, out, err) = run_bounded(command);
    assert_eq!(code, 0, "ctl show: {out}{err}");
    let answer: Value = serde_json::from_str(&out).unwrap();
    answer["balancers"][0].clone()
}

/// A token of `user` expired at `expires`, signed as the broker signs them (its label, under
/// [`SECRET`]).
fn expired_token(user: &str, expires: u64) -> String {
    use aws_lc_rs::hmac;
    let root = hmac::Key::new(hmac::HMAC_SHA256, SECRET.as_bytes());
    let label = hmac::sign(&root, b"appbroker ADMIN anti-forgery token v1");
    let key = hmac::Key::new(hmac::HMAC_SHA256, label.as_ref());
    let tag = hmac::sign(&key, format!("{user}\0{expires}").as_bytes());
    let hex: String = tag.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{expires}.{hex}")
}

/// A refused action: what it is, its request's lines, its form, and the status it gets.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, String, u16);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_unsigned_actions_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let users = users_file(dir.path());
    let a = TestServer::start("a").await;
    let ini = admin_ini(&[&a], "", &users);
    let broker = InProcess::start(&ini).await;
    let addr = broker.addr();
    let (ana, bob) = (basic("ana", "right horse"), basic("bob", "bobs password"));
    let ana_token = token(addr, &ana, "01").await;
    let bob_token = token(addr, &bob, "01").await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expired = expired_token("ana", now - 1);
    let with = |t: &str| format!("action=disable&server=01&token={t}");
    let auth = ("Authorization", ana.as_str());
    let wrong = basic("ana", "wrong horse");
    let eve = basic("eve", "x");
    let cases: Vec<Case> = vec![
        ("no credentials", vec![], with(&ana_token), 401),
        (
            "a wrong password",
            vec![("Authorization", &wrong)],
            with(&ana_token),
            401,
        ),
        (
            "a user the file does not name",
            vec![("Authorization", &eve)],
            with(&ana_token),
            401,
        ),
        (
            "no token",
            vec![auth],
            "action=disable&server=01".into(),
            403,
        ),
        // The token is checked before the fields: nothing of them is said to a forger.
        (
            "an unknown action without a token",
            vec![auth],
            "action=nuke&server=09&weight=x".into(),
            403,
        ),
        ("another user's token", vec![auth], with(&bob_token), 403),
        ("an expired token", vec![auth], with(&expired), 403),
        (
            "a foreign Origin",
            vec![auth, ("Origin", "http://evil.test")],
            with(&ana_token),
            403,
        ),
        (
            "a cross-site fetch",
            vec![auth, ("Sec-Fetch-Site", "cross-site")],
            with(&ana_token),
            403,
        ),
        (
            "an unknown action",
            vec![auth],
            format!("action=nuke&server=01&token={ana_token}"),
            400,
        ),
        (
            "an unknown server",
            vec![auth],
            format!("action=disable&server=09&token={ana_token}"),
            400,
        ),
        (
            "a bad weight",
            vec![auth],
            format!("action=weight&server=01&weight=x&token={ana_token}"),
            400,
        ),
        (
            "a weight out of range",
            vec![auth],
            format!("action=weight&server=01&weight=5000&token={ana_token}"),
            400,
        ),
        (
            "a restart without RESTART_COMMAND",
            vec![auth],
            format!("action=restart&server=01&token={ana_token}"),
            409,
        ),
    ];
    for (what, lines, form, status) in cases {
        let answer = post(addr, &lines, &form).await;
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        if status == 401 {
            assert!(
                answer
                    .header("www-authenticate")
                    .is_some_and(|v| v.starts_with("Basic")),
                "{what}: {answer:?}"
            );
        }
        let server = &broker.state().servers[0];
        assert!(
            server.overrides.hold.is_none() && server.overrides.weight.is_none(),
            "{what}"
        );
    }
    // The page's own origin and a same-origin fetch are the browser's normal form.
    let own = [
        auth,
        ("Origin", "http://broker.test"),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    assert_eq!(post(addr, &own, &with(&ana_token)).await.status, 303);
    assert!(broker.state().servers[0].overrides.hold.is_some());
}

/// An address of this host off loopback; `None` when it has none (the test is skipped,
/// which fails under CI).
fn off_loopback_or_skip() -> Option<IpAddr> {
    let ip = off_loopback_address();
    if ip.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no address off loopback under CI"
        );
        eprintln!("skipped: this host has no address off loopback");
    }
    ip
}

/// A broker of `a` listening on every address, with `extra` and its page of actions on (its
/// users file in `dir`).
async fn on_every_address(dir: &Path, a: &TestServer, extra: &str) -> InProcess {
    let users = users_file(dir);
    let ini = admin_ini(&[a], extra, &users).replace(
        "LOCAL_SERVER_ADDRESS=127.0.0.1",
        "LOCAL_SERVER_ADDRESS=0.0.0.0",
    );
    InProcess::start(&ini).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_is_refused_to_a_peer_off_loopback() {
    let Some(ip) = off_loopback_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start("a").await;
    let broker = on_every_address(dir.path(), &a, "").await;
    let ana = basic("ana", "right horse");
    let loopback = SocketAddr::new("127.0.0.1".parse().unwrap(), broker.addr().port());
    let token = token(loopback, &ana, "01").await;
    let off = SocketAddr::new(ip, broker.addr().port());
    let form = format!("action=disable&server=01&token={token}");
    let answer = post(off, &[("Authorization", &ana)], &form).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.text().contains("TLS"), "{answer:?}");
    assert!(
        answer.header("www-authenticate").is_none(),
        "no password asked in the clear"
    );
    assert!(broker.state().servers[0].overrides.hold.is_none());
    // The same from loopback acts.
    assert_eq!(
        post(loopback, &[("Authorization", &ana)], &form)
            .await
            .status,
        303
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_off_this_host_naming_a_loopback_client_is_no_loopback_peer() {
    let Some(ip) = off_loopback_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start("a").await;
    let broker = on_every_address(dir.path(), &a, "PROXY_PROTOCOL=1").await;
    let port = broker.addr().port();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let form = format!(
        "action=disable&server=01&token={}",
        expired_token("ana", now + 3600)
    );
    let ana = basic("ana", "right horse");
    // A front's header naming one of its own loopback clients, from `front`.
    let relayed = |front: IpAddr| {
        let form = form.clone();
        let ana = ana.clone();
        async move {
            let mut bytes = format!("PROXY TCP4 127.0.0.1 127.0.0.1 40000 {port}\r\n").into_bytes();
            bytes.extend(request("POST", "", &[("Authorization", &ana)], &form));
            let stream = tokio::net::TcpStream::connect(SocketAddr::new(front, port));
            let mut client = RawClient::on(stream.await.unwrap());
            assert!(client.send(&bytes).await);
            client.answer().await.expect("an answer")
        }
    };
    let answer = relayed(ip).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.text().contains("TLS"), "{answer:?}");
    assert!(broker.state().servers[0].overrides.hold.is_none());
    // The same from a front on this host acts.
    let answer = relayed("127.0.0.1".parse().unwrap()).await;
    assert_eq!(answer.status, 303, "{answer:?}");
}

/// GETs the page with a wrong password from `from` to `addr`: its status and how long it took.
async fn wrong_from(from: IpAddr, addr: SocketAddr) -> (u16, Duration) {
    let wrong = basic("ana", "wrong horse");
    let (answer, took) = page_from(from, addr, &wrong).await;
    (answer.status, took)
}

/// GETs the page with `authorization` from `from` to `addr`: the answer and how long it took.
async fn page_from(from: IpAddr, addr: SocketAddr, authorization: &str) -> (Answer, Duration) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // Thousands of these end in TIME_WAIT here: they must not keep another test's broker
    // from binding a port on every address.
    socket.set_reuseaddr(true).unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let mut client = RawClient::on(stream);
    let started = Instant::now();
    let lines = [("Authorization", authorization)];
    assert!(client.send(&request("GET", "", &lines, "")).await);
    let answer = client.answer().await.expect("an answer");
    (answer, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_wrong_passwords_are_slowed_and_logged_once_and_the_user_signs_in_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let users = users_file(dir.path());
    let a = TestServer::start("a").await;
    let ini = admin_ini(&[&a], "QUERY_MAX_CONNECTIONS=64", &users);
    let broker = Broker::start(&ini).await;
    let attacker: IpAddr = "127.0.0.7".parse().unwrap();
    let started = Instant::now();
    let mut statuses = Vec::new();
    // 1,000 guesses, 32 in flight at a time: the throttle queues a few and refuses the rest
    // at once, unchecked.
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let mut guesses = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        let turn = std::sync::Arc::clone(&in_flight)
            .acquire_owned()
            .await
            .unwrap();
        let addr = broker.addr();
        guesses.spawn(async move {
            let (status, _) = wrong_from(attacker, addr).await;
            drop(turn);
            status
        });
    }
    while let Some(status) = guesses.join_next().await {
        statuses.push(status.unwrap());
    }
    assert!(
        statuses.iter().all(|&s| s == 401),
        "the status never changes"
    );
    let (_, slowed) = wrong_from(attacker, broker.addr()).await;
    eprintln!(
        "{} wrong passwords from one address in {:?}; the next one took {slowed:?}",
        statuses.len(),
        started.elapsed()
    );
    assert!(
        slowed >= Duration::from_secs(1),
        "the next guess is slowed: {slowed:?}"
    );
    // The user, from another address, at once.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.8:0".parse().unwrap()).unwrap();
    let mut client = RawClient::on(socket.connect(broker.addr()).await.unwrap());
    let ana = basic("ana", "right horse");
    let asked = Instant::now();
    assert!(
        client
            .send(&request("GET", "", &[("Authorization", &ana)], ""))
            .await
    );
    let answer = client.answer().await.expect("an answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(broker.count_logs("failed sign-ins from 127.0.0.7"), 1);
    assert!(!broker.log_text().contains("wrong horse"));
}

/// Wrong passwords from `addresses` loopback addresses (`127.1.x.y`), `in_flight` at a time,
/// until `stop`: their statuses.
async fn attack(
    addr: SocketAddr,
    addresses: u32,
    in_flight: usize,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<u16> {
    let turns = std::sync::Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut guesses = tokio::task::JoinSet::new();
    for n in (0..addresses).cycle() {
        let turn = tokio::select! {
            turn = std::sync::Arc::clone(&turns).acquire_owned() => turn.unwrap(),
            () = stop.cancelled() => break,
        };
        let from = IpAddr::V4(std::net::Ipv4Addr::from(0x7f01_0001 + n));
        guesses.spawn(async move {
            let (status, _) = wrong_from(from, addr).await;
            drop(turn);
            status
        });
    }
    guesses.join_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_passwords_from_thousands_of_addresses_leave_sign_ins_bounded() {
    let dir = tempfile::tempdir().unwrap();
    // A costlier hash, as a careful operator's: the verifications are the bottleneck.
    let users = users_file_of_cost(dir.path(), 8);
    let a = TestServer::start("a").await;
    let ini = admin_ini(&[&a], "QUERY_MAX_CONNECTIONS=1024", &users);
    let broker = Broker::start(&ini).await;
    let (bob, ana) = (basic("bob", "bobs password"), basic("ana", "right horse"));
    let (bobs, anas): (IpAddr, IpAddr) =
        ("127.0.0.9".parse().unwrap(), "127.0.0.8".parse().unwrap());
    // Bob signed in before the attack, at the desk ana uses: his browser's credential is
    // remembered, and that desk is one users sign in from.
    assert_eq!(page_from(anas, broker.addr(), &bob).await.0.status, 200);
    // 3,000 addresses, 256 guesses in flight: far more than are checked at once.
    let stop = tokio_util::sync::CancellationToken::new();
    let attacker = tokio::spawn(attack(broker.addr(), 3000, 256, stop.clone()));
    let attacked = Instant::now();
    let (mut signed, mut busy) = (false, 0);
    while attacked.elapsed() < Duration::from_secs(12) {
        // Bob, signed in before, goes on working at once.
        let (page, took) = page_from(bobs, broker.addr(), &bob).await;
        assert_eq!(page.status, 200, "{page:?}");
        assert!(took < Duration::from_secs(1), "bob's page took {took:?}");
        // Ana signs in, each attempt answered within its bounds: checked, or busy at once.
        let (page, took) = page_from(anas, broker.addr(), &ana).await;
        assert!(took < Duration::from_secs(8), "ana's sign-in took {took:?}");
        match page.status {
            200 => signed = true,
            503 => {
                assert!(page.header("retry-after").is_some(), "{page:?}");
                busy += 1;
            }
            _ => panic!("{page:?}"),
        }
    }
    stop.cancel();
    let statuses = attacker.await.unwrap();
    let refused = statuses.iter().filter(|&&s| s == 503).count();
    eprintln!(
        "{} wrong passwords from 3,000 addresses in {:?}: {refused} answered busy; ana signed \
         in during it: {signed} ({busy} busy answers)",
        statuses.len(),
        attacked.elapsed()
    );
    assert!(statuses.iter().all(|&s| s == 401 || s == 503));
    assert!(
        refused > 0,
        "past the sign-ins waiting at once, attempts are answered busy"
    );
    // Ana's desk is one users signed in from: a place is kept for it.
    assert!(
        signed,
        "ana signed in during the attack ({busy} busy answers)"
    );
    // The attack over, ana signs in at once.
    let (page, took) = page_from(anas, broker.addr(), &ana).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(!broker.log_text().contains("right horse"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_signs_in_and_disables_a_server_then_enables_it() {
    let Some(chromium) = find_chromium() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is needed under CI"
        );
        eprintln!("skipped: no chromium");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let users = users_file(dir.path());
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let ini = admin_ini(&[&a, &b], "", &users);
    let broker = Broker::start(&ini).await;
    let url = format!("http://127.0.0.1:{}{ADMIN}", broker.addr().port());
    let profile = tempfile::tempdir().unwrap();
    let mut browser = DevTools::open(&chromium, profile.path(), "about:blank").await;
    // As typed in the browser's sign-in prompt: it keeps them for the site.
    let port = broker.addr().port();
    browser
        .go(&format!("http://ana:right%20horse@127.0.0.1:{port}{ADMIN}"))
        .await;
    browser
        .text_until("signed in", |t| t.contains("Signed in as ana"))
        .await;
    browser
        .evaluate(
            "document.querySelector(\"a[href*='action=disable'][href*='server=02']\").click()",
        )
        .await;
    browser
        .text_until("the confirmation", |t| t.contains("No new clients"))
        .await;
    browser
        .evaluate("document.querySelector('button[type=submit]').click()")
        .await;
    browser
        .text_until("the result", |t| t.contains("disable 02: done"))
        .await;
    assert_eq!(ctl_show(&broker)["servers"][1]["state"], "disabled");
    assert_eq!(json_server(broker.addr(), 1).await["disabled"], true);
    browser
        .evaluate("document.querySelector(\"a[href*='action=enable'][href*='server=02']\").click()")
        .await;
    browser
        .text_until("the confirmation", |t| {
            t.contains("takes new clients again")
        })
        .await;
    browser
        .evaluate("document.querySelector('button[type=submit]').click()")
        .await;
    browser
        .text_until("the result", |t| t.contains("enable 02: done"))
        .await;
    assert_eq!(ctl_show(&broker)["servers"][1]["state"], "available");
    // For the screenshots: 02 draining, as an operator leaves it before a restart.
    let ana = basic("ana", "right horse");
    let token = token(broker.addr(), &ana, "02").await;
    let form = format!("action=drain&server=02&token={token}");
    assert_eq!(
        post(broker.addr(), &[("Authorization", &ana)], &form)
            .await
            .status,
        303
    );
    for (width, name) in [(1280, "admin-page-1280.png"), (390, "admin-page-390.png")] {
        browser.go(&url).await;
        browser
            .text_until("the page", |t| t.contains("Signed in as ana"))
            .await;
        let png = browser.screenshot(width).await;
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .unwrap()
            .join(name);
        std::fs::write(&path, png).unwrap();
        eprintln!(
            "screenshot of the ADMIN page at {width} px: {}",
            path.display()
        );
        let overflow = browser
            .evaluate("document.documentElement.scrollWidth - window.innerWidth")
            .await;
        assert!(
            overflow.as_f64().unwrap_or(1.0) <= 0.0,
            "{width} px: scrolls sideways by {overflow}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_runs_then_its_cooldown_answers_409_saying_until_when() {
    let dir = tempfile::tempdir().unwrap();
    let users = users_file(dir.path());
    let receiver = WebhookReceiver::start().await;
    let a = TestServer::start("a").await;
    let extra = format!(
        "RESTART_COMMAND=true\nRESTART_COOLDOWN=600s\nALERT_WEBHOOK=http://127.0.0.1:{}/",
        receiver.addr.port()
    );
    let ini = admin_ini(&[&a], &extra, &users);
    let broker = InProcess::start(&ini).await;
    let ana = basic("ana", "right horse");
    let token = token(broker.addr(), &ana, "01").await;
    let form = format!("action=restart&server=01&token={token}");
    let ran = post(broker.addr(), &[("Authorization", &ana)], &form).await;
    assert_eq!(ran.status, 303, "{ran:?}");
    eventually("the restart recorded", || {
        broker.state().servers[0]
            .restarted
            .as_ref()
            .is_some_and(|r| r.exit == Some(0) && r.why.contains("web:ana@127.0.0.1"))
    })
    .await;
    // Sent to alerts as ctl's restart is, with who asked.
    let alert = receiver.wait_for("restart_ran").await;
    assert_eq!(alert["who"], "web:ana@127.0.0.1", "{alert}");
    assert_eq!(alert["id"], "01", "{alert}");
    // In cooldown: until when, in the page's words (it cannot force a restart as ctl can).
    let again = post(broker.addr(), &[("Authorization", &ana)], &form).await;
    assert_eq!(again.status, 409, "{again:?}");
    let text = again.text();
    assert!(
        text.contains("RESTART_COOLDOWN (600s)")
            && text.contains("this page can restart it again from 20"),
        "{again:?}"
    );
    let lines = [
        ("Authorization", ana.as_str()),
        ("Accept-Language", "pt-BR"),
    ];
    let em_portugues = post(broker.addr(), &lines, &form).await;
    assert_eq!(em_portugues.status, 409, "{em_portugues:?}");
    assert!(
        em_portugues
            .text()
            .contains("esta página pode reiniciá-lo de novo a partir de "),
        "{em_portugues:?}"
    );
    for answer in [&again, &em_portugues] {
        assert!(!answer.text().contains("--force"), "{answer:?}");
    }
}

/// A broker over `servers` whose page of actions is on (`extra` in its section), and `ana`'s
/// credentials and token.
async fn signed_in(
    servers: &[&TestServer],
    extra: &str,
    dir: &Path,
) -> (InProcess, String, String) {
    let users = users_file(dir);
    let ini = admin_ini(servers, extra, &users);
    let broker = InProcess::start(&ini).await;
    let ana = basic("ana", "right horse");
    let token = token(broker.addr(), &ana, "01").await;
    (broker, ana, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_ends_an_operators_quarantine_and_the_monitors() {
    use appbroker::balancer::operation::Operation;
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let extra = "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=200ms\nQUARANTINE_TIME=600s";
    let (broker, ana, token) = signed_in(&[&a, &b], extra, dir.path()).await;
    // An operator's quarantine (ctl's), which checks that pass do not end.
    let balancer = broker.broker.control().balancers()[0].clone();
    let server = balancer.find_server("01").unwrap();
    let asked = Operation::Quarantine {
        duration: Some("10m".into()),
        reason: Some("AppServer restart".into()),
    };
    balancer.operate(&server, asked, "uid 0").unwrap();
    let signed = (ana.as_str(), token.as_str());
    released(&broker, signed, ("01", &a.address()), Reason::Operator).await;
    assert!(broker.state().servers[0].quarantine.is_none());
    // The monitor's, of a server that stopped answering.
    b.stop().await;
    released(&broker, signed, ("02", &b.address()), Reason::Monitor).await;
}

/// Waits for `server`'s quarantine for `reason`, releases it from the page as `signed`
/// (credentials, token), and waits for its release by an operator.
async fn released(broker: &InProcess, signed: (&str, &str), server: (&str, &str), reason: Reason) {
    let ((authorization, token), (id, address)) = (signed, server);
    broker.events.wait_for_quarantine(address, reason).await;
    let form = format!("action=release&server={id}&token={token}");
    let done = post(broker.addr(), &[("Authorization", authorization)], &form).await;
    assert_eq!(done.status, 303, "{done:?}");
    broker
        .events
        .wait_for_release(address, Release::Operator)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_closes_that_servers_relayed_clients_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let (broker, ana, token) = signed_in(&[&a, &b], "", dir.path()).await;
    let (mut on_a, mut on_b) = (Vec::new(), Vec::new());
    while on_a.is_empty() || on_b.is_empty() {
        let (stream, name) = hold(broker.addr()).await;
        if name == "a" {
            on_a.push(stream);
        } else {
            on_b.push(stream);
        }
    }
    let form = format!("action=cut&server=01&token={token}");
    let done = post(broker.addr(), &[("Authorization", &ana)], &form).await;
    assert_eq!(done.status, 303, "{done:?}");
    for mut stream in on_a {
        assert_end_seen("a client of 01", &wait_end(&mut stream).await);
    }
    for stream in &mut on_b {
        assert_eq!(exchange(stream, "untouched").await.unwrap(), "b");
    }
}

/// An HTTP balancer over an origin (kept while the test runs), its page of actions on.
async fn http_broker(dir: &Path) -> (InProcess, Origin) {
    let users = users_file(dir);
    let origin = Origin::start().await;
    let ini = http_ini(&[origin.addr], "")
        .replace("[General]\n", &format!("[General]\n{}", general(&users)));
    (InProcess::start(&ini).await, origin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_sign_in_waited_its_turn_is_counted_accepted_once() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, _origin) = http_broker(dir.path()).await;
    let forward = b"GET /app HTTP/1.1\r\nHost: broker.test\r\n\r\n";
    let mut client = RawClient::on(tokio::net::TcpStream::connect(broker.addr()).await.unwrap());
    assert!(client.send(forward).await);
    assert_eq!(client.answer().await.expect("forwarded").status, 200);
    // Five failed sign-ins from this address, on other connections: the next one waits.
    for _ in 0..5 {
        assert_eq!(
            wrong_from("127.0.0.1".parse().unwrap(), broker.addr())
                .await
                .0,
            401
        );
    }
    let wrong = basic("ana", "wrong horse");
    let started = Instant::now();
    assert!(
        client
            .send(&request("GET", "", &[("Authorization", &wrong)], ""))
            .await
    );
    assert_eq!(client.answer().await.expect("an answer").status, 401);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "it waited its turn"
    );
    // The same client forwards again: one connection, counted once.
    assert!(client.send(forward).await);
    assert_eq!(client.answer().await.expect("forwarded again").status, 200);
    let status = query_json(broker.addr()).await;
    assert_eq!(status["totalConnectionsHistory"], 1, "{status:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_balancers_page_acts_on_its_own_servers() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, _origin) = http_broker(dir.path()).await;
    let ana = basic("ana", "right horse");
    let page = raw_request(
        broker.addr(),
        &request("GET", "", &[("Authorization", &ana)], ""),
    )
    .await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.text().contains("TOTVS Broker para HTTP") && page.text().contains("Signed in as"));
    let token = token(broker.addr(), &ana, "01").await;
    let form = format!("action=weight&server=01&weight=7&token={token}");
    assert_eq!(
        post(broker.addr(), &[("Authorization", &ana)], &form)
            .await
            .status,
        303
    );
    assert_eq!(broker.state().servers[0].weight, 7);
    // Signed out, the status page is the public one, with no action on it.
    let status = raw_request(broker.addr(), &get_of("/TOTVS_BROKER_QUERY/STATUS")).await;
    assert!(!status.text().contains("action="), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reads_the_users_again_and_forgets_every_sign_in() {
    let dir = tempfile::tempdir().unwrap();
    let users = users_file(dir.path());
    let a = TestServer::start("a").await;
    let ini = admin_ini(&[&a], "", &users);
    let broker = InProcess::start(&ini).await;
    let ana = basic("ana", "right horse");
    let get = |authorization: &str| request("GET", "", &[("Authorization", authorization)], "");
    assert_eq!(raw_request(broker.addr(), &get(&ana)).await.status, 200);
    // ana removed from the file: her browser's remembered sign-in no longer counts.
    let mut command = Command::new("htpasswd");
    command.arg("-D").arg(&users).arg("ana");
    assert_eq!(run_bounded(command).0, 0);
    broker.reload(&ini).await;
    assert_eq!(raw_request(broker.addr(), &get(&ana)).await.status, 401);
    let bob = basic("bob", "bobs password");
    assert_eq!(raw_request(broker.addr(), &get(&bob)).await.status, 200);
    // A file of another format: the page says to look at the log, and names no path.
    std::fs::write(&users, "bob:$apr1$abc$def\n").unwrap();
    broker.reload(&ini).await;
    let broken = raw_request(broker.addr(), &get(&bob)).await;
    assert_eq!(broken.status, 503, "{broken:?}");
    assert!(
        !broken.text().contains(&users.display().to_string()),
        "{broken:?}"
    );
}

#[test]
fn check_refuses_a_users_file_that_is_not_bcrypt_saying_how_to_make_one() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users");
    let mut command = Command::new("htpasswd");
    // `-m`: MD5, htpasswd's default on many systems.
    command
        .args(["-m", "-b", "-c"])
        .arg(&users)
        .args(["ana", "right horse"]);
    assert_eq!(run_bounded(command).0, 0);
    let ini = dir.path().join("appserver.ini");
    let text = format!(
        "[General]\nADMIN_USERS={}\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\n\
         REMOTE_SERVER_01=127.0.0.1 1234\n",
        users.display()
    );
    std::fs::write(&ini, text).unwrap();
    let (code, _, stderr) = run_cli(&["--check", "--config", ini.to_str().unwrap()]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("not a bcrypt entry") && stderr.contains("htpasswd -B -c"),
        "{stderr}"
    );
    assert!(!stderr.contains("right horse"));
}
