//! `appbroker demo`: the shipped `appserver.ini.example` with in-process servers standing in
//! for its `REMOTE_SERVER`s, so a newcomer sees balancing, quarantine and session affinity
//! work. Behind a TCP balancer each stand-in is an echo server that sends every line back
//! prefixed with its name; behind an HTTP balancer it is a web server whose page says which
//! server answered (`web`). Typing a server's id on the demo's console stops it (or starts it
//! again). `appbroker demo --client` is the client to talk to it with, since a fresh machine
//! may have neither telnet nor nc.
//!
//! - [`web`]: the stand-in web servers behind the demo's HTTP balancer.

pub mod web;

use std::collections::BTreeMap;
use std::io::{self, BufRead};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, General, Host, show_duration};
use crate::net::sys;
use crate::support::shutdown::Shutdown;

/// The example configuration, built in so the demo runs from anywhere.
pub const EXAMPLE: &str = include_str!("../../appserver.ini.example");

/// Why the demo reloads no file: what `ctl reload` and SIGHUP answer. `built_in`: the demo
/// runs the built-in example rather than a file named with `--config`.
pub fn no_reload(built_in: bool) -> String {
    match built_in {
        true => "the demo runs the built-in appserver.ini.example, which cannot be reloaded: it \
                 is part of the program, not a file; stop the demo (Ctrl-C) and start it again \
                 to start afresh"
            .into(),
        false => "the demo does not reload its file: its stand-in servers and its listening \
                  address (--listen) are set once, at start; stop the demo (Ctrl-C) and start \
                  it again to run the file as it is now"
            .into(),
    }
}

/// How long a stopping demo lets its connections finish before it cuts them: a second, for
/// an exchange in flight, where a broker gives them `SHUTDOWN_TIMEOUT` (30 s in the example).
/// The demo's clients are a person trying it, and Ctrl-C is to stop it now (README).
pub const SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// The demo's shutdown, whatever the file says: no `SHUTDOWN_GRACE`, and
/// [`SHUTDOWN_TIMEOUT`].
pub fn stop_at_once(general: &mut General) {
    general.shutdown_grace = std::time::Duration::ZERO;
    general.shutdown_timeout = SHUTDOWN_TIMEOUT;
}

/// Says, once `shutdown` is asked for (Ctrl-C), that the demo stops at once and what becomes
/// of its clients, so nobody waits for a drain that a broker would make.
pub async fn tell_stopping(shutdown: Shutdown) {
    shutdown.requested().await;
    info!(
        "demo: stopping at once: connections still open after {} are cut (the demo's own \
         SHUTDOWN_TIMEOUT; a broker gives them its file's, 30s by default)",
        show_duration(SHUTDOWN_TIMEOUT)
    );
}

/// The demo's own directory, for its control socket and state file: made afresh in the
/// system's temporary directory, readable by its owner only, and removed when dropped, so a
/// demo neither meets a running broker's socket nor leaves a drain or a quarantine to the next
/// demo (as `/run/appbroker` and `/var/lib/appbroker` would, for a demo run as root).
#[derive(Debug)]
pub struct Scratch {
    dir: std::path::PathBuf,
}

impl Scratch {
    /// Makes the directory: `appbroker-demo-<pid>-<n>`, the first `n` not taken.
    pub fn create() -> io::Result<Scratch> {
        let base = std::env::temp_dir();
        let mut last = None;
        // Another process's directory (or a link planted there) is never reused: only one
        // this call made is.
        for n in 0..100 {
            let dir = base.join(format!("appbroker-demo-{}-{n}", std::process::id()));
            match private_dir(&dir) {
                Ok(()) => return Ok(Scratch { dir }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no name left")))
    }

    /// The control socket's path in it.
    pub fn control_socket(&self) -> std::path::PathBuf {
        self.dir.join("demo.sock")
    }

    /// The state file's path in it.
    pub fn state_file(&self) -> std::path::PathBuf {
        self.dir.join("demo.state")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Makes `dir`, which must not exist, for its owner only (0700 on Unix).
fn private_dir(dir: &std::path::Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// What a stand-in server speaks.
#[derive(Debug, Clone)]
pub enum Speaks {
    /// Lines, each sent back with the server's name in front (behind a TCP balancer).
    Echo,
    /// HTTP: the demo's page, its script and its WebSocket, recording what it served
    /// (behind an HTTP balancer).
    Web(web::Record),
}

/// A stand-in server that can be stopped and started again on the same address.
pub struct StandIn {
    /// `server <id> <address>`, as its answers name it.
    pub name: String,
    /// Where it listens (the port chosen by the system when it was started on port 0).
    pub address: SocketAddr,
    speaks: Speaks,
    running: Option<CancellationToken>,
}

impl StandIn {
    /// Binds and starts serving.
    pub async fn start(name: String, address: SocketAddr, speaks: Speaks) -> io::Result<Self> {
        let mut server = StandIn {
            name,
            address,
            speaks,
            running: None,
        };
        server.resume().await?;
        Ok(server)
    }

    /// True while it accepts clients.
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// What a web stand-in served so far; `None` for an echo server.
    pub fn record(&self) -> Option<&web::Record> {
        match &self.speaks {
            Speaks::Web(record) => Some(record),
            Speaks::Echo => None,
        }
    }

    /// Closes the port and every connection (WebSockets included), as a crashed server would.
    pub fn stop(&mut self) {
        if let Some(token) = self.running.take() {
            token.cancel();
        }
    }

    /// Listens again on the same address.
    pub async fn resume(&mut self) -> io::Result<()> {
        let listener = TcpListener::bind(self.address).await?;
        self.address = listener.local_addr()?;
        let token = CancellationToken::new();
        tokio::spawn(accept(
            listener,
            self.name.clone(),
            self.speaks.clone(),
            token.clone(),
        ));
        self.running = Some(token);
        Ok(())
    }
}

async fn accept(listener: TcpListener, name: String, speaks: Speaks, stop: CancellationToken) {
    let name: Arc<str> = name.into();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                match &speaks {
                    Speaks::Echo => {
                        let prefix = format!("[{name}] ");
                        tokio::spawn(stop.clone().run_until_cancelled_owned(echo(stream, prefix)));
                    }
                    Speaks::Web(record) => {
                        let served = web::serve(stream, Arc::clone(&name), record.clone(), stop.clone());
                        tokio::spawn(stop.clone().run_until_cancelled_owned(served));
                    }
                }
            }
        }
    }
}

/// Sends every line back with the server's name in front.
async fn echo(stream: TcpStream, prefix: String) -> io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        if lines.read_until(b'\n', &mut line).await? == 0 {
            return write.shutdown().await;
        }
        write.write_all(prefix.as_bytes()).await?;
        write.write_all(&line).await?;
    }
}

/// Starts a stand-in on every server address of `config` (which must be IP addresses of this
/// machine): a web server behind an HTTP balancer, an echo server behind the others; keyed by
/// `<balancer section>/<id>`.
pub async fn start_servers(config: &Config) -> io::Result<BTreeMap<String, StandIn>> {
    let mut servers = BTreeMap::new();
    for balancer in &config.balancers {
        for s in &balancer.servers {
            let Host::Ip(ip) = s.host else {
                return Err(io::Error::other(format!(
                    "the demo needs IP addresses; REMOTE_SERVER_{} is {}",
                    s.id, s.host
                )));
            };
            let address = SocketAddr::new(ip, s.port);
            let name = format!("server {} {}", s.id, s.address());
            let speaks = if balancer.kind.is_http() {
                Speaks::Web(web::Record::default())
            } else {
                Speaks::Echo
            };
            let server = StandIn::start(name, address, speaks).await.map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot start the stand-in server on {address}: {e}"),
                )
            })?;
            servers.insert(format!("{}/{}", balancer.kind.section(), s.id), server);
        }
    }
    Ok(servers)
}

/// Reads the demo console: a server id (`02`) stops that server or starts it again; an empty
/// line lists them. The lines are read on a thread of their own ([`read_console`]), and only
/// while the demo has the terminal: a demo started in the background (`appbroker demo &`)
/// says that ids cannot be typed, and keeps serving.
pub async fn console(mut servers: BTreeMap<String, StandIn>) {
    let (typed, mut lines) = tokio::sync::mpsc::channel(8);
    // A blocking read of standard input cannot be cancelled: the thread ends with the process.
    let reader = std::thread::Builder::new()
        .name("demo console".into())
        .spawn(move || read_console(&typed));
    if let Err(e) = reader {
        warn!("demo: cannot read the console ({e}): server ids cannot be typed here");
        return;
    }
    while let Some(line) = lines.recv().await {
        toggle(&mut servers, &line).await;
    }
}

/// What the console does with one typed line.
async fn toggle(servers: &mut BTreeMap<String, StandIn>, line: &str) {
    let wanted = line.trim().to_ascii_uppercase();
    if wanted.is_empty() {
        for (key, server) in servers.iter() {
            let state = if server.is_running() {
                "running"
            } else {
                "stopped"
            };
            info!("demo: {key} on {} is {state}", server.address);
        }
        return;
    }
    let matching: Vec<String> = servers
        .keys()
        .filter(|k| id_of(k) == wanted)
        .cloned()
        .collect();
    if matching.is_empty() {
        let mut ids: Vec<&str> = servers.keys().map(|k| id_of(k)).collect();
        ids.sort_unstable();
        ids.dedup();
        warn!(
            "demo: no server with id {wanted}; the ids are {} (Enter alone lists the servers)",
            ids.join(", ")
        );
        return;
    }
    for key in matching {
        let Some(server) = servers.get_mut(&key) else {
            continue;
        };
        if server.is_running() {
            server.stop();
            info!(
                "demo: stopped {key} ({}); type {wanted} again to start it",
                server.address
            );
        } else {
            match server.resume().await {
                Ok(()) => info!("demo: started {key} ({}) again", server.address),
                Err(e) => warn!("demo: cannot start {key} again: {e}"),
            }
        }
    }
}

/// The id in a stand-in's key (`02` in `BALANCE_HTTP/02`).
fn id_of(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

/// What the console says when it can be typed into.
const TYPE_IDS: &str = "demo: type a server id (01, 02, ...) and Enter here to stop or start \
                        the servers with that id; Enter alone lists them; Ctrl-C ends the demo";

/// What the console says while the demo runs in the background.
const BACKGROUND: &str = "demo: typing server ids is not available while the demo runs in the \
                          background of the terminal (`appbroker demo &`): it serves as usual; \
                          `fg` brings it to the foreground, where ids can be typed and Ctrl-C \
                          ends it";

/// How often a demo in the background looks whether it has the terminal again (`fg`).
const LOOK_AGAIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Sends each line typed on the console to `typed`, until the input ends. Standard input is
/// read only when a read cannot stop the process ([`sys::input_in_background`]): in the
/// background the console says so once and looks again every [`LOOK_AGAIN`], and in the
/// foreground it waits for a line without reading ([`sys::wait_for_input`]), so that a demo
/// put in the background meanwhile (Ctrl-Z, `bg`) is not stopped by its next read.
fn read_console(typed: &tokio::sync::mpsc::Sender<String>) {
    let input = match sys::raw_input() {
        Ok(input) => input,
        Err(e) => {
            warn!("demo: cannot read the console ({e}): server ids cannot be typed here");
            return;
        }
    };
    let mut input = io::BufReader::new(input);
    let mut said_background = None;
    let mut line = Vec::new();
    loop {
        // Lines already read in: no wait, no read of the terminal needed.
        if !input.buffer().contains(&b'\n') {
            let background = sys::input_in_background();
            if said_background != Some(background) {
                said_background = Some(background);
                match background {
                    true => info!("{BACKGROUND}"),
                    false => info!("{TYPE_IDS}"),
                }
            }
            if background {
                std::thread::sleep(LOOK_AGAIN);
                continue;
            }
            if let Err(e) = sys::wait_for_input() {
                warn!("demo: cannot wait for the console ({e}): server ids can no longer be typed");
                return;
            }
            if sys::input_in_background() {
                continue;
            }
        }
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => {
                info!("demo: the console's input has ended: server ids can no longer be typed");
                return;
            }
            Ok(_) => {
                if typed
                    .blocking_send(String::from_utf8_lossy(&line).into_owned())
                    .is_err()
                {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                warn!(
                    "demo: cannot read the console: {}; server ids can no longer be typed",
                    crate::support::os_error::words(&e)
                );
                return;
            }
        }
    }
}

/// Tells the person who started the demo what to do with it: the client command, the status
/// page, the page to open in a browser (the console says itself whether ids can be typed).
pub fn introduce(config: &Config, servers: usize, client_command: &str, ctl_command: &str) {
    info!("demo: {servers} stand-in servers play the REMOTE_SERVERs");
    info!(
        "demo: its control socket and state are in a directory of its own, removed when the \
         demo ends: `{ctl_command}` shows its servers (drain, disable, quarantine... as for a \
         real broker)"
    );
    let listen = config.balancers.first().map(|b| b.listen.ip());
    if let Some(address) = listen.and_then(|ip| client_address(config, ip)) {
        info!(
            "demo: talk to it from another terminal with `{client_command}`: type a line, and \
             the server that answered sends it back with its name in front"
        );
        info!(
            "demo: watch it at {}",
            url(address, "/TOTVS_BROKER_QUERY/STATUS")
        );
    }
    let web = config.balancers.iter().find(|b| b.kind.is_http());
    if let Some(balancer) = web {
        info!(
            "demo: open {} in a browser: the page, its script and its WebSocket say which \
             server answered; reload and the same server answers (the cookie \
             TOTVS_BROKER_SH_001 names it); stop that server here and reload to see the \
             browser move",
            url(reachable(balancer.listen), "/")
        );
    }
}

/// `http://<address><path>`, an IPv6 address in brackets.
fn url(address: SocketAddr, path: &str) -> String {
    format!("http://{address}{path}")
}

/// Where a client reaches the first balancer of `config` once it listens on `listen`: that
/// address, or the loopback address when it is a wildcard.
pub fn client_address(config: &Config, listen: IpAddr) -> Option<SocketAddr> {
    let port = config.balancers.first()?.listen.port();
    Some(reachable(SocketAddr::new(listen, port)))
}

/// Where a client reaches a balancer listening on `listen`: that address, or the loopback
/// address when it is a wildcard.
fn reachable(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// How a demo client's conversation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The user ended the input (Ctrl-D, or the end of a piped file), and the server's
    /// answers were all printed.
    ByUser,
    /// The other side closed the connection while the user could still type, after a server
    /// had answered: the server that answered was stopped, or the demo ended.
    ByServer,
    /// The other side closed the connection with nothing said to what was sent, or while the
    /// user could still type: no server took it (none was available), or the demo ended.
    Unanswered,
}

/// `appbroker demo --client`: a line client for the demo. Sends standard input to `address`
/// (then half-closes), prints what comes back, and returns when the other side closes, saying
/// whether the input had ended first and whether anything came back.
pub fn client(address: SocketAddr) -> io::Result<Ended> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stream = std::net::TcpStream::connect(address)?;
    crate::support::logging::to_stderr(&format!(
        "connected to {address}: type a line and Enter; end of input (Ctrl-D) or Ctrl-C ends"
    ));
    let mut to_server = stream.try_clone()?;
    let input_ended = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let (ended, counted) = (Arc::clone(&input_ended), Arc::clone(&sent));
    std::thread::spawn(move || {
        // Only the end of the input counts, not a server that stopped taking it.
        if let Ok(n) = io::copy(&mut io::stdin().lock(), &mut to_server) {
            counted.store(n, Ordering::SeqCst);
            // Before the half-close, so the server's end it causes is seen as the user's.
            ended.store(true, Ordering::SeqCst);
        }
        let _ = to_server.shutdown(std::net::Shutdown::Write);
    });
    // Standard output is line-buffered: each reply shows as its line ends. When the server
    // closes first, the thread still waiting on standard input ends with the process.
    let received = io::copy(&mut &stream, &mut io::stdout().lock())?;
    let input_ended = input_ended.load(Ordering::SeqCst);
    Ok(match (input_ended, received) {
        (false, 0) => Ended::Unanswered,
        (true, 0) if sent.load(Ordering::SeqCst) > 0 => Ended::Unanswered,
        (true, _) => Ended::ByUser,
        (false, _) => Ended::ByServer,
    })
}

/// Why no server took a demo client on `address`, asked of the broker itself (its JSON, on
/// the same port): the servers that are not available, counted (`3 disabled`, `1 in
/// quarantine, 2 draining`), when none is; `None` when one is, or the broker cannot be asked
/// (the demo ended).
pub fn unavailable(address: SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    /// A demo's JSON is a few kilobytes; more is no answer of the demo's.
    const MOST: u64 = 1024 * 1024;
    let wait = std::time::Duration::from_secs(5);
    let mut stream = std::net::TcpStream::connect_timeout(&address, wait).ok()?;
    stream.set_read_timeout(Some(wait)).ok()?;
    stream
        .write_all(b"GET /TOTVS_BROKER_QUERY/JSON HTTP/1.0\r\nHost: appbroker\r\n\r\n")
        .ok()?;
    let mut answer = Vec::new();
    stream.take(MOST).read_to_end(&mut answer).ok()?;
    let at = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let status: serde_json::Value = serde_json::from_slice(&answer[at + 4..]).ok()?;
    let states: Vec<&str> = status["servers"]
        .as_array()?
        .iter()
        .filter_map(|s| s["state"].as_str())
        .collect();
    if states.is_empty() || states.contains(&"available") {
        return None;
    }
    let count = |names: &[&str]| states.iter().filter(|s| names.contains(s)).count();
    let counts: Vec<String> = [
        (count(&["quarantined"]), "in quarantine"),
        (count(&["disabled"]), "disabled"),
        (count(&["drain", "draining"]), "draining"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, words)| format!("{n} {words}"))
    .collect();
    Some(counts.join(", "))
}
