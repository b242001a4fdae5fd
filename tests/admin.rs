//! Runtime administration through the real control socket and the real `appbroker ctl`:
//! disable, drain (and its wait), enable, weight, quarantine and release, cut, reload, the
//! overrides surviving a reload and a restart, a second broker and a stale socket,
//! permissions, and what a bad request gets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::faults::{assert_end_seen, wait_end};
use common::*;
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
    let end = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = waiting.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < end, "drain --wait did not return");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_state_file_is_reported_and_ignored() {
    let a = TestServer::start("a").await;
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports();
    let config_path = dir.path().join("appserver.ini");
    std::fs::write(
        &config_path,
        fill_placeholders(&ini_for(&[&a], ""), &ports, dir.path()),
    )
    .unwrap();
    std::fs::write(dir.path().join("appserver.state"), "{\"half\": [1, 2").unwrap();
    let broker = Broker::spawn_file(dir, config_path, ports, &[]);
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
