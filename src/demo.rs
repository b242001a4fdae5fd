//! `appbroker demo`: the shipped `appserver.ini.example` with in-process echo servers standing
//! in for its `REMOTE_SERVER`s, so a newcomer sees balancing and quarantine work. Each echo
//! server sends every line back prefixed with its name; typing a server's id on the demo's
//! console stops it (or starts it again). `appbroker demo --client` is the client to talk to
//! it with, since a fresh machine may have neither telnet nor nc.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, Host};

/// The example configuration, built in so the demo runs from anywhere.
pub const EXAMPLE: &str = include_str!("../appserver.ini.example");

/// A stand-in server that can be stopped and started again on the same address.
pub struct EchoServer {
    /// `REMOTE_SERVER_<id>` and balancer it stands in for, as its replies name it.
    pub name: String,
    /// Where it listens.
    pub address: SocketAddr,
    running: Option<CancellationToken>,
}

impl EchoServer {
    /// Binds and starts serving.
    pub async fn start(name: String, address: SocketAddr) -> io::Result<Self> {
        let mut server = EchoServer {
            name,
            address,
            running: None,
        };
        server.resume().await?;
        Ok(server)
    }

    /// True while it accepts clients.
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Closes the port and every connection, as a crashed server would.
    pub fn stop(&mut self) {
        if let Some(token) = self.running.take() {
            token.cancel();
        }
    }

    /// Listens again on the same address.
    pub async fn resume(&mut self) -> io::Result<()> {
        let listener = TcpListener::bind(self.address).await?;
        let token = CancellationToken::new();
        tokio::spawn(accept(listener, self.name.clone(), token.clone()));
        self.running = Some(token);
        Ok(())
    }
}

async fn accept(listener: TcpListener, name: String, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    let prefix = format!("[{name}] ");
                    tokio::spawn(stop.clone().run_until_cancelled_owned(echo(stream, prefix)));
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

/// Starts an echo server on every server address of `config` (which must be IP addresses of
/// this machine), keyed by `<balancer section>/<id>`.
pub async fn start_servers(config: &Config) -> io::Result<BTreeMap<String, EchoServer>> {
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
            let server = EchoServer::start(name, address).await.map_err(|e| {
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
pub async fn console(mut servers: BTreeMap<String, EchoServer>) {
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
/// page, the console.
pub fn introduce(config: &Config, servers: usize, client_command: &str) {
    info!("demo: {servers} echo servers stand in for the REMOTE_SERVERs");
    let listen = config.balancers.first().map(|b| b.listen.ip());
    if let Some(address) = listen.and_then(|ip| client_address(config, ip)) {
        info!(
            "demo: talk to it from another terminal with `{client_command}`: type a line, and \
             the server that answered sends it back with its name in front"
        );
        let host = match address.ip() {
            IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        };
        info!(
            "demo: watch it at http://{host}:{}/TOTVS_BROKER_QUERY/STATUS",
            address.port()
        );
    }
    info!(
        "demo: type a server id (01, 02, ...) and Enter here to stop or start the servers with \
         that id; Enter alone lists them; Ctrl-C ends the demo"
    );
}

/// Where a client reaches the first balancer of `config` once it listens on `listen`: that
/// address, or the loopback address when it is a wildcard.
pub fn client_address(config: &Config, listen: IpAddr) -> Option<SocketAddr> {
    let port = config.balancers.first()?.listen.port();
    let ip = match listen {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Some(SocketAddr::new(ip, port))
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
