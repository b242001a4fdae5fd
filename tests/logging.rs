//! The log's outputs through the real binary when they fail or are shared: a closed standard
//! error or output, a full disk (`/dev/full`), a log directory removed under the broker; the
//! log file's mode, and a second instance that cannot bind leaving the running one's file
//! alone. The broker never dies because a log output fails: it keeps serving, drops what it
//! cannot write, and says so once where it still can.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use harness::*;
use nix::sys::signal::Signal;

/// One balancer over `server` with `general` in `[General]`.
fn ini(general: &str, server: &TestServer) -> String {
    Ini::new()
        .general(general)
        .balancer("BALANCE_SMART_CLIENT_DESKTOP", "@PORT@", "", [server.ini()])
        .text()
}

/// The write end of a pipe whose read end is already closed: writing to it fails (EPIPE).
fn closed_pipe() -> OwnedFd {
    let (read, write) = nix::unistd::pipe().expect("pipe");
    drop(read);
    write
}

/// Starts the broker on `text` with standard error going to a pipe nobody reads, and standard
/// output read (or, unless `stdout_open`, closed too). `prepare` is given the test's directory
/// (`@DIR@`) first.
fn spawn_with_stderr_closed(text: &str, stdout_open: bool, prepare: impl FnOnce(&Path)) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    prepare(dir.path());
    let port = free_port();
    let config_path = dir.path().join("appserver.ini");
    std::fs::write(
        &config_path,
        text.replace("@PORT@", &port.to_string())
            .replace("@DIR@", &dir.path().display().to_string()),
    )
    .unwrap();
    let mut command = Command::new(binary());
    command
        .arg("--config")
        .arg(&config_path)
        .stderr(Stdio::from(closed_pipe()));
    if stdout_open {
        command.stdout(Stdio::piped());
    } else {
        command.stdout(Stdio::from(closed_pipe()));
    }
    Broker::spawn_command_keeping(dir, config_path, vec![port, 0], command)
}

/// True while the process runs.
fn alive(broker: &mut Broker) -> bool {
    broker.child.try_wait().unwrap().is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_with_standard_error_closed_does_not_stop_the_broker() {
    let a = TestServer::start("a").await;
    let ini = ini("ConsoleFile=/dev/full\nConsoleLog=1", &a);
    let mut broker = spawn_with_stderr_closed(&ini, true, |_| {});
    broker.wait_for_log("broker ready").await;
    // Said once, on the console that still works, however many lines are lost.
    broker
        .wait_for_log("cannot write the log file /dev/full")
        .await;
    for _ in 0..5 {
        assert_eq!(ask(broker.addr()).await.unwrap(), "a");
    }
    broker.wait_for_logs("connection closed", 5).await;
    assert_eq!(
        broker.count_logs("cannot write the log file"),
        1,
        "{}",
        broker.log_text()
    );
    let line = broker.wait_for_log("cannot write the log file").await;
    assert!(line.contains("no space left on device"), "{line}");
    assert!(alive(&mut broker));
    broker.signal(Signal::SIGTERM);
    assert!(broker.wait_exit().await.success(), "{}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_log_output_failing_does_not_stop_the_broker() {
    let a = TestServer::start("a").await;
    let ini = ini("ConsoleFile=/dev/full\nConsoleLog=1", &a);
    let mut broker = spawn_with_stderr_closed(&ini, false, |_| {});
    // Nothing can be read from it: it shows it runs by serving.
    let every = std::time::Duration::from_millis(20);
    let name = poll("the broker to serve", every, DEADLINE, async || {
        assert!(alive(&mut broker), "the broker exited");
        ask(broker.addr()).await
    })
    .await;
    assert_eq!(name, "a");
    for _ in 0..20 {
        assert_eq!(ask(broker.addr()).await.unwrap(), "a");
    }
    assert!(alive(&mut broker));
    broker.signal(Signal::SIGTERM);
    assert!(broker.wait_exit().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_directory_removed_under_the_broker_does_not_stop_it() {
    let a = TestServer::start("a").await;
    // A small ConsoleMaxSize, so the file is soon rotated: renaming and creating files in a
    // directory that is gone fails.
    let text = ini(
        "ConsoleFile=@DIR@/logs/broker.log\nConsoleMaxSize=400\nConsoleLog=1",
        &a,
    );
    let mut broker = spawn_with_stderr_closed(&text, true, |dir| {
        std::fs::create_dir(dir.join("logs")).unwrap();
    });
    let logs = broker.dir.path().join("logs");
    broker.wait_for_log("broker ready").await;
    std::fs::remove_dir_all(&logs).unwrap();
    for n in 1..=20 {
        assert_eq!(ask(broker.addr()).await.unwrap(), "a");
        broker.wait_for_logs("connection closed", n).await;
    }
    assert_eq!(broker.count_logs("cannot write the log file"), 1);
    assert!(alive(&mut broker));
    broker.signal(Signal::SIGTERM);
    assert!(broker.wait_exit().await.success(), "{}", broker.log_text());
}

#[test]
fn check_with_its_outputs_closed_exits_with_its_code() {
    let valid = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/valid/minimal.ini"
    );
    let invalid = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/invalid/port_zero.ini"
    );
    for (path, code) in [(valid, 0), (invalid, 2)] {
        let status = Command::new(binary())
            .args(["--check", "--config", path])
            .stdin(Stdio::null())
            .stdout(Stdio::from(closed_pipe()))
            .stderr(Stdio::from(closed_pipe()))
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(code), "{path}");
    }
}

/// The process's file-creation mask, from `/proc/self/status` (the broker inherits it).
fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_file_is_not_readable_by_others() {
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini("ConsoleFile=@DIR@/broker.log\nConsoleMaxSize=300", &a)).await;
    let log = broker.dir.path().join("broker.log");
    let rotated = broker.dir.path().join("broker.log.1");
    for n in 1..=20 {
        if rotated.exists() {
            break;
        }
        ask(broker.addr()).await.unwrap();
        broker.wait_for_logs("connection closed", n).await;
    }
    eventually("the file rotated", || rotated.exists() && log.exists()).await;
    // It holds client addresses: 0640, whatever else the umask removes.
    for path in [&log, &rotated] {
        assert_eq!(mode(path), 0o640 & !umask(), "{}", path.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_that_cannot_bind_leaves_the_log_file_alone() {
    let a = TestServer::start("a").await;
    let text = ini("ConsoleFile=@DIR@/broker.log", &a);
    let first = Broker::start(&text).await;
    let log = first.dir.path().join("broker.log");
    eventually("the first broker's lines in its file", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("broker ready"))
    })
    .await;
    let before = std::fs::read_to_string(&log).unwrap();

    // The same file, the same port: the second cannot bind, and says so on its console.
    let same = text
        .replace("@PORT@", &first.ports[0].to_string())
        .replace("@DIR@", &first.dir.path().display().to_string());
    let mut second = Broker::spawn(&same, &[]);
    let status = second.wait_exit().await;
    assert_eq!(status.code(), Some(1), "{}", second.log_text());
    assert!(second.has_log("cannot listen on"), "{}", second.log_text());

    let after = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        after.matches("starting with").count(),
        1,
        "the second instance wrote to the first's log:\n{after}"
    );
    assert!(!after.contains("cannot listen on"), "{after}");
    assert!(after.starts_with(&before));
    assert_eq!(ask(first.addr()).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_console_off_a_start_that_fails_says_why_on_standard_error() {
    let a = TestServer::start("a").await;
    let text = ini("ConsoleFile=@DIR@/broker.log\nConsoleLog=0", &a);
    let first = Broker::start(&text.replace("ConsoleLog=0", "ConsoleLog=1")).await;
    let same = text.replace("@PORT@", &first.ports[0].to_string());
    let mut second = Broker::spawn(&same, &[]);
    assert_eq!(second.wait_exit().await.code(), Some(1));
    assert!(second.has_log("cannot listen on"), "{}", second.log_text());
    let log = second.dir.path().join("broker.log");
    assert!(
        !log.exists(),
        "the log file was created by an instance that never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_file_that_cannot_be_opened_stops_the_start_with_exit_2() {
    let a = TestServer::start("a").await;
    let mut broker = Broker::spawn(&ini("ConsoleFile=@DIR@/no/such/dir/broker.log", &a), &[]);
    assert_eq!(broker.wait_exit().await.code(), Some(2));
    let line = broker.wait_for_log("cannot open the log file").await;
    assert!(
        line.contains("(ConsoleFile): no such file or directory"),
        "{line}"
    );
    assert!(!broker.has_log("broker ready"));
}
