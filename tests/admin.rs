//! Runtime administration through the real control socket and the real `appbroker ctl`:
//! disable, drain (and its wait), enable, weight, quarantine and release, cut, reload, the
//! overrides surviving a reload and a restart, a second broker and a stale socket,
//! permissions, and what a bad request gets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::*;
use nix::sys::signal::Signal;
use serde_json::Value;

/// `appbroker ctl --config <the broker's file> ARGS`, run to its end: (exit code, stdout,
/// stderr). The environment gives it the broker's directories, as the broker was given.
fn ctl(broker: &Broker, args: &[&str]) -> (i32, String, String) {
    run_bounded(ctl_command(broker, args))
}

fn ctl_command(broker: &Broker, args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("ctl")
        .arg("--config")
        .arg(&broker.config_path)
        .args(args);
    own_admin_dirs(&mut command, broker.dir.path());
    command
}

/// `ctl ARGS` that must succeed; its standard output.
fn ctl_ok(broker: &Broker, args: &[&str]) -> String {
    let (code, out, err) = ctl(broker, args);
    assert_eq!(code, 0, "ctl {args:?}: {out}{err}");
    out
}

/// The broker's balancer as `ctl show --json` gives it.
fn shown(broker: &Broker) -> Value {
    let out = ctl_ok(broker, &["show", "--json"]);
    let answer: Value = serde_json::from_str(&out).unwrap();
    answer["balancers"][0].clone()
}

/// Server `id` as `ctl show --json` gives it.
fn shown_server(broker: &Broker, id: &str) -> Value {
    let balancer = shown(broker);
    balancer["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .cloned()
        .unwrap()
}

/// The control socket the broker made.
fn socket_of(broker: &Broker) -> PathBuf {
    broker.dir.path().join("appserver.sock")
}

/// `n` clients' answers: the name of the server each reached.
async fn names(broker: &Broker, n: usize) -> Vec<String> {
    ask_many(broker.addr(), n).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_keeps_open_connections_and_sends_no_new_client() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = Broker::start(&ini_for(&[&a, &b], "")).await;
    let (mut held, first) = hold(broker.addr()).await;
    let id = if first == "a" { "01" } else { "02" };
    let out = ctl_ok(
        &broker,
        &[
            "disable",
            "SMART_CLIENT_DESKTOP",
            id,
            "--reason",
            "OS patch",
        ],
    );
    assert!(out.contains("disabled"), "{out}");
    // In words that agree with the count, in the answer and in the log.
    assert!(out.contains("its one open connection stays"), "{out}");
    broker
        .wait_for_log("no new clients, its one open connection stays")
        .await;
    assert!(
        names(&broker, 6).await.iter().all(|n| *n != first),
        "a new client reached the disabled server"
    );
    // The open connection carries on.
    assert_eq!(exchange(&mut held, "still there").await.unwrap(), first);
    let server = shown_server(&broker, id);
    assert_eq!(server["state"], "disabled");
    assert_eq!(server["connections"], 1);
    assert_eq!(server["overrides"]["hold"]["reason"], "OS patch");
    assert!(
        server["overrides"]["hold"]["by"]
            .as_str()
            .unwrap()
            .starts_with("uid ")
    );
    // The table says it for people, with the reason.
    let table = ctl_ok(&broker, &["show", "BALANCE_SMART_CLIENT_DESKTOP"]);
    assert!(
        table.contains("disabled by uid") && table.contains("OS patch"),
        "{table}"
    );
    // Logged once, with who and why.
    broker.wait_for_log("disabled by uid").await;
    assert_eq!(broker.count_logs("disabled by uid"), 1);
    assert!(broker.has_log("(OS patch)"));
    // The status JSON: disabled, with when and why, and not in quarantine.
    let status = query_json(broker.addr()).await;
    let s = server_json(&status, &held_address(&a, &b, &first)).unwrap();
    assert_eq!(s["disabled"], true, "{s:#}");
    assert_eq!(s["inquarantine"], false);
    assert_ne!(s["disabled_entry_time"], "-");
    assert!(
        s["disabled_reasons"].as_str().unwrap().contains("OS patch"),
        "{s:#}"
    );
    let metrics = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/METRICS", &[])
        .await
        .text();
    assert!(metrics.contains("appbroker_server_disabled{"), "{metrics}");

    // Enabled again: it takes clients again.
    ctl_ok(&broker, &["enable", "SMART_CLIENT_DESKTOP", id]);
    drop(held);
    let reached = names(&broker, 4).await;
    assert!(reached.contains(&first), "{reached:?}");
    assert_eq!(shown_server(&broker, id)["state"], "available");
}

/// The address of the server named `name` of the two.
fn held_address(a: &TestServer, b: &TestServer, name: &str) -> String {
    if name == "a" {
        a.address()
    } else {
        b.address()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_wait_returns_when_the_last_connection_ends() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = Broker::start(&ini_for(&[&a, &b], "")).await;
    // Two connections on a: b is held out while they are made.
    ctl_ok(&broker, &["disable", "SMART_CLIENT_DESKTOP", "02"]);
    let (first, _) = hold(broker.addr()).await;
    let (second, _) = hold(broker.addr()).await;
    ctl_ok(&broker, &["enable", "SMART_CLIENT_DESKTOP", "02"]);

    // A wait that times out says how many are left, and fails.
    let (code, _, err) = ctl(
        &broker,
        &[
            "drain",
            "SMART_CLIENT_DESKTOP",
            "01",
            "--wait",
            "--timeout",
            "100ms",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("still has 2 connections"), "{err}");

    let mut waiting: Child = ctl_command(
        &broker,
        &[
            "drain",
            "SMART_CLIENT_DESKTOP",
            "01",
            "--reason",
            "restart",
            "--wait",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    eventually("the drain to be shown", || {
        shown_server(&broker, "01")["state"] == "drain"
    })
    .await;
    assert!(names(&broker, 4).await.iter().all(|n| n == "b"));
    drop(first);
    eventually("one connection left on a", || {
        shown_server(&broker, "01")["connections"] == 1
    })
    .await;
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "drain --wait returned with a connection left"
    );
    drop(second);
    let status = until("drain --wait to return", async || {
        waiting.try_wait().unwrap().ok_or("")
    })
    .await;
    assert!(status.success());
    assert_eq!(shown_server(&broker, "01")["connections"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balancing_follows_an_operators_weight() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = Broker::start(&ini_for(&[&a, &b], "SORT_METHOD=ROUND_ROBIN")).await;
    ctl_ok(&broker, &["weight", "SMART_CLIENT_DESKTOP", "01", "3"]);
    let reached = names(&broker, 40).await;
    let on_a = reached.iter().filter(|n| *n == "a").count();
    assert_eq!(on_a, 30, "{reached:?}");
    let server = shown_server(&broker, "01");
    assert_eq!(
        (server["weight"].as_u64(), server["file_weight"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(server["overrides"]["weight"], 3);
    // Weight 0: none; `file`: the file's again.
    ctl_ok(
        &broker,
        &["weight", "SMART_CLIENT_DESKTOP", &a.address(), "0"],
    );
    assert!(names(&broker, 6).await.iter().all(|n| n == "b"));
    ctl_ok(&broker, &["weight", "SMART_CLIENT_DESKTOP", "01", "file"]);
    let reached = names(&broker, 10).await;
    assert_eq!(reached.iter().filter(|n| *n == "a").count(), 5);
    // Out of range: bad usage.
    let (code, _, err) = ctl(&broker, &["weight", "SMART_CLIENT_DESKTOP", "01", "1001"]);
    assert_eq!(code, 2, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_quarantine_outlasts_passing_checks_until_released() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = Broker::start(&ini_for(
        &[&a, &b],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=100ms",
    ))
    .await;
    ctl_ok(
        &broker,
        &["quarantine", "SMART_CLIENT_DESKTOP", "01", "10m"],
    );
    broker.wait_for_log("put in quarantine by uid").await;
    // Rounds pass with both servers answering: the quarantine stays.
    let rounds = broker.count_logs("monitor: ");
    broker.wait_for_logs("monitor: ", rounds + 3).await;
    let server = shown_server(&broker, "01");
    assert_eq!(server["state"], "quarantined");
    assert_eq!(server["quarantine"]["forced"], true);
    assert_eq!(server["quarantine"]["reason"], "operator");
    assert!(names(&broker, 4).await.iter().all(|n| n == "b"));
    let status = query_json(broker.addr()).await;
    assert_eq!(
        server_json(&status, &a.address()).unwrap()["inquarantine"],
        true
    );

    ctl_ok(&broker, &["release", "SMART_CLIENT_DESKTOP", "01"]);
    broker.wait_for_log("released by uid").await;
    assert_eq!(shown_server(&broker, "01")["state"], "available");
    assert!(names(&broker, 4).await.iter().any(|n| n == "a"));
    // Releasing again is no error, and says so.
    let out = ctl_ok(&broker, &["release", "SMART_CLIENT_DESKTOP", "01"]);
    assert!(out.contains("was not in quarantine"), "{out}");
}

/// The STATUS page's state cell of the server at `address`.
async fn state_on_the_page(broker: &Broker, address: &str) -> String {
    let html = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .text();
    let row = html
        .split("<tr>")
        .find(|row| row.contains(&format!("ServerStatus/{address}\"")))
        .unwrap_or_else(|| panic!("no row of {address}:\n{html}"));
    // Server, connections, quarantine, state.
    let cell = row.split("<td").nth(4).expect("the state cell");
    cell[..cell.find("</td>").unwrap()].to_string()
}

/// A healthy server an operator quarantines (after an outage it recovered from) is shown with
/// who asked and why, on the page, in `show` and the JSON, and after a restart: not with the
/// error of the outage, which would read as one still going on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_quarantine_says_who_and_why_not_the_last_error() {
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let mut broker = Broker::start(&ini_for(
        &[&a, &b],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=100ms",
    ))
    .await;
    a.stop().await;
    broker
        .wait_for_log(&format!("putting server {} in quarantine", a.address()))
        .await;
    a.resume().await;
    broker
        .wait_for_log(&format!(
            "releasing server {} from quarantine (monitor check passed)",
            a.address()
        ))
        .await;
    let healthy = state_on_the_page(&broker, &a.address()).await;
    assert!(
        !healthy.contains("refused"),
        "proved itself since: {healthy}"
    );

    ctl_ok(
        &broker,
        &[
            "quarantine",
            "SMART_CLIENT_DESKTOP",
            "01",
            "10m",
            "--reason",
            "AppServer restart",
        ],
    );
    let me = format!("uid {}", nix::unistd::getuid());
    broker
        .wait_for_log(&format!(
            "put in quarantine by {me} (AppServer restart) for 600s"
        ))
        .await;
    let asked = |broker: &Broker| {
        let server = shown_server(broker, "01");
        assert_eq!(server["quarantine"]["reason"], "operator", "{server:#}");
        server["quarantine"]["asked"].clone()
    };
    assert_eq!(
        asked(&broker),
        serde_json::json!({"by": me, "reason": "AppServer restart"})
    );
    let (_, shown, _) = ctl(&broker, &["show"]);
    assert!(
        shown.contains("operator's quarantine (operator) until ")
            && shown.contains(&format!(", asked by {me}: AppServer restart")),
        "{shown}"
    );
    let cell = state_on_the_page(&broker, &a.address()).await;
    assert!(
        cell.contains(&format!(" · asked by {me}: AppServer restart</small>"))
            && !cell.contains("refused"),
        "{cell}"
    );
    let status = query_json(broker.addr()).await;
    let server = server_json(&status, &a.address()).unwrap();
    assert_eq!(server["quarantine_asked"]["reason"], "AppServer restart");
    assert_eq!(server["last_error_current"], false, "{server:#}");

    // Kept over a restart, said to be from before it.
    broker.signal(Signal::SIGTERM);
    assert!(broker.wait_exit().await.success());
    let dir = std::mem::replace(&mut broker.dir, tempfile::tempdir().unwrap());
    let restarted = Broker::spawn_file(dir, broker.config_path.clone(), broker.ports.clone(), &[]);
    restarted.wait_for_log("broker ready").await;
    assert_eq!(
        asked(&restarted),
        serde_json::json!({"by": format!("{me} before the restart"), "reason": "AppServer restart"})
    );
    let cell = state_on_the_page(&restarted, &a.address()).await;
    assert!(
        cell.contains(&format!(
            "asked by {me} before the restart: AppServer restart"
        )),
        "{cell}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_closes_that_servers_connections_and_no_other() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = Broker::start(&ini_for(&[&a, &b], "")).await;
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    while on_a.len() < 2 || on_b.is_empty() {
        let (stream, name) = hold(broker.addr()).await;
        if name == "a" {
            on_a.push(stream);
        } else {
            on_b.push(stream);
        }
    }
    let out = ctl_ok(&broker, &["cut", "SMART_CLIENT_DESKTOP", "01"]);
    assert!(out.contains("2 connections cut"), "{out}");
    for stream in on_a {
        let mut stream = stream;
        let read = wait_end(&mut stream).await;
        assert_end_seen("a cut client", &read);
    }
    for stream in &mut on_b {
        assert_eq!(exchange(stream, "untouched").await.unwrap(), "b");
    }
    broker
        .wait_for_log("cutting its 2 open connections at the request of uid")
        .await;
    broker.wait_for_logs("ended_by=operator-cut", 2).await;
    // The server itself stays in the balancing.
    assert!(names(&broker, 4).await.iter().any(|n| n == "a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_answers_with_what_changed_or_every_error() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = Broker::start(&ini_for(&[&a], "")).await;
    let good = std::fs::read_to_string(&broker.config_path).unwrap();
    std::fs::write(
        &broker.config_path,
        format!("{good}REMOTE_SERVER_02={}\nMAX_ATTEMPTS=many\n", b.ini()),
    )
    .unwrap();
    let (code, out, err) = ctl(&broker, &["reload"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("MAX_ATTEMPTS") && err.contains("many"),
        "{err}"
    );
    assert!(err.contains("reload rejected"), "{err}");
    std::fs::write(
        &broker.config_path,
        format!("{good}REMOTE_SERVER_02={}\n", b.ini()),
    )
    .unwrap();
    let out = ctl_ok(&broker, &["reload", "--json"]);
    let answer: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["ok"], true);
    assert!(
        answer["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().contains("added as REMOTE_SERVER_02")),
        "{answer:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_survive_a_reload_and_a_restart() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let mut broker = Broker::start(&ini_for(&[&a, &b], "")).await;
    ctl_ok(
        &broker,
        &[
            "disable",
            "BALANCE_SMART_CLIENT_DESKTOP",
            "01",
            "--reason",
            "disk swap",
        ],
    );
    ctl_ok(&broker, &["weight", "SMART_CLIENT_DESKTOP", "02", "7"]);
    ctl_ok(&broker, &["reload"]);
    let check = |broker: &Broker| {
        let first = shown_server(broker, "01");
        assert_eq!(first["state"], "disabled", "{first:#}");
        assert_eq!(first["overrides"]["hold"]["reason"], "disk swap");
        let second = shown_server(broker, "02");
        assert_eq!(second["weight"], 7, "{second:#}");
    };
    check(&broker);

    // A restart: the state file brings them back before the first client.
    broker.signal(Signal::SIGTERM);
    assert!(broker.wait_exit().await.success());
    assert!(
        !socket_of(&broker).exists(),
        "the socket is removed at stop"
    );
    let dir = std::mem::replace(&mut broker.dir, tempfile::tempdir().unwrap());
    let restarted = Broker::spawn_file(dir, broker.config_path.clone(), broker.ports.clone(), &[]);
    restarted.wait_for_log("broker ready").await;
    assert!(restarted.has_log("restored from the state file: disabled (disk swap) by uid"));
    check(&restarted);
    assert!(names(&restarted, 4).await.iter().all(|n| n == "b"));
}

/// A broker over `server` started (not waited for) beside the state file `state`.
fn with_state_file(server: &TestServer, state: &str) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports();
    let config_path = dir.path().join("appserver.ini");
    std::fs::write(
        &config_path,
        fill_placeholders(&ini_for(&[server], ""), &ports, dir.path()),
    )
    .unwrap();
    std::fs::write(dir.path().join("appserver.state"), state).unwrap();
    Broker::spawn_file(dir, config_path, ports, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_state_file_is_reported_and_ignored() {
    let a = TestServer::start("a").await;
    let broker = with_state_file(&a, "{\"half\": [1, 2");
    broker.wait_for_log("broker ready").await;
    assert!(
        broker.has_log("is not one appbroker wrote"),
        "{}",
        broker.log_text()
    );
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_broker_refuses_a_live_socket_and_replaces_a_stale_one() {
    let a = TestServer::start("a").await;
    let mut broker = Broker::start(&ini_for(&[&a], "")).await;
    let socket = socket_of(&broker);
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // The same file again: the running broker's socket answers.
    let mut second = Command::new(binary());
    second.arg("--config").arg(&broker.config_path);
    own_admin_dirs(&mut second, broker.dir.path());
    let (code, out, err) = run_bounded(second);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        format!("{out}{err}").contains("another appbroker is running with the control socket"),
        "{out}{err}"
    );
    ctl_ok(&broker, &["show"]);

    // A broker that died without a word leaves its socket behind: the next one replaces it.
    broker.signal(Signal::SIGKILL);
    broker.wait_exit().await;
    assert!(socket.exists(), "SIGKILL leaves the socket file");
    let (code, _, err) = ctl(&broker, &["show"]);
    assert_eq!(code, 3, "no broker answers: {err}");
    assert!(err.contains("no broker answers"), "{err}");
    let dir = std::mem::replace(&mut broker.dir, tempfile::tempdir().unwrap());
    let next = Broker::spawn_file(dir, broker.config_path.clone(), broker.ports.clone(), &[]);
    next.wait_for_log("broker ready").await;
    assert!(next.has_log("replacing the stale control socket"));
    ctl_ok(&next, &["show"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_requests_get_a_clear_error_and_change_nothing() {
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&a], "")).await;
    let socket = socket_of(&broker);
    let stream = UnixStream::connect(&socket).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut ask_line = |line: &[u8]| {
        writer.write_all(line).unwrap();
        let mut answer = String::new();
        reader.read_line(&mut answer).unwrap();
        serde_json::from_str::<Value>(&answer).unwrap()
    };
    for bad in [
        &b"hello\n"[..],
        b"{\"command\":\"explode\"}\n",
        b"{\"command\":\"disable\",\"section\":\"SMART_CLIENT_DESKTOP\"}\n",
        b"{\"command\":\"disable\",\"section\":\"NOPE\",\"server\":\"01\"}\n",
        b"{\"command\":\"disable\",\"section\":\"SMART_CLIENT_DESKTOP\",\"server\":\"99\"}\n",
        b"\xff\xfe{}\n",
    ] {
        let answer = ask_line(bad);
        assert_eq!(answer["ok"], false, "{answer}");
        assert!(!answer["error"].as_str().unwrap().is_empty());
    }
    // The same connection still serves a good request.
    let answer = ask_line(b"{\"command\":\"show\"}\n");
    assert_eq!(answer["ok"], true);
    assert_eq!(answer["balancers"][0]["servers"][0]["state"], "available");

    // An endless line: an error, then the connection is closed.
    let mut stream = UnixStream::connect(&socket).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let _ = stream.write_all(&vec![b'x'; 64 * 1024]);
    let mut answer = String::new();
    let mut reader = BufReader::new(&stream);
    reader.read_line(&mut answer).unwrap();
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert!(
        answer["error"].as_str().unwrap().contains("longer than"),
        "{answer}"
    );
    let mut rest = String::new();
    assert_eq!(
        reader.read_line(&mut rest).unwrap_or(0),
        0,
        "closed after it"
    );

    // The broker is unaffected: nothing changed, clients are served, ctl works.
    assert_eq!(shown_server(&broker, "01")["state"], "available");
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_exit_codes_say_done_refused_usage_and_no_broker() {
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&a], "")).await;
    assert_eq!(ctl(&broker, &["show"]).0, 0);
    // A name that matches nothing: refused, with what there is.
    for args in [&["enable", "WEB_SERVICES", "01"][..], &["show", "desktop"]] {
        let (code, _, err) = ctl(&broker, args);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("no balancer {} is running", args[1]))
                && err.contains("the balancers are BALANCE_SMART_CLIENT_DESKTOP"),
            "{args:?}: {err}"
        );
    }
    let (code, _, err) = ctl(&broker, &["disable", "SMART_CLIENT_DESKTOP", "07"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("has no server 07") && err.contains("01 (127.0.0.1:"),
        "{err}"
    );
    assert_eq!(ctl(&broker, &["disable", "SMART_CLIENT_DESKTOP"]).0, 2);
    assert_eq!(ctl(&broker, &["frobnicate"]).0, 2);
    let (code, _, err) = run_cli(&["ctl", "--socket", "/nonexistent/appbroker.sock", "show"]);
    assert_eq!(code, 3, "{err}");
    // `ping` over the same socket.
    let mut ping = Command::new(binary());
    ping.arg("ping").arg("--config").arg(&broker.config_path);
    own_admin_dirs(&mut ping, broker.dir.path());
    assert_eq!(run_bounded(ping).0, 0);
    let mut ping = Command::new(binary());
    ping.args(["ping", "--config", "/nonexistent/appserver.ini"]);
    let (code, _, err) = run_bounded(ping);
    assert_eq!(code, 1, "{err}");
}

/// True when the test runs as root; otherwise says it skipped `why` (it must not pass
/// silently: under `CI`, which runs as root, it fails).
fn root_or_skip(why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI runs as root: this test must run there"
    );
    eprintln!("skipped: {why}");
    false
}

/// Who the test runs as may connect; a user created here may not (the socket is 0600).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_cannot_use_the_control_socket() {
    if !root_or_skip("creating a user needs root") {
        return;
    }
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&a], "")).await;
    let user = Throwaway::create();
    // The directory must let the user reach the socket at all: the socket's own mode decides.
    std::fs::set_permissions(broker.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = Command::new(binary());
    command
        .args(["ctl", "--socket"])
        .arg(socket_of(&broker))
        .arg("show");
    std::os::unix::process::CommandExt::uid(&mut command, user.uid);
    std::os::unix::process::CommandExt::gid(&mut command, user.gid);
    let (code, out, err) = run_bounded(command);
    assert_eq!(code, 3, "{out}{err}");
    assert!(err.contains("permission denied"), "{err}");
    ctl_ok(&broker, &["show"]);
}

/// `CONTROL_GROUP`: the socket is 0660 and the group's, and a member may use it; a group that
/// does not exist stops the start with its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_group_lets_its_members_in() {
    if !root_or_skip("creating a user needs root") {
        return;
    }
    let a = TestServer::start("a").await;
    let user = Throwaway::create();
    let ini = ini_for(&[&a], "").replace(
        "[General]\n",
        &format!("[General]\nCONTROL_GROUP={}\n", user.name),
    );
    let broker = Broker::start(&ini).await;
    std::fs::set_permissions(broker.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = socket_of(&broker);
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(std::os::unix::fs::MetadataExt::gid(&meta), user.gid);
    let mut command = Command::new(binary());
    command.args(["ctl", "--socket"]).arg(&socket).arg("show");
    std::os::unix::process::CommandExt::uid(&mut command, user.uid);
    std::os::unix::process::CommandExt::gid(&mut command, user.gid);
    let (code, out, err) = run_bounded(command);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("BALANCE_SMART_CLIENT_DESKTOP"), "{out}");

    let mut unknown = Broker::spawn(
        &ini_for(&[&a], "").replace("[General]\n", "[General]\nCONTROL_GROUP=no-such-group-x\n"),
        &[],
    );
    assert_eq!(unknown.wait_exit().await.code(), Some(1));
    assert!(
        unknown.has_log("CONTROL_GROUP no-such-group-x is no group of this machine"),
        "{}",
        unknown.log_text()
    );
}

/// A broker started by a user who may not create its derived socket (here `nobody`, with the
/// socket's directory root's) serves anyway, and says how to get a control socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_derived_socket_that_cannot_be_made_is_a_warning_not_a_failed_start() {
    if !root_or_skip("becoming another user needs root") {
        return;
    }
    let a = TestServer::start("a").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let program = dir.path().join("appbroker");
    std::fs::copy(binary(), &program).unwrap();
    let ports = free_ports();
    let config_path = dir.path().join("appserver.ini");
    std::fs::write(
        &config_path,
        fill_placeholders(&ini_for(&[&a], ""), &ports, dir.path()),
    )
    .unwrap();
    std::fs::set_permissions(&config_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&program)
        .arg("--config")
        .arg(&config_path);
    let broker = Broker::spawn_command(dir, config_path, ports, command);
    broker.wait_for_log("broker ready").await;
    assert!(
        broker.has_log("serving without a control socket"),
        "{}",
        broker.log_text()
    );
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
}

/// A system user made for one test and removed after it.
struct Throwaway {
    name: String,
    uid: u32,
    gid: u32,
}

impl Throwaway {
    fn create() -> Throwaway {
        // One name per test of this process; made one at a time (useradd locks /etc/passwd,
        // and a second one meanwhile would fail rather than wait).
        static MADE: std::sync::Mutex<u32> = std::sync::Mutex::new(0);
        let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
        *made += 1;
        let name = format!("abtest{}x{made}", std::process::id());
        let status = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group", &name])
            .status()
            .expect("useradd (passwd package)");
        assert!(status.success(), "useradd {name}");
        let user = nix::unistd::User::from_name(&name).unwrap().unwrap();
        Throwaway {
            name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        }
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_counts_each_servers_live_http_sessions_until_they_expire() {
    let servers = web_stand_ins().await;
    let broker = Broker::start(&format!(
        "[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
         MONITORING_TYPE=DISABLED\nSESSION_TIMEOUT=1s\nREMOTE_SERVER_01=127.0.0.1 {}\n\
         REMOTE_SERVER_02=127.0.0.1 {}\n",
        servers[0].address.port(),
        servers[1].address.port()
    ))
    .await;
    // Three sessions (a cookie set, then brought back), spread 01, 02, 01.
    for _ in 0..3 {
        let first = http_get(broker.addr(), "/", &[]).await;
        let set = first.header("set-cookie").expect("the broker's cookie");
        let cookie = set.split(';').next().unwrap().to_string();
        let again = http_get(broker.addr(), "/", &[("Cookie", &cookie)]).await;
        assert_eq!(again.status, 200);
    }
    assert_eq!(shown_server(&broker, "01")["sessions"], 2);
    assert_eq!(shown_server(&broker, "02")["sessions"], 1);
    let table = ctl_ok(&broker, &["show"]);
    let row = |id: &str| {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(id))
            .unwrap_or_else(|| panic!("no row {id}:\n{table}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert!(table.contains("CONNS SESSIONS  WEIGHT"), "{table}");
    // ID, SERVER, STATE, CONNS, SESSIONS, WEIGHT.
    assert_eq!(row("01")[4], "2", "{table}");
    assert_eq!(row("02")[4], "1", "{table}");
    // With no request nor query to sweep them, they end a second later all the same.
    eventually("the sessions' end", || {
        let servers = shown(&broker)["servers"].clone();
        servers
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["sessions"] == 0)
    })
    .await;
}

/// `appbroker ping --config <the broker's file> --timeout TIMEOUT`: (exit code, stdout,
/// stderr).
fn ping(broker: &Broker, timeout: &str) -> (i32, String, String) {
    let mut command = Command::new(binary());
    command
        .args(["ping", "--config"])
        .arg(&broker.config_path)
        .args(["--timeout", timeout]);
    own_admin_dirs(&mut command, broker.dir.path());
    run_bounded(command)
}

/// A connection to `broker`'s control socket that has sent `bytes`.
fn control_connection(broker: &Broker, bytes: &[u8]) -> UnixStream {
    let mut stream = UnixStream::connect(socket_of(broker)).unwrap();
    stream.write_all(bytes).unwrap();
    stream
}

/// The next line `stream` reads, within the deadline.
fn answer_line(stream: &UnixStream) -> String {
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_show_are_answered_whatever_other_control_clients_do() {
    let a = TestServer::start("a").await;
    let broker = Broker::start_with(&ini_for(&[&a], ""), &["--log-level", "debug"]).await;
    // Sixteen clients that each send half a request and stop there.
    let halves: Vec<UnixStream> = (0..16)
        .map(|_| control_connection(&broker, br#"{"command":"sh"#))
        .collect();
    let (code, out, err) = ping(&broker, "1s");
    assert_eq!(code, 0, "{out}{err}");
    ctl_ok(&broker, &["show"]);
    // Sixteen waits, as a maintenance script's `drain --wait`s, on a server with a connection
    // open: they wait, and hold no place meanwhile.
    let (held, _) = hold(broker.addr()).await;
    ctl_ok(&broker, &["drain", "SMART_CLIENT_DESKTOP", "01"]);
    let wait = br#"{"command":"wait","section":"SMART_CLIENT_DESKTOP","server":"01","timeout":"1m"}
"#;
    let waits: Vec<UnixStream> = (0..16).map(|_| control_connection(&broker, wait)).collect();
    broker
        .wait_for_logs(r#"control request: {"command":"wait""#, 16)
        .await;
    let (code, out, err) = ping(&broker, "1s");
    assert_eq!(code, 0, "{out}{err}");
    ctl_ok(&broker, &["show"]);
    // Half a request is not waited for past 5 s: each of those connections is closed.
    for half in &halves {
        assert_eq!(answer_line(half), "", "closed without an answer");
    }
    // Sixteen idle connections that asked something keep their places: the next request
    // finds none, waits a moment and is refused as busy, which is logged once; ping is still
    // answered.
    let idle: Vec<UnixStream> = (0..16)
        .map(|_| {
            let stream = control_connection(&broker, b"{\"command\":\"show\"}\n");
            assert!(answer_line(&stream).contains("\"ok\":true"));
            stream
        })
        .collect();
    for _ in 0..2 {
        let (code, out, err) = ctl(&broker, &["show"]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(err.contains("busy: all 16 places are taken"), "{err}");
    }
    assert_eq!(ping(&broker, "1s").0, 0);
    assert_eq!(
        broker.count_logs("control socket: all 16 places are taken"),
        1,
        "{}",
        broker.log_text()
    );
    drop(idle);
    // The waits end with the server's last connection.
    drop(held);
    for wait in &waits {
        let answer = answer_line(wait);
        assert!(answer.contains("no connection left"), "{answer}");
    }
    ctl_ok(&broker, &["show"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_is_answered_within_its_timeout_however_many_half_written_lines_are_held() {
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&a], "")).await;
    // More half-written lines than connections without a place may be open (64), by the
    // socket's owner, as a stuck or hostile script would hold them.
    let halves: Vec<UnixStream> = (0..100)
        .map(|_| control_connection(&broker, br#"{"command":"pi"#))
        .collect();
    // keepalived's check, once a second: each answered at once, never refused.
    for _ in 0..5 {
        let asked = Instant::now();
        let (code, out, err) = ping(&broker, "1s");
        assert_eq!(code, 0, "{out}{err}\n{}", broker.log_text());
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "{:?}",
            asked.elapsed()
        );
    }
    // The oldest were closed to make room, without an answer (reset, their line unread);
    // the newest are still open.
    halves[0].set_read_timeout(Some(DEADLINE)).unwrap();
    let mut rest = Vec::new();
    let closed = match (&halves[0]).read_to_end(&mut rest) {
        Ok(_) => rest.is_empty(),
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(
        closed,
        "the oldest half-written line was not closed: {rest:?}"
    );
    let newest = &halves[99];
    newest.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let still_open = matches!(
        (&*newest).read(&mut byte),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
    );
    assert!(still_open, "the newest half-written line was closed too");
    assert_eq!(
        broker.count_logs("connections have sent no request yet: the oldest of them is closed"),
        1,
        "{}",
        broker.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_gives_up_after_its_timeout_on_a_broker_that_does_not_answer() {
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&a], "")).await;
    broker.signal(Signal::SIGSTOP);
    let (code, out, err) = ping(&broker, "300ms");
    broker.signal(Signal::SIGCONT);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("no answer within 300ms"), "{err}");
    assert_eq!(ping(&broker, "1s").0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_with_control_characters_is_refused_and_one_kept_in_a_state_file_is_escaped() {
    let a = TestServer::start("a").await;
    // A state file from before control characters were refused (or edited by hand): a line
    // break that would forge a log line, and escape sequences for a terminal.
    let kept = serde_json::json!({
        "appbroker_state": 1,
        "written_epoch_ms": 0,
        "servers": [{
            "section": "BALANCE_SMART_CLIENT_DESKTOP",
            "id": "01",
            "address": a.address(),
            "overrides": {"hold": {
                "mode": "disabled",
                "reason": "patch\nWARN  server 10.0.0.9:1234 enabled by uid 0\u{1b}[2J",
                "by": "uid 0\u{9b}31m",
                "since_wall_ms": 0,
            }},
            "quarantine_until_epoch_ms": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
                + 3_600_000,
            "quarantine_asked": {"by": "uid 0", "reason": "restart\n\u{1b}]0;owned\u{7}"},
        }],
    });
    let broker = with_state_file(&a, &kept.to_string());
    broker.wait_for_log("broker ready").await;
    let raw = |text: &str| text.contains('\u{1b}') || text.contains('\u{9b}');
    let restored = broker.wait_for_log("restored from the state file").await;
    assert!(
        restored.contains(r"patch\nWARN  server 10.0.0.9:1234 enabled by uid 0\x1b[2J")
            && restored.contains(r"uid 0\u{9b}31m"),
        "{restored}"
    );
    assert!(
        !broker
            .logs()
            .iter()
            .any(|l| raw(l) || l.starts_with("WARN  server 10.0.0.9"))
    );
    let show = ctl_ok(&broker, &["show"]);
    assert!(!raw(&show) && show.contains(r"patch\nWARN"), "{show}");
    let page = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .text();
    assert!(!raw(&page) && page.contains(r"\x1b[2J"), "{page}");
    let json: Value = serde_json::from_str(
        &http_get(broker.addr(), "/TOTVS_BROKER_QUERY/JSON", &[])
            .await
            .text(),
    )
    .unwrap();
    let asked = &json["servers"][0]["quarantine_asked"];
    assert_eq!(asked["reason"], r"restart\n\x1b]0;owned\x07", "{json}");

    // Given now: refused by `ctl` (exit 2, saying which), and by the broker to a client of
    // its own.
    let forged = "patch\nWARN  forged\u{1b}[2J";
    let (code, out, err) = ctl(
        &broker,
        &["drain", "SMART_CLIENT_DESKTOP", "01", "--reason", forged],
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains(r"control characters (\n, \x1b)"), "{err}");
    assert!(!raw(&err));
    let (code, out, err) = ctl(
        &broker,
        &[
            "quarantine",
            "SMART_CLIENT_DESKTOP",
            "01",
            "--reason",
            forged,
        ],
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains(r"control characters (\n, \x1b)"), "{err}");
    for command in ["disable", "quarantine"] {
        let request = serde_json::json!({
            "command": command,
            "section": "SMART_CLIENT_DESKTOP",
            "server": "01",
            "reason": forged,
        });
        let stream = control_connection(&broker, format!("{request}\n").as_bytes());
        let answer: Value = serde_json::from_str(&answer_line(&stream)).unwrap();
        assert_eq!(answer["ok"], false, "{answer}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .contains("control characters"),
            "{answer}"
        );
    }
    assert_eq!(broker.count_logs("forged"), 0, "{}", broker.log_text());
}
