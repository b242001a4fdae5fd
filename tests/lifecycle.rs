//! Start-up and shutdown through the real binary: ports that cannot be bound, SIGTERM with
//! connections in flight (grace, drain, cut), a second signal, SIGHUP, the log file and log
//! level, and `appbroker demo`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::*;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as AsyncBufReader};
use tokio::net::TcpStream;

/// One `[BALANCE_SMART_CLIENT_DESKTOP]` on 127.0.0.1:`@PORT@` over `servers`, with `general`
/// lines in `[General]`. No monitor: these tests are about the process, not the servers.
fn ini(general: &str, servers: &[&TestServer]) -> String {
    let servers = servers.iter().map(|s| s.ini());
    Ini::empty()
        .general(general)
        .balancer("BALANCE_SMART_CLIENT_DESKTOP", "@PORT@", "", servers)
        .text()
}

/// True when nothing listens on `addr` any more: the connect is refused.
async fn refused(addr: SocketAddr) -> bool {
    matches!(
        TcpStream::connect(addr).await,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// The only line containing `needle`; fails when there are none or several.
fn one_line(broker: &Broker, needle: &str) -> String {
    let lines: Vec<String> = broker
        .logs()
        .into_iter()
        .filter(|l| l.contains(needle))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line with {needle:?}; log:\n{}",
        broker.log_text()
    );
    lines[0].clone()
}

fn assert_mentions(line: &str, needles: &[&str]) {
    for needle in needles {
        assert!(line.contains(needle), "{needle:?} missing from: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_stops_the_broker_with_exit_1_and_one_clear_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let server = TestServer::start("a").await;
    // The taken port is the second balancer's, so the first must not be left half-started.
    let text = format!(
        "{}[BALANCE_WEB_SERVICES]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT={port}\n\
         REMOTE_SERVER_01={}\n",
        ini("", &[&server]),
        server.ini()
    );
    let mut broker = Broker::spawn(&text, &[]);
    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(1), "{}", broker.log_text());
    let line = one_line(&broker, "cannot listen on");
    assert_mentions(
        &line,
        &[
            "[BALANCE_WEB_SERVICES]",
            &format!("127.0.0.1:{port}"),
            "address already in use",
            "EADDRINUSE",
            &format!("port {port}"),
        ],
    );
    assert!(!broker.has_log("listening on"), "{}", broker.log_text());
    assert!(!broker.has_log("broker ready"), "{}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_broker_on_the_same_port_fails_and_the_first_keeps_serving() {
    let server = TestServer::start("a").await;
    let text = ini("", &[&server]);
    let first = Broker::start(&text).await;
    let port = first.ports[0];
    let mut second = Broker::spawn(&text.replace("@PORT@", &port.to_string()), &[]);
    let status = second.wait_exit().await;
    assert_eq!(status.code(), Some(1), "{}", second.log_text());
    let line = one_line(&second, "cannot listen on");
    assert_mentions(
        &line,
        &[
            "[BALANCE_SMART_CLIENT_DESKTOP]",
            &format!("127.0.0.1:{port}"),
            "address already in use",
            "EADDRINUSE",
            &format!("port {port}"),
        ],
    );
    assert_eq!(ask(first.addr()).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_not_on_this_machine_fails_with_exit_1() {
    // Documentation addresses (RFC 5737); use one this machine really does not have.
    let foreign = ["192.0.2.1", "198.51.100.1", "203.0.113.1"]
        .into_iter()
        .find(|ip| std::net::TcpListener::bind((*ip, 0)).is_err())
        .expect("every documentation address (RFC 5737) is assigned to this machine");
    let server = TestServer::start("a").await;
    let text = ini("", &[&server]).replace(
        "LOCAL_SERVER_ADDRESS=127.0.0.1",
        &format!("LOCAL_SERVER_ADDRESS={foreign}"),
    );
    let mut broker = Broker::spawn(&text, &[]);
    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(1), "{}", broker.log_text());
    let line = one_line(&broker, "cannot listen on");
    assert_mentions(
        &line,
        &[
            "[BALANCE_SMART_CLIENT_DESKTOP]",
            &format!("{foreign}:{}", broker.ports[0]),
            "EADDRNOTAVAIL",
            "not an address of this machine",
        ],
    );
    assert!(!broker.has_log("broker ready"), "{}", broker.log_text());
}

/// True when this process runs as root.
fn is_root() -> bool {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0
}

/// The user the unprivileged cases run as (`nobody`).
const NOBODY: &str = "65534";

/// Spawns the broker on `text` as an unprivileged user: as this process when it is not root,
/// else as `nobody` through setpriv, from copies of the binary and the file in a directory of
/// their own (the build directory may be closed to other users, as /root is).
fn spawn_unprivileged(text: &str) -> Broker {
    if !is_root() {
        return Broker::spawn(text, &[]);
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let open = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open(dir.path(), 0o755);
    let program = dir.path().join("appbroker");
    std::fs::copy(binary(), &program).unwrap();
    open(&program, 0o755);
    let config_path = dir.path().join("appserver.ini");
    std::fs::write(&config_path, text).unwrap();
    open(&config_path, 0o644);
    let mut command = Command::new("setpriv");
    command
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
        ])
        .arg(&program)
        .arg("--config")
        .arg(&config_path);
    Broker::spawn_command(dir, config_path, vec![1], command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs ports below 1024 kept privileged (net.ipv4.ip_unprivileged_port_start > 1, \
            which containers often lower), and setpriv when run as root"]
async fn a_port_below_1024_without_privilege_fails_with_permission_denied() {
    let first = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .map_or(1024, |text| text.trim().parse::<u16>().unwrap());
    assert!(
        first > 1,
        "every user may bind ports from {first} up here (net.ipv4.ip_unprivileged_port_start), \
         so the refusal cannot happen"
    );
    if !is_root() {
        let bound = std::net::TcpListener::bind("127.0.0.1:1");
        assert!(
            bound.is_err(),
            "this process may bind port 1 (CAP_NET_BIND_SERVICE?): the refusal cannot happen"
        );
    }
    let server = TestServer::start("a").await;
    let text = ini("", &[&server]).replace("LOCAL_SERVER_PORT=@PORT@", "LOCAL_SERVER_PORT=1");
    let mut broker = spawn_unprivileged(&text);
    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(1), "{}", broker.log_text());
    let line = one_line(&broker, "cannot listen on");
    assert_mentions(
        &line,
        &[
            "[BALANCE_SMART_CLIENT_DESKTOP]",
            "127.0.0.1:1 ",
            "permission denied",
            "EACCES",
            "below 1024",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_and_lets_the_connection_in_flight_finish() {
    let server = TestServer::start("a").await;
    let mut broker = Broker::start(&ini("SHUTDOWN_TIMEOUT=60", &[&server])).await;
    let (mut held, name) = hold(broker.addr()).await;
    assert_eq!(name, "a");
    let client = held.local_addr().unwrap();

    broker.signal(Signal::SIGTERM);
    let waiting = broker.wait_for_log("listeners closed").await;
    assert_mentions(&waiting, &["1 connection"]);
    assert!(refused(broker.addr()).await, "new clients must be refused");

    // The connection in flight is still served, to its end.
    assert_eq!(exchange(&mut held, "after SIGTERM").await.unwrap(), "a");
    drop(held);
    let closed = broker.wait_for_log(&format!("client={client}")).await;
    assert_mentions(&closed, &["connection closed", "ended_by=client"]);

    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{}", broker.log_text());
    assert!(broker.has_log("broker stopped"), "{}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_page_kept_open_does_not_hold_up_the_shutdown() {
    let server = TestServer::start("a").await;
    let mut broker = Broker::start(&ini("SHUTDOWN_TIMEOUT=60", &[&server])).await;
    // A refreshing status page: one keep-alive connection asking again and again.
    let mut page = HttpConnection::connect(broker.addr()).await;
    let status = "/TOTVS_BROKER_QUERY/STATUS";
    assert_eq!(page.request("GET", status, &[]).await.unwrap().status, 200);

    broker.signal(Signal::SIGTERM);
    broker.wait_for_log("listeners closed").await;
    // The request in hand is answered, the connection then closed, long before 60 s.
    let every = Duration::from_millis(50);
    poll(
        "the page's connection closed",
        every,
        DEADLINE,
        async || match page.request("GET", status, &[]).await {
            Ok(answer) if answer.header("connection") == Some("close") => Ok(()),
            Ok(answer) => {
                assert_eq!(answer.status, 200);
                Err(format!("log:\n{}", broker.log_text()))
            }
            Err(_) => Ok(()),
        },
    )
    .await;
    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{}", broker.log_text());
    assert!(!broker.has_log("is over: cutting"), "{}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_shuts_down_like_sigterm() {
    let server = TestServer::start("a").await;
    let mut broker = Broker::start(&ini("", &[&server])).await;
    broker.signal(Signal::SIGINT);
    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{}", broker.log_text());
    assert!(broker.has_log("received SIGINT"), "{}", broker.log_text());
    assert!(broker.has_log("broker stopped"), "{}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_timeout_cuts_a_connection_still_open() {
    let server = TestServer::start("a").await;
    let mut broker = Broker::start(&ini("SHUTDOWN_TIMEOUT=300ms", &[&server])).await;
    let (held, _) = hold(broker.addr()).await;
    let client = held.local_addr().unwrap();

    broker.signal(Signal::SIGTERM);
    let cut = broker.wait_for_log("SHUTDOWN_TIMEOUT").await;
    assert_mentions(&cut, &["300ms", "cutting 1 connection"]);
    assert!(closed_at_once(held).await, "the idle client must be cut");
    let closed = broker.wait_for_log(&format!("client={client}")).await;
    assert_mentions(&closed, &["connection closed", "ended_by=shutdown"]);

    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{}", broker.log_text());
    assert!(broker.has_log("broker stopped"), "{}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_during_the_drain_exits_at_once_with_1() {
    let server = TestServer::start("a").await;
    // A drain that would outlast the test's deadline: only the second signal can end it.
    let mut broker = Broker::start(&ini("SHUTDOWN_TIMEOUT=10m", &[&server])).await;
    let (_held, _) = hold(broker.addr()).await;
    broker.signal(Signal::SIGTERM);
    broker.wait_for_log("listeners closed").await;
    broker.signal(Signal::SIGTERM);
    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(1), "{}", broker.log_text());
    assert!(broker.has_log("exiting at once"), "{}", broker.log_text());
    assert!(!broker.has_log("broker stopped"), "{}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_grace_keeps_serving_then_closes_the_port() {
    let server = TestServer::start("a").await;
    // Long enough that the client below surely connects within it on a loaded machine: 3 s
    // was once too short in a full suite run beside other builds (the test then waits out
    // the whole grace, so it is not longer than it must be).
    let mut broker = Broker::start(&ini("SHUTDOWN_GRACE=10s", &[&server])).await;
    broker.signal(Signal::SIGTERM);
    broker.wait_for_log("draining").await;
    assert_eq!(
        ask(broker.addr()).await.unwrap(),
        "a",
        "a new client during SHUTDOWN_GRACE must be served"
    );
    broker.wait_for_log("listeners closed").await;
    assert!(
        refused(broker.addr()).await,
        "the port must close after the grace"
    );
    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_the_broker_keeps_serving() {
    let server = TestServer::start("a").await;
    let mut broker = Broker::start(&ini("", &[&server])).await;
    broker.signal(Signal::SIGHUP);
    broker
        .wait_for_log("received SIGHUP: reloading the configuration")
        .await;
    broker
        .wait_for_log("configuration reloaded: nothing changed")
        .await;
    assert_eq!(ask(broker.addr()).await.unwrap(), "a");
    assert!(
        broker.child.try_wait().unwrap().is_none(),
        "SIGHUP must not stop the broker"
    );
    assert!(!broker.has_log("shutting down"), "{}", broker.log_text());
}

/// Lines of a log file; empty when it does not exist.
fn file_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|t| t.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_file_gets_every_line_and_is_rotated_past_its_size() {
    const MAX: u64 = 1000;
    let server = TestServer::start("a").await;
    let broker = Broker::start(&ini(
        &format!("ConsoleFile=@DIR@/console.log\nConsoleMaxSize={MAX}"),
        &[&server],
    ))
    .await;
    let log = broker.dir.path().join("console.log");
    let rotated = broker.dir.path().join("console.log.1");
    // Each finished connection adds a line; add lines until the file has been rotated.
    for n in 1..=50 {
        if rotated.exists() {
            break;
        }
        ask(broker.addr()).await.unwrap();
        broker.wait_for_logs("connection closed", n).await;
    }
    eventually("console.log rotated to console.log.1", || rotated.exists()).await;

    // A line logged now goes to the new file (as well as to the console).
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    let client = stream.local_addr().unwrap();
    exchange(&mut stream, "last").await.unwrap();
    drop(stream);
    let marker = format!("client={client}");
    broker.wait_for_log(&marker).await;
    eventually("the last connection's line in console.log", || {
        file_lines(&log).iter().any(|l| l.contains(&marker))
    })
    .await;

    for path in [&log, &rotated] {
        let size = std::fs::metadata(path).unwrap().len();
        assert!(
            size <= MAX,
            "{} is {size} bytes, over {MAX}",
            path.display()
        );
        let lines = file_lines(path);
        assert!(!lines.is_empty(), "{} is empty", path.display());
        for line in lines {
            // Whole lines, dated (ConsoleLogDate defaults to 1), never coloured.
            assert!(
                line.starts_with(|c: char| c.is_ascii_digit()),
                "{}: {line:?}",
                path.display()
            );
            assert!(!line.contains('\x1b'), "{}: {line:?}", path.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_log_date_0_starts_each_line_with_its_level() {
    let server = TestServer::start("a").await;
    let broker = Broker::start(&ini("ConsoleLogDate=0", &[&server])).await;
    ask(broker.addr()).await.unwrap();
    broker.wait_for_log("connection closed").await;
    let logs = broker.logs();
    for line in &logs {
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
                .iter()
                .any(|level| line.starts_with(level)),
            "line does not start with its level: {line:?}"
        );
    }
    let ready = logs.iter().find(|l| l.contains("broker ready")).unwrap();
    assert_eq!(
        ready.split_whitespace().collect::<Vec<_>>(),
        ["INFO", "broker", "ready"]
    );
}

/// An `appbroker` started by the test itself, for what the harness's [`Broker`] does not
/// offer: an environment variable of our choosing, and a console (stdin) to type into.
struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Process {
    fn spawn(mut command: Command) -> Process {
        command.stdin(Stdio::piped());
        Process::spawn_keeping_stdin(command)
    }

    /// As [`Process::spawn`], with the standard input `command` was given (a terminal, say).
    fn spawn_keeping_stdin(mut command: Command) -> Process {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn appbroker");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let outputs: [Box<dyn std::io::Read + Send>; 2] = [
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        for output in outputs {
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(output).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Process {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    fn log_text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    fn has_log(&self, needle: &str) -> bool {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    async fn wait_for_log(&self, needle: &str) -> String {
        wait_for_line(&self.lines, needle).await
    }

    async fn wait_exit(&mut self) -> ExitStatus {
        until("appbroker to exit", async || {
            let exited = self.child.try_wait().unwrap();
            exited.ok_or_else(|| format!("log:\n{}", self.log_text()))
        })
        .await
    }

    fn signal(&self, signal: Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("send signal");
    }

    fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for Process {
    /// Ends the process and what it started (the demo a shell ran), even after a panic.
    fn drop(&mut self) {
        kill_tree(&mut self.child);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_level_flag_wins_over_rust_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("appserver.ini");
    let port = free_port();
    // A server nobody listens on: the second client's attempt on it is logged at debug level.
    let text = format!(
        "[General]\nConsoleLogDate=0\n[BALANCE_SMART_CLIENT_DESKTOP]\n\
         LOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT={port}\nMONITORING_TYPE=DISABLED\n\
         REMOTE_SERVER_01=127.0.0.1 {}\n",
        free_port()
    );
    std::fs::write(&path, text).unwrap();
    let mut command = Command::new(binary());
    command
        .arg("--config")
        .arg(&path)
        .args(["--log-level", "debug"])
        .env("RUST_LOG", "error");
    own_admin_dirs(&mut command, dir.path());
    let broker = Process::spawn(command);
    // Info lines are there: RUST_LOG=error did not win.
    broker.wait_for_log("broker ready").await;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    assert!(closed_at_once(TcpStream::connect(addr).await.unwrap()).await);
    broker.wait_for_log("in quarantine").await;
    assert!(closed_at_once(TcpStream::connect(addr).await.unwrap()).await);
    let debug = broker.wait_for_log("still unreachable").await;
    assert!(debug.starts_with("DEBUG"), "{debug}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_log_level_is_refused_before_starting() {
    // `verbose` is no level: taken as a filter directive it would match no target, and the
    // broker would run with every line, errors included, silenced.
    let server = TestServer::start("a").await;
    let mut broker = Broker::spawn(&ini("", &[&server]), &["--log-level", "verbose"]);
    let status = broker.wait_exit().await;
    assert_eq!(status.code(), Some(2), "{}", broker.log_text());
    let line = one_line(&broker, "invalid log level");
    assert_mentions(&line, &["verbose", "error, warn, info, debug or trace"]);
}

/// The shipped example as `appbroker demo --config` runs it: every port replaced by a free
/// one. Returns the file (kept alive by the directory) and the new ports, in the order of
/// [`DEMO_PORTS`].
fn demo_config() -> (tempfile::TempDir, std::path::PathBuf, Vec<u16>) {
    let mut text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/appserver.ini.example"
    ))
    .unwrap();
    // Held together so no two are the same port.
    let held: Vec<std::net::TcpListener> = DEMO_PORTS
        .iter()
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ports: Vec<u16> = held
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    for (old, new) in DEMO_PORTS.iter().zip(&ports) {
        let (from, to) = if DEMO_LISTEN_PORTS.contains(old) {
            (format!("PORT={old}\n"), format!("PORT={new}\n"))
        } else {
            (format!("127.0.0.1 {old}"), format!("127.0.0.1 {new}"))
        };
        assert_eq!(text.matches(&from).count(), 1, "{from:?} in the example");
        text = text.replace(&from, &to);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.ini");
    std::fs::write(&path, text).unwrap();
    (dir, path, ports)
}

/// The example's ports: its two TCP balancers', their five servers', then its HTTP
/// balancer's and its two servers'.
const DEMO_PORTS: [u16; 10] = [5000, 5001, 6001, 6002, 6003, 6011, 6012, 8080, 8081, 8082];

/// The ports of [`DEMO_PORTS`] that balancers listen on.
const DEMO_LISTEN_PORTS: [u16; 3] = [5000, 5001, 8080];

/// A running demo on free ports.
struct Demo {
    process: Process,
    /// Ports in the order of [`DEMO_PORTS`].
    ports: Vec<u16>,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// Starts `appbroker demo --config <the example on free ports> <args>` and waits until it is
/// ready. A port found free may be taken by another process before the demo binds it (a
/// client's ephemeral port, on a busy machine): the demo then says so and exits, and is
/// started again on other ports, twice at most.
async fn start_demo(args: &[&str]) -> Demo {
    for _ in 0..2 {
        if let Ok(demo) = launch_demo(&[], args, Process::spawn).await {
            return demo;
        }
    }
    start_demo_as(&[], args, Process::spawn).await
}

/// Starts `<prefix> appbroker demo --config <the example on free ports> <args>` (`prefix`: a
/// program that runs the demo, such as a shell) with `spawn`, and waits until it is ready.
async fn start_demo_as(
    prefix: &[&str],
    args: &[&str],
    spawn: impl FnOnce(Command) -> Process,
) -> Demo {
    match launch_demo(prefix, args, spawn).await {
        Ok(demo) => demo,
        Err(log) => panic!("a port of the demo was taken as it started; log:\n{log}"),
    }
}

/// [`start_demo_as`], or the demo's log when one of its ports was taken before it bound it.
async fn launch_demo(
    prefix: &[&str],
    args: &[&str],
    spawn: impl FnOnce(Command) -> Process,
) -> Result<Demo, String> {
    let (dir, path, ports) = demo_config();
    let mut command = match prefix.split_first() {
        Some((program, rest)) => {
            let mut command = Command::new(program);
            command.args(rest);
            command
        }
        None => Command::new(binary()),
    };
    if !prefix.is_empty() {
        command.arg(binary());
    }
    // From an empty directory: the demo needs no appserver.ini of its own.
    command
        .arg("demo")
        .arg("--config")
        .arg(&path)
        .args(args)
        .current_dir(dir.path())
        .env_remove("RUST_LOG");
    // Where a broker on this file would keep its socket and state: the demo keeps its own,
    // in the temporary directory, here the test's (so a demo the test kills leaves nothing).
    own_admin_dirs(&mut command, dir.path());
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    command.env("TMPDIR", &tmp);
    let process = spawn(command);
    let ready = until("the demo ready, or a port of it taken", async || {
        let lines = process.lines.lock().unwrap();
        if lines.iter().any(|l| l.contains("broker ready")) {
            Ok(true)
        } else if lines.iter().any(|l| l.contains("address already in use")) {
            Ok(false)
        } else {
            Err(format!("log:\n{}", lines.join("\n")))
        }
    })
    .await;
    if !ready {
        return Err(process.log_text());
    }
    Ok(Demo {
        process,
        ports,
        path,
        _dir: dir,
    })
}

/// Sends `line` through the demo's first balancer; returns the prefix of the reply: the name
/// of the server that answered.
async fn demo_ask(demo: &Demo, line: &str) -> String {
    let stream = TcpStream::connect(("127.0.0.1", demo.ports[0]))
        .await
        .unwrap();
    let (read, mut write) = stream.into_split();
    write
        .write_all(format!("{line}\n").as_bytes())
        .await
        .unwrap();
    let mut reply = String::new();
    tokio::time::timeout(DEADLINE, AsyncBufReader::new(read).read_line(&mut reply))
        .await
        .expect("demo reply in time")
        .unwrap();
    let prefix = reply
        .strip_suffix(&format!(" {line}\n"))
        .unwrap_or_else(|| panic!("reply {reply:?} does not echo {line:?}"));
    prefix.to_string()
}

/// `[server 0N 127.0.0.1:<port>]` for the desktop balancer's servers 1 to 3.
fn demo_server_name(demo: &Demo, n: usize) -> String {
    format!("[server 0{n} 127.0.0.1:{}]", demo.ports[1 + n])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_answers_and_a_server_stopped_on_its_console_is_avoided() {
    let mut demo = start_demo(&[]).await;
    let names: Vec<String> = (1..=3).map(|n| demo_server_name(&demo, n)).collect();
    let first = demo_ask(&demo, "hello demo").await;
    assert!(names.contains(&first), "unexpected reply prefix {first:?}");

    demo.process.type_line("01");
    demo.process
        .wait_for_log("demo: stopped BALANCE_SMART_CLIENT_DESKTOP/01")
        .await;
    // Every client is still served, never by the stopped server.
    for i in 0..4 {
        let name = demo_ask(&demo, &format!("after stop {i}")).await;
        assert!(
            name == names[1] || name == names[2],
            "served by {name:?} after 01 was stopped; log:\n{}",
            demo.process.log_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_stops_on_ctrl_c_with_its_console_open() {
    let mut demo = start_demo(&[]).await;
    // The console (stdin) stays open, as a terminal's does. Enter alone lists the servers:
    // once it has, the console is reading again.
    demo.process.type_line("");
    demo.process
        .wait_for_log(&format!(
            "demo: BALANCE_SMART_CLIENT_DESKTOP/01 on 127.0.0.1:{} is running",
            demo.ports[2]
        ))
        .await;
    demo.process.signal(Signal::SIGINT);
    demo.process.wait_for_log("broker stopped").await;
    let status = demo.process.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{}", demo.process.log_text());
    assert!(
        demo.process.has_log("received SIGINT"),
        "{}",
        demo.process.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_the_demo_at_once_with_a_client_connected_and_says_so() {
    // README: Ctrl-C stops the demo. A broker gives a client SHUTDOWN_TIMEOUT (30 s in the
    // example) to finish; the demo, whose clients are a person trying it, does not wait so.
    let mut demo = start_demo(&[]).await;
    let mut held = TcpStream::connect(("127.0.0.1", demo.ports[0]))
        .await
        .unwrap();
    held.write_all(b"still here\n").await.unwrap();
    // The whole reply line: a part of it left unread would be read below in place of the cut.
    let mut reply = [0u8; 64];
    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        let n = within("the held client's reply", held.read(&mut reply))
            .await
            .unwrap();
        assert!(n > 0, "the demo answered {line:?} and no more");
        line.extend_from_slice(&reply[..n]);
    }
    let asked = Instant::now();
    demo.process.signal(Signal::SIGINT);
    let status = demo.process.wait_exit().await;
    let took = asked.elapsed();
    assert_eq!(status.code(), Some(0), "{}", demo.process.log_text());
    assert!(
        took < Duration::from_secs(10),
        "the demo took {took:?} to stop:\n{}",
        demo.process.log_text()
    );
    // It says it stops at once, and what that does to the client.
    let said = demo.process.log_text();
    assert!(said.contains("demo: stopping at once"), "{said}");
    assert!(said.contains("cutting 1 connection"), "{said}");
    let read = within("the cut", held.read(&mut reply)).await;
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_listens_on_loopback_unless_asked() {
    let demo = start_demo(&[]).await;
    for (section, port) in [
        ("[BALANCE_SMART_CLIENT_DESKTOP]", demo.ports[0]),
        ("[BALANCE_WEB_SERVICES]", demo.ports[1]),
        ("[BALANCE_HTTP]", demo.ports[7]),
    ] {
        // The example says 0.0.0.0 (a real broker serves the network); the demo does not.
        demo.process
            .wait_for_log(&format!("{section} listening on 127.0.0.1:{port} "))
            .await;
        let status = query_json(SocketAddr::from(([127, 0, 0, 1], port))).await;
        assert_eq!(status["listen"], format!("127.0.0.1:{port}"));
    }
    drop(demo);

    let open = start_demo(&["--listen", "0.0.0.0"]).await;
    open.process
        .wait_for_log(&format!(
            "[BALANCE_SMART_CLIENT_DESKTOP] listening on 0.0.0.0:{} ",
            open.ports[0]
        ))
        .await;
}

/// One GET of `/` through the demo's HTTP balancer on a connection of its own, with `cookie`
/// as the broker's cookie: (the server the answer names in its header, the cookie it sets,
/// the page).
async fn demo_page(demo: &Demo, cookie: Option<&str>) -> (String, Option<String>, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", demo.ports[7]))
        .await
        .unwrap();
    let cookie = cookie.map_or_else(String::new, |c| {
        format!("Cookie: TOTVS_BROKER_SH_001={c}\r\n")
    });
    let request = format!("GET / HTTP/1.1\r\nHost: demo\r\n{cookie}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    within("the demo's page", async {
        tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer).await
    })
    .await
    .unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200 "), "{answer}");
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                l.split_once(": ")
                    .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            })
            .map(|(_, v)| v.to_string())
    };
    let server = header("x-appbroker-demo-server").expect("the server's name");
    assert!(
        body.contains(&format!("page: served by {server}")),
        "{body}"
    );
    let set = header("set-cookie").map(|line| {
        line.strip_prefix("TOTVS_BROKER_SH_001=")
            .and_then(|l| l.split_once(';'))
            .map(|(value, _)| value.to_string())
            .unwrap_or_else(|| panic!("unexpected Set-Cookie {line}"))
    });
    (server, set, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_web_page_stays_on_one_server_and_moves_when_it_stops() {
    let mut demo = start_demo(&[]).await;
    demo.process
        .wait_for_log(&format!(
            "demo: open http://127.0.0.1:{}/ in a browser",
            demo.ports[7]
        ))
        .await;
    let (first, cookie, page) = demo_page(&demo, None).await;
    let cookie = cookie.expect("the first answer sets the broker's cookie");
    let id = &cookie[..2];
    let port = demo.ports[if id == "01" { 8 } else { 9 }];
    assert_eq!(first, format!("server {id} 127.0.0.1:{port}"), "{cookie}");
    assert!(page.contains("<script src=\"/demo.js\">"), "{page}");
    for _ in 0..3 {
        assert_eq!(demo_page(&demo, Some(&cookie)).await.0, first);
    }
    // Stopped on the console (with the TCP balancers' servers of that id): the next load
    // goes to the other server, with a new cookie naming it.
    demo.process.type_line(id);
    demo.process
        .wait_for_log(&format!("demo: stopped BALANCE_HTTP/{id}"))
        .await;
    let (moved, new_cookie, _) = demo_page(&demo, Some(&cookie)).await;
    let new_cookie = new_cookie.expect("a moved session gets a new cookie");
    assert_ne!(moved, first);
    assert_ne!(&new_cookie[..2], id, "{new_cookie}");
    let (again, set, _) = demo_page(&demo, Some(&new_cookie)).await;
    assert_eq!((again, set), (moved, None));
}

/// Runs `command` (a shell-free command line) with `input` on its standard input; returns
/// (exit code, stdout, stderr).
fn run_with_input(command: &str, input: &str) -> (i32, String, String) {
    let mut words = command.split_whitespace();
    let mut child = Command::new(words.next().expect("a program"))
        .args(words)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the command");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    // Its standard input closes here: the client half-closes, the server ends its reply.
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_prints_a_client_command_that_works_without_telnet_or_nc() {
    let demo = start_demo(&[]).await;
    let line = demo
        .process
        .wait_for_log("talk to it from another terminal with `")
        .await;
    let command = line
        .split('`')
        .nth(1)
        .expect("the command between backquotes")
        .to_string();
    assert_eq!(
        command,
        format!(
            "{} demo --client --config {}",
            binary(),
            demo.path.display()
        )
    );
    let (code, stdout, stderr) =
        tokio::task::spawn_blocking(move || run_with_input(&command, "hello\nagain\n"))
            .await
            .unwrap();
    assert_eq!(code, 0, "{stderr}");
    let names: Vec<String> = (1..=3).map(|n| demo_server_name(&demo, n)).collect();
    let replies: Vec<&str> = stdout.lines().collect();
    assert_eq!(replies.len(), 2, "{stdout}");
    for (reply, sent) in replies.iter().zip(["hello", "again"]) {
        let (name, echoed) = reply.split_once("] ").expect("a name in brackets");
        assert!(names.contains(&format!("{name}]")), "{reply}");
        assert_eq!(echoed, sent);
    }
    assert!(demo.process.has_log("demo: watch it at http://127.0.0.1:"));

    // Nothing there: a clear word, exit 1.
    let nobody = format!("{} demo --client 127.0.0.1:{}", binary(), free_port());
    let (code, _, stderr) = tokio::task::spawn_blocking(move || run_with_input(&nobody, ""))
        .await
        .unwrap();
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("connection refused") && stderr.contains("is the demo running?"),
        "{stderr}"
    );
}

/// Whether `setsid` (util-linux) runs here; under `CI` its absence fails the test rather than
/// skipping it.
fn have_setsid() -> bool {
    find_program("setsid").is_some()
}

/// A pseudo-terminal: the demo's end (its standard input) and the end a person types into.
fn terminal() -> (Stdio, std::fs::File) {
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    (Stdio::from(pty.slave), std::fs::File::from(pty.master))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs setsid (util-linux) and a pseudo-terminal"]
async fn the_demo_in_the_background_of_a_terminal_serves_and_says_ids_cannot_be_typed() {
    if !have_setsid() {
        return;
    }
    // An operator's shell with job control, its terminal the demo's standard input:
    // `appbroker demo &` puts the demo in a process group that is not the terminal's
    // foreground, where a read of the terminal would stop the whole process (SIGTTIN).
    let (tty, _keyboard) = terminal();
    let shell = [
        "setsid",
        "--ctty",
        "sh",
        "-c",
        "set -m; \"$0\" \"$@\" & wait",
    ];
    // A job that stops ends the shell's `wait`, and the shell with it, orphaning the demo:
    // everything in the shell's session is ended with the test, even when it fails.
    let mut _session = None;
    let demo = start_demo_as(&shell, &[], |mut command| {
        command.stdin(tty);
        let process = Process::spawn_keeping_stdin(command);
        _session = Some(Session(process.child.id() as i32));
        process
    })
    .await;
    demo.process
        .wait_for_log(
            "demo: typing server ids is not available while the demo runs in the background",
        )
        .await;
    // Still serving: every client answered.
    let names: Vec<String> = (1..=3).map(|n| demo_server_name(&demo, n)).collect();
    for i in 0..3 {
        let name = demo_ask(&demo, &format!("in the background {i}")).await;
        assert!(names.contains(&name), "{name}");
    }
    assert!(
        !demo.process.has_log("demo: type a server id"),
        "{}",
        demo.process.log_text()
    );

    // In the terminal's foreground (a session of its own, as `fg` would make it), the
    // console reads what is typed there.
    let (tty, mut keyboard) = terminal();
    let mut demo = start_demo_as(&["setsid", "--ctty"], &[], |mut command| {
        command.stdin(tty);
        Process::spawn_keeping_stdin(command)
    })
    .await;
    demo.process
        .wait_for_log("demo: type a server id (01, 02, ...) and Enter here")
        .await;
    keyboard.write_all(b"01\n").unwrap();
    demo.process
        .wait_for_log("demo: stopped BALANCE_SMART_CLIENT_DESKTOP/01")
        .await;
    let name = demo_ask(&demo, "after the stop").await;
    assert!(
        name == names_of(&demo)[1] || name == names_of(&demo)[2],
        "{name}"
    );
    demo.process.signal(Signal::SIGINT);
    assert_eq!(demo.process.wait_exit().await.code(), Some(0));
}

/// A session (the id of its leader) whose every process is SIGKILLed when this is dropped.
struct Session(i32);

impl Drop for Session {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            // `pid (comm) state ppid pgrp session ...`; comm may hold spaces and parentheses.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let session = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(3)?.parse::<i32>().ok());
            if session == Some(self.0) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// The desktop balancer's servers 1 to 3 as they name themselves.
fn names_of(demo: &Demo) -> Vec<String> {
    (1..=3).map(|n| demo_server_name(demo, n)).collect()
}

/// Runs `command` with its standard input open until it exits (within [`DEADLINE`]); returns
/// (exit code, stderr).
fn run_with_input_open(mut command: Command) -> (i32, String) {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the command");
    let _input = child.stdin.take();
    let end = Instant::now() + DEADLINE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            kill_tree(&mut child);
            panic!("the command did not end when the server closed");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_client_says_when_the_other_side_closed_and_exits_1() {
    // The other side closes while the user can still type (the server that answered was
    // stopped): not a silent exit 0, which would read as success.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let closer = std::thread::spawn(move || drop(listener.accept().unwrap()));
    let mut command = Command::new(binary());
    command.args(["demo", "--client", &address.to_string()]);
    let (code, stderr) = tokio::task::spawn_blocking(move || run_with_input_open(command))
        .await
        .unwrap();
    closer.join().unwrap();
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("connection closed by {address}")),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_client_says_no_server_was_available_and_exits_1() {
    // Every server of the demo's first balancer held out: the broker closes each client it
    // has no server for. Not a silent exit 0 with piped input, nor "the server that answered
    // was stopped" when none answered.
    let demo = start_demo(&[]).await;
    let socket = demo_socket(&demo).await;
    for id in ["01", "02", "03"] {
        let mut command = Command::new(binary());
        command.args(["ctl", "--socket"]).arg(&socket).args([
            "disable",
            "SMART_CLIENT_DESKTOP",
            id,
        ]);
        own_admin_dirs(&mut command, demo._dir.path());
        let (code, out, err) = run_bounded(command);
        assert_eq!(code, 0, "{out}{err}");
    }
    let client = format!(
        "{} demo --client --config {}",
        binary(),
        demo.path.display()
    );
    let piped = client.clone();
    let (code, stdout, stderr) =
        tokio::task::spawn_blocking(move || run_with_input(&piped, "hello\n"))
            .await
            .unwrap();
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("no server was available"), "{stderr}");
    assert!(
        stderr.contains("3 disabled"),
        "the broker's own reason: {stderr}"
    );
    // Typing, the input still open.
    let mut words = client.split_whitespace();
    let mut command = Command::new(words.next().unwrap());
    command.args(words);
    let (code, stderr) = tokio::task::spawn_blocking(move || run_with_input_open(command))
        .await
        .unwrap();
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no server was available"), "{stderr}");
    assert!(!stderr.contains("the server that answered"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_keeps_its_socket_and_state_in_a_directory_it_removes_and_reloads_nothing() {
    let mut demo = start_demo(&[]).await;
    let socket = demo_socket(&demo).await;
    let scratch = socket.parent().unwrap().to_path_buf();
    // In the temporary directory (TMPDIR), not where a broker of this file keeps them (the
    // test's RUNTIME_DIRECTORY and STATE_DIRECTORY, or /run/appbroker and /var/lib/appbroker).
    assert_eq!(
        scratch.parent(),
        Some(demo._dir.path().join("tmp").as_path())
    );
    let ctl = |args: &[&str]| {
        let mut command = Command::new(binary());
        command.arg("ctl").arg("--socket").arg(&socket).args(args);
        own_admin_dirs(&mut command, demo._dir.path());
        run_bounded(command)
    };
    let (code, out, err) = ctl(&["drain", "SMART_CLIENT_DESKTOP", "01"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(scratch.join("demo.state").is_file());

    // No file to read again as the demo runs it: said so, the running configuration kept.
    let (code, out, err) = ctl(&["reload"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("the demo does not reload its file"), "{err}");
    assert_eq!(shown_state(&ctl(&["show", "--json"])), "drain");

    demo.process.signal(Signal::SIGINT);
    assert_eq!(demo.process.wait_exit().await.code(), Some(0));
    assert!(!scratch.exists(), "{} is left behind", scratch.display());

    // The next demo starts afresh: no drain from the last one.
    let next = start_demo(&[]).await;
    let socket = demo_socket(&next).await;
    let mut show = Command::new(binary());
    show.arg("ctl")
        .arg("--socket")
        .arg(&socket)
        .args(["show", "--json"]);
    assert_eq!(shown_state(&run_bounded(show)), "available");
}

/// The control socket of `demo`, from the `ctl` command its start prints.
async fn demo_socket(demo: &Demo) -> std::path::PathBuf {
    let line = demo
        .process
        .wait_for_log("demo: its control socket and state are in a directory of its own")
        .await;
    let command = line
        .split('`')
        .nth(1)
        .expect("the ctl command between backquotes");
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(words[..3], [binary(), "ctl", "--socket"], "{command}");
    assert_eq!(words[4..], ["show"], "{command}");
    std::path::PathBuf::from(words[3])
}

/// The state of the desktop balancer's server 01 in the output of `ctl show --json`.
fn shown_state((code, out, err): &(i32, String, String)) -> String {
    assert_eq!(*code, 0, "{out}{err}");
    let answer: serde_json::Value = serde_json::from_str(out).unwrap();
    let server = &answer["balancers"][0]["servers"][0];
    assert_eq!(server["id"], "01", "{answer}");
    server["state"].as_str().unwrap().to_string()
}
