//! Loopback servers that can be stopped and started again on the same port, and the clients
//! that talk to them through a broker.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as AsyncBufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::DEADLINE;

/// A loopback server that answers each line with `<name>: <line>`, optionally greeting first,
/// and can be stopped (port closed, connections dropped) and started again on the same port.
pub struct TestServer {
    /// What it answers with: `<name>: <line>`.
    pub name: String,
    /// Where it listens; the same port again after [`TestServer::resume`].
    pub addr: SocketAddr,
    /// What it sends first on every connection, if anything.
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

    /// Connections accepted since start.
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
        let listener = bind_again(self.addr).await;
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
pub fn reserve(addr: SocketAddr) -> Option<socket2::Socket> {
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

/// Listens on `addr` again once the port is free (a listener just closed may hold it a
/// moment), failing the test after [`DEADLINE`].
pub async fn bind_again(addr: SocketAddr) -> TcpListener {
    // Not over `poll`: servers go down and up in spawned tasks, and a task cannot hold an
    // async closure (the compiler cannot prove its future `Send` for every borrow).
    let end = Instant::now() + DEADLINE;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(e) => assert!(Instant::now() < end, "cannot bind {addr} again: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// Asks `count` times in a row through `addr`, each on a new connection; who answered each.
pub async fn ask_many(addr: SocketAddr, count: usize) -> Vec<String> {
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        names.push(ask(addr).await.unwrap());
    }
    names
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

/// Connects and returns the connection if a server answered, `None` if the broker closed the
/// client without a word.
pub async fn served(addr: SocketAddr) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    match exchange(&mut stream, "are you there").await {
        Ok(_) => Some(stream),
        Err(e) => {
            assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::BrokenPipe
                ),
                "a refused client should be closed, got {e}"
            );
            None
        }
    }
}

/// Clients through `addr`, one after another with no pause, until one is [`served`]: its
/// connection, and how many were refused before it (a broker at its limit refuses those that
/// come before it has seen a place free again).
pub async fn first_served(addr: SocketAddr) -> (TcpStream, u64) {
    let mut refused = 0;
    let newcomer = "a client served";
    let stream = crate::poll(newcomer, Duration::ZERO, DEADLINE, async || {
        let stream = served(addr).await;
        refused += u64::from(stream.is_none());
        stream.ok_or("")
    })
    .await;
    (stream, refused)
}

/// Two of the demo's stand-in web servers, `server 01` and `server 02`, each on a port of its
/// own: HTTP origins that record what they served, answer a WebSocket, and can be stopped.
pub async fn web_stand_ins() -> [appbroker::demo::StandIn; 2] {
    use appbroker::demo::{Speaks, StandIn, web::Record};
    let any_port = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let start =
        |name: &str| StandIn::start(name.to_string(), any_port, Speaks::Web(Record::default()));
    let (one, two) = (start("server 01").await, start("server 02").await);
    [one.expect("start server 01"), two.expect("start server 02")]
}
