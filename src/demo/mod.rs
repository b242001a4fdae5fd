//! `appbroker demo`: the shipped `appserver.ini.example` with in-process servers standing in
//! for its `REMOTE_SERVER`s, so a newcomer sees balancing, quarantine and session affinity
//! work. Behind a TCP balancer each stand-in is an echo server that sends every line back
//! prefixed with its name; behind an HTTP balancer it is a web server whose page says which
//! server answered (`web`). Typing a server's id on the demo's console stops it (or starts it
//! again). `appbroker demo --client` is the client to talk to it with, since a fresh machine
//! may have neither telnet nor nc.

pub mod web;

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, Host};

/// The example configuration, built in so the demo runs from anywhere.
pub const EXAMPLE: &str = include_str!("../../appserver.ini.example");

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
/// line lists them.
pub async fn console(mut servers: BTreeMap<String, StandIn>) {
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = input.next_line().await {
        let wanted = line.trim().to_ascii_uppercase();
        if wanted.is_empty() {
            for (key, server) in &servers {
                let state = if server.is_running() {
                    "running"
                } else {
                    "stopped"
                };
                info!("demo: {key} on {} is {state}", server.address);
            }
            continue;
        }
        let matching: Vec<&String> = servers
            .keys()
            .filter(|k| k.rsplit('/').next() == Some(wanted.as_str()))
            .collect();
        if matching.is_empty() {
            warn!("demo: no server with id {wanted}; press Enter to list them");
            continue;
        }
        for key in matching.into_iter().cloned().collect::<Vec<_>>() {
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
}

/// Tells the person who started the demo what to do with it: the client command, the status
/// page, the page to open in a browser, the console.
pub fn introduce(config: &Config, servers: usize, client_command: &str) {
    info!("demo: {servers} stand-in servers play the REMOTE_SERVERs");
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
    info!(
        "demo: type a server id (01, 02, ...) and Enter here to stop or start the servers with \
         that id; Enter alone lists them; Ctrl-C ends the demo"
    );
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

/// `appbroker demo --client`: a line client for the demo. Sends standard input to `address`
/// (then half-closes), prints what comes back, and returns when the other side closes.
pub fn client(address: SocketAddr) -> io::Result<()> {
    let stream = std::net::TcpStream::connect(address)?;
    crate::logging::to_stderr(&format!(
        "connected to {address}: type a line and Enter; end of input (Ctrl-D) or Ctrl-C ends"
    ));
    let mut to_server = stream.try_clone()?;
    std::thread::spawn(move || {
        let _ = io::copy(&mut io::stdin().lock(), &mut to_server);
        let _ = to_server.shutdown(std::net::Shutdown::Write);
    });
    // Standard output is line-buffered: each reply shows as its line ends. When the server
    // closes first, the thread still waiting on standard input ends with the process.
    io::copy(&mut &stream, &mut io::stdout().lock())?;
    Ok(())
}
