//! The integration-test harness: the real `appbroker` binary started on a generated
//! `appserver.ini`, loopback servers that can be stopped and started again on the same port,
//! and clients. Everything binds port 0 (the broker's port is found the same way) and waits by
//! polling for a condition with a deadline, never by sleeping.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as AsyncBufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long any wait in a test may take before the test fails. Generous: it only bounds a
/// failing test, a passing one returns as soon as its condition holds.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `condition` until it holds or [`DEADLINE`] passes.
pub async fn eventually<F: FnMut() -> bool>(what: &str, mut condition: F) {
    let end = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A port that was free a moment ago (bound to port 0, then released). The broker's port must
/// be written in its file, so it cannot take port 0 itself; [`Broker::start`] retries with
/// another port in the rare case something took this one in between.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

/// A running `appbroker` process and everything it has logged.
pub struct Broker {
    pub child: Child,
    /// Ports of the balancers, in the order of the `@PORT@`, `@PORT2@` placeholders.
    pub ports: Vec<u16>,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
    /// The threads reading the process's output; joined once it exits, so no line is lost.
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// The path of the binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_appbroker")
}

impl Broker {
    /// Starts the broker on `ini`, where `@PORT@` (and `@PORT2@` for a second balancer) stand
    /// for free ports, and waits for `broker ready`.
    pub async fn start(ini: &str) -> Broker {
        Broker::start_with(ini, &[]).await
    }

    /// As [`Broker::start`], with extra command-line arguments.
    pub async fn start_with(ini: &str, args: &[&str]) -> Broker {
        for _ in 0..5 {
            let mut broker = Broker::spawn(ini, args);
            let ready = broker.wait_until(|lines| {
                lines
                    .iter()
                    .any(|l| l.contains("broker ready") || l.contains("cannot listen on"))
            });
            if ready.await {
                if broker.has_log("broker ready") {
                    return broker;
                }
                if broker.has_log("address already in use") {
                    let _ = broker.child.kill();
                    let _ = broker.child.wait();
                    continue; // someone took the port between free_port() and the bind
                }
            }
            panic!("broker did not start:\n{}", broker.log_text());
        }
        panic!("no free port after 5 tries");
    }

    /// Spawns the broker without waiting for anything.
    pub fn spawn(ini: &str, args: &[&str]) -> Broker {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports = vec![free_port(), free_port()];
        let text = ini
            .replace("@PORT@", &ports[0].to_string())
            .replace("@PORT2@", &ports[1].to_string())
            .replace("@DIR@", &dir.path().display().to_string());
        let config_path = dir.path().join("appserver.ini");
        std::fs::write(&config_path, text).expect("write ini");
        Broker::spawn_file(dir, config_path, ports, args)
    }

    /// Spawns the broker on a file already written.
    pub fn spawn_file(
        dir: tempfile::TempDir,
        config_path: PathBuf,
        ports: Vec<u16>,
        args: &[&str],
    ) -> Broker {
        let mut command = Command::new(binary());
        command.arg("--config").arg(&config_path).args(args);
        Broker::spawn_command(dir, config_path, ports, command)
    }

    /// Spawns `command`, which runs the broker on `config_path` (through a shell that lowers
    /// its limits first, say), and reads its output as [`Broker::spawn_file`] does.
    pub fn spawn_command(
        dir: tempfile::TempDir,
        config_path: PathBuf,
        ports: Vec<u16>,
        mut command: Command,
    ) -> Broker {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        Broker::spawn_command_keeping(dir, config_path, ports, command)
    }

    /// As [`Broker::spawn_command`], keeping the standard output and error `command` was
    /// given (a closed pipe, say); only those set to `Stdio::piped()` are read.
    pub fn spawn_command_keeping(
        dir: tempfile::TempDir,
        config_path: PathBuf,
        ports: Vec<u16>,
        mut command: Command,
    ) -> Broker {
        command.env_remove("RUST_LOG").stdin(Stdio::null());
        let mut child = command.spawn().expect("spawn appbroker");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let lines = Arc::clone(&lines);
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            }));
        }
        Broker {
            child,
            ports,
            dir,
            config_path,
            lines,
            readers,
        }
    }

    /// The first balancer's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[0]))
    }

    /// The second balancer's address.
    pub fn addr2(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[1]))
    }

    /// Every line logged so far (stdout and stderr).
    pub fn logs(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The log as one text, for assertion messages.
    pub fn log_text(&self) -> String {
        self.logs().join("\n")
    }

    pub fn has_log(&self, needle: &str) -> bool {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    pub fn count_logs(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits until a line containing `needle` is logged; returns it.
    pub async fn wait_for_log(&self, needle: &str) -> String {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(line) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return line.clone();
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for log line containing {needle:?}; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `count` lines contain `needle`.
    pub async fn wait_for_logs(&self, needle: &str, count: usize) {
        let end = Instant::now() + DEADLINE;
        while self.count_logs(needle) < count {
            assert!(
                Instant::now() < end,
                "timed out waiting for {count} log lines containing {needle:?}; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `condition` holds for the log, or the process exits, or the deadline passes.
    /// True when the condition held.
    async fn wait_until(&mut self, condition: impl Fn(&[String]) -> bool) -> bool {
        let end = Instant::now() + DEADLINE;
        loop {
            if condition(&self.lines.lock().unwrap()) {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                self.drain_output();
                return condition(&self.lines.lock().unwrap());
            }
            if Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Once the process has exited: waits until its output is read to the end.
    fn drain_output(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The broker's resident memory (`VmRSS` in `/proc/<pid>/status`) in bytes; `None` where
    /// there is no `/proc` or once the process is gone.
    pub fn resident_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Sends a signal to the broker.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("send signal");
    }

    /// Waits for the broker to exit.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.drain_output();
                return status;
            }
            assert!(
                Instant::now() < end,
                "broker did not exit; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback server that answers each line with `<name>: <line>`, optionally greeting first,
/// and can be stopped (port closed, connections dropped) and started again on the same port.
pub struct TestServer {
    pub name: String,
    pub addr: SocketAddr,
    pub banner: Option<String>,
    /// Connections accepted since start.
    pub accepted: Arc<AtomicUsize>,
    running: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
    /// While stopped, the port stays bound without listening: connects are refused, and no
    /// other test's server can be given the port in the meantime.
    reserved: Option<socket2::Socket>,
}

impl TestServer {
    /// An echo server named `name` on a fresh port.
    pub async fn start(name: &str) -> TestServer {
        TestServer::start_at(name, "127.0.0.1:0".parse().unwrap(), None).await
    }

    /// A server that sends `banner` as soon as a client connects (a server-first protocol).
    pub async fn with_banner(name: &str, banner: &str) -> TestServer {
        TestServer::start_at(
            name,
            "127.0.0.1:0".parse().unwrap(),
            Some(banner.to_string()),
        )
        .await
    }

    async fn start_at(name: &str, addr: SocketAddr, banner: Option<String>) -> TestServer {
        let mut server = TestServer {
            name: name.to_string(),
            addr,
            banner,
            accepted: Arc::new(AtomicUsize::new(0)),
            running: None,
            reserved: None,
        };
        server.resume().await;
        server
    }

    /// `REMOTE_SERVER` value for this server: `127.0.0.1 <port>`.
    pub fn ini(&self) -> String {
        format!("127.0.0.1 {}", self.addr.port())
    }

    /// `host:port` as the broker names it.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Closes the port and drops every connection; returns once the port refuses
    /// connections, so the broker meets a closed port rather than a listener on its way out.
    pub async fn stop(&mut self) {
        if let Some((token, accepting)) = self.running.take() {
            token.cancel();
            let _ = accepting.await; // the accept task drops the listener as it ends
            self.reserved = reserve(self.addr);
        }
    }

    /// Listens again on the same port.
    pub async fn resume(&mut self) {
        self.reserved = None;
        let listener = {
            let end = Instant::now() + DEADLINE;
            loop {
                match TcpListener::bind(self.addr).await {
                    Ok(l) => break l,
                    Err(e) => {
                        assert!(Instant::now() < end, "cannot bind {} again: {e}", self.addr);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        };
        self.addr = listener.local_addr().unwrap();
        let token = CancellationToken::new();
        let (name, banner, accepted, stop) = (
            self.name.clone(),
            self.banner.clone(),
            Arc::clone(&self.accepted),
            token.clone(),
        );
        let accepting = tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = stop.cancelled() => return,
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_nodelay(true);
                let (name, banner) = (name.clone(), banner.clone());
                tokio::spawn(
                    stop.clone()
                        .run_until_cancelled_owned(answer(stream, name, banner)),
                );
            }
        });
        self.running = Some((token, accepting));
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some((token, _)) = self.running.take() {
            token.cancel();
        }
    }
}

/// Binds `addr` without listening, which keeps the port and refuses connections to it.
fn reserve(addr: SocketAddr) -> Option<socket2::Socket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .ok()?;
    socket.set_reuse_address(true).ok()?;
    socket.bind(&addr.into()).ok()?;
    Some(socket)
}

async fn answer(stream: TcpStream, name: String, banner: Option<String>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    if let Some(banner) = banner {
        write.write_all(banner.as_bytes()).await?;
    }
    let mut reader = AsyncBufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return write.shutdown().await;
        }
        // One write per reply: two small writes would meet Nagle and delayed ACKs.
        let mut reply = format!("{name}: ").into_bytes();
        reply.extend_from_slice(&line);
        write.write_all(&reply).await?;
    }
}

/// Connects through `addr`, sends one line, and returns the name of the server that answered.
pub async fn ask(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    let reply = exchange(&mut stream, "ping").await?;
    Ok(reply)
}

/// Sends `line` on an open connection and returns the name of the server that answered it.
pub async fn exchange(stream: &mut TcpStream, line: &str) -> std::io::Result<String> {
    stream.write_all(format!("{line}\n").as_bytes()).await?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let n = tokio::time::timeout(DEADLINE, stream.read(&mut byte))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply"))??;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("closed after {:?}", String::from_utf8_lossy(&reply)),
            ));
        }
        if byte[0] == b'\n' {
            break;
        }
        reply.push(byte[0]);
    }
    let reply = String::from_utf8_lossy(&reply).to_string();
    let expected_tail = format!(": {line}");
    assert!(
        reply.ends_with(&expected_tail),
        "reply {reply:?} does not echo {line:?}"
    );
    Ok(reply[..reply.len() - expected_tail.len()].to_string())
}

/// Opens a connection through `addr` and proves it reached a server; returns the stream
/// (held open, it counts against its server) and the server's name.
pub async fn hold(addr: SocketAddr) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect to broker");
    let name = exchange(&mut stream, "hold")
        .await
        .expect("held connection answers");
    (stream, name)
}

/// True when the broker closed `stream` without sending anything.
pub async fn closed_at_once(mut stream: TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// An ini with one `[BALANCE_SMART_CLIENT_DESKTOP]` on `@PORT@` over `servers`, plus `extra`
/// lines in the section. Monitoring is disabled unless `extra` sets it, so tests decide when
/// checks happen.
pub fn ini_for(servers: &[&TestServer], extra: &str) -> String {
    let mut text = String::from(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n",
    );
    if !extra.to_ascii_uppercase().contains("MONITORING_TYPE") {
        text.push_str("MONITORING_TYPE=DISABLED\n");
    }
    text.push_str(extra);
    if !extra.is_empty() && !extra.ends_with('\n') {
        text.push('\n');
    }
    for (i, s) in servers.iter().enumerate() {
        text.push_str(&format!("REMOTE_SERVER_{:02}={}\n", i + 1, s.ini()));
    }
    text
}

/// Runs the binary with `args` to completion, returning (exit code, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run appbroker");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// Runs `command` to completion, standard input closed, within [`DEADLINE`]: a command still
/// running then is killed and the test fails (rather than hanging with it). Returns (exit
/// code, stdout, stderr); the code is -1 when a signal ended it.
pub fn run_bounded(mut command: Command) -> (i32, String, String) {
    let mut child = command
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the command");
    let read = |stream: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut stream) = stream {
                let _ = stream.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).to_string()
        })
    };
    let stdout = read(child.stdout.take().map(|s| Box::new(s) as _));
    let stderr = read(child.stderr.take().map(|s| Box::new(s) as _));
    let end = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (
        status.code().unwrap_or(-1),
        stdout.join().expect("stdout reader"),
        stderr.join().expect("stderr reader"),
    )
}

/// One HTTP/1.1 answer as a client reads it.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }
}

/// A tiny HTTP/1.1 client over one TCP connection: enough to speak to the query interface as
/// a monitoring script does, keep-alive included. Bytes read past one answer are kept for the
/// next.
pub struct HttpConnection {
    pub stream: TcpStream,
    buffer: Vec<u8>,
}

impl HttpConnection {
    pub async fn connect(addr: SocketAddr) -> HttpConnection {
        HttpConnection::on(TcpStream::connect(addr).await.expect("connect to broker"))
    }

    /// The same over a connection already open (and perhaps partly written to).
    pub fn on(stream: TcpStream) -> HttpConnection {
        HttpConnection {
            stream,
            buffer: Vec::new(),
        }
    }

    /// Sends `method path` with `headers` (a `Host` is added) and reads the answer.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> std::io::Result<HttpResponse> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        self.stream.write_all(head.as_bytes()).await?;
        self.read_response(method.eq_ignore_ascii_case("HEAD"))
            .await
    }

    /// Reads one answer; `to_head` means it has no body whatever its Content-Length says.
    pub async fn read_response(&mut self, to_head: bool) -> std::io::Result<HttpResponse> {
        let end = loop {
            if let Some(at) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if self.fill().await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "closed before an answer's head; got {:?}",
                        String::from_utf8_lossy(&self.buffer)
                    ),
                ));
            }
        };
        let head = String::from_utf8_lossy(&self.buffer[..end]).to_string();
        self.buffer.drain(..end);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        assert!(
            version == "HTTP/1.1" || version == "HTTP/1.0",
            "not an HTTP status line: {status_line:?}"
        );
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status code in {status_line:?}"));
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (name, value) = l
                    .split_once(':')
                    .unwrap_or_else(|| panic!("header line without a colon: {l:?}"));
                (name.trim().to_ascii_lowercase(), value.trim().to_string())
            })
            .collect();
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map(|(_, v)| v.parse::<usize>().expect("numeric Content-Length"));
        let body = match (to_head, length) {
            (true, _) => Vec::new(),
            (false, Some(length)) => {
                while self.buffer.len() < length {
                    if self.fill().await? == 0 {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("closed after {} of {length} body bytes", self.buffer.len()),
                        ));
                    }
                }
                self.buffer.drain(..length).collect()
            }
            // No length: the body runs to the end of the connection.
            (false, None) => {
                while self.fill().await? > 0 {}
                std::mem::take(&mut self.buffer)
            }
        };
        Ok(HttpResponse {
            status,
            headers,
            body,
        })
    }

    async fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 8192];
        let n = tokio::time::timeout(DEADLINE, self.stream.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
        self.buffer.extend_from_slice(&chunk[..n]);
        Ok(n)
    }
}

/// Opens one connection per entry of `unfinished` through `addr`, each sending those bytes (the
/// start of a query that never ends), until all of them hold a query place: a `PING` is then
/// refused with 503, which is returned with the connections. A connection answered meanwhile
/// (a probe took the place first, and it was refused) is replaced. Panics when no `PING` is
/// refused within [`DEADLINE`].
pub async fn hold_query_places(
    addr: SocketAddr,
    unfinished: &[&[u8]],
) -> (Vec<TcpStream>, HttpResponse) {
    async fn open(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
        let mut stream = TcpStream::connect(addr).await.expect("connect to broker");
        stream.write_all(bytes).await.expect("send a query start");
        stream
    }
    let mut held = Vec::new();
    for bytes in unfinished {
        held.push(open(addr, bytes).await);
    }
    let end = Instant::now() + DEADLINE;
    loop {
        for (stream, bytes) in held.iter_mut().zip(unfinished) {
            let mut byte = [0u8; 1];
            let answered = !matches!(
                stream.try_read(&mut byte),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            );
            if answered {
                *stream = open(addr, bytes).await;
            }
        }
        let answer = http_get(addr, "/TOTVS_BROKER_QUERY/PING", &[]).await;
        if answer.status != 200 {
            assert_eq!(answer.status, 503, "{}", answer.text());
            return (held, answer);
        }
        assert!(
            Instant::now() < end,
            "a query was never refused with {} places held",
            unfinished.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `GET path` on a new connection through `addr`, with `headers`; panics when no answer comes.
pub async fn http_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    let mut connection = HttpConnection::connect(addr).await;
    connection
        .request("GET", path, headers)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Asks `addr` (a balancer's port) for `GET /TOTVS_BROKER_QUERY/JSON` and returns the parsed
/// answer: the live state of that balancer and its servers.
pub async fn query_json(addr: SocketAddr) -> serde_json::Value {
    let mut stream = TcpStream::connect(addr).await.expect("connect for a query");
    stream
        .write_all(
            b"GET /TOTVS_BROKER_QUERY/JSON HTTP/1.1\r\nHost: appbroker\r\nConnection: close\r\n\r\n",
        )
        .await
        .expect("send the query");
    let mut response = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut response))
        .await
        .expect("query answered in time")
        .expect("read the answer");
    let text = String::from_utf8(response).expect("answer in UTF-8");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {text:?}"));
    assert!(head.starts_with("HTTP/1.1 200"), "query answered {head:?}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("JSON answer: {e}: {body}"))
}

/// The entry of `json` (a [`query_json`] answer) for the server at `address` (`host:port`).
pub fn server_json<'a>(
    json: &'a serde_json::Value,
    address: &str,
) -> Option<&'a serde_json::Value> {
    json["servers"]
        .as_array()
        .expect("`servers` is an array")
        .iter()
        .find(|s| s["server"] == address)
}
