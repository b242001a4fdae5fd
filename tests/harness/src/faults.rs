//! Servers that misbehave on command (hang, answer wrongly, trickle, never read, go down and
//! up without resetting anyone), the byte patterns that show corruption, and the client-side
//! checks of fault tests.

use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::servers::reserve;
use super::{DEADLINE, within};

// ---------------------------------------------------------------------------------------------
// A server that misbehaves on command
// ---------------------------------------------------------------------------------------------

/// How a [`FaultServer`] treats a connection; read when the connection is accepted, so a
/// change applies to the connections that follow.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Line by line: `PING\r\n` (the probe these tests configure for SEND_EXPECT) gets
    /// `PONG\r\n`; `drip <n> <ms>` gets `n` lines `<name>: tick <i>`, one every `ms`;
    /// `quiet <text>` gets nothing; any other line is echoed as `<name>: <line>`.
    Healthy,
    /// As `Healthy`, but every reply goes out one byte at a time, this long apart.
    Paced(Duration),
    /// Reads everything, never writes a byte: the port accepts but the application hangs.
    Hang,
    /// Answers the first bytes it reads with `bytes`, then closes or reads on in silence.
    Reply {
        /// The answer.
        bytes: Vec<u8>,
        /// Closes right after it (else reads on in silence).
        then_close: bool,
    },
    /// Sends `len` bytes of pattern `seed` a few bytes at a time with short pauses, then shuts
    /// its side down; meanwhile reads the client's bytes a few at a time, with pauses too.
    Trickle {
        /// The pattern's seed ([`pattern`]).
        seed: u64,
        /// How many bytes.
        len: u64,
    },
    /// Sends `len` bytes of pattern `seed` as fast as they are taken, then shuts its side down.
    Blast {
        /// The pattern's seed ([`pattern`]).
        seed: u64,
        /// How many bytes.
        len: u64,
    },
    /// Never reads: its receive window fills and stays full until [`FaultServer::hang_up`].
    NeverRead,
    /// Reads nothing until the token is cancelled, then everything (recorded) to the end.
    ReadAfter(CancellationToken),
}

/// One accepted connection, as the server saw it.
pub struct Conn {
    /// The connecting side's address (for the broker: its server-side socket).
    pub peer: SocketAddr,
    /// Every byte read from it, unless the mode discards what it reads.
    received: Mutex<Vec<u8>>,
    /// The server is done with it: the peer ended it, or the test hung up.
    ended: AtomicBool,
}

impl Conn {
    /// Keeps `bytes` read from it.
    pub fn record(&self, bytes: &[u8]) {
        self.received.lock().unwrap().extend_from_slice(bytes);
    }

    /// Every byte read from it so far.
    pub fn received(&self) -> Vec<u8> {
        self.received.lock().unwrap().clone()
    }

    /// Whether the server is done with it.
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }
}

/// What the accepting task and the connections share with the test.
struct Shared {
    name: String,
    mode: Mutex<Behaviour>,
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Cancelled by [`FaultServer::hang_up`]: the connections open then are dropped.
    hang_up: Mutex<CancellationToken>,
    /// Cancelled when the server is dropped.
    gone: CancellationToken,
}

impl Shared {
    fn serve(self: &Arc<Self>, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let conn = Arc::new(Conn {
            peer: stream.peer_addr().expect("peer address"),
            received: Mutex::default(),
            ended: AtomicBool::new(false),
        });
        self.conns.lock().unwrap().push(Arc::clone(&conn));
        let mode = self.mode.lock().unwrap().clone();
        let hang_up = self.hang_up.lock().unwrap().clone();
        let gone = self.gone.clone();
        let name = self.name.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = gone.cancelled() => {}
                _ = hang_up.cancelled() => {}
                _ = behave(stream, mode, &name, &conn) => {}
            }
            conn.ended.store(true, Ordering::SeqCst);
        });
    }
}

/// A loopback (or namespace) server that behaves as the test sets it ([`Behaviour`]), and can
/// go down and come back up on the same port without dropping a connection in between.
pub struct FaultServer {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    accepting: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
    /// While down, the port stays bound without listening: connects are refused, and no other
    /// test can be given the port.
    reserved: Option<socket2::Socket>,
}

impl FaultServer {
    /// A server named `name` on a fresh loopback port, treating connections as `mode` says.
    pub async fn start(name: &str, mode: Behaviour) -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        FaultServer::on(name, mode, listener)
    }

    /// A server on a listener made elsewhere (in a network namespace).
    pub fn on(name: &str, mode: Behaviour, listener: TcpListener) -> FaultServer {
        let shared = Arc::new(Shared {
            name: name.to_string(),
            mode: Mutex::new(mode),
            conns: Mutex::default(),
            hang_up: Mutex::default(),
            gone: CancellationToken::new(),
        });
        let addr = listener.local_addr().unwrap();
        let accepting = Some(spawn_accepting(listener, Arc::clone(&shared)));
        FaultServer {
            addr,
            shared,
            accepting,
            reserved: None,
        }
    }

    /// How the connections accepted from now on are treated.
    pub fn set_mode(&self, mode: Behaviour) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// `REMOTE_SERVER` value: `<ip> <port>`.
    pub fn ini(&self) -> String {
        format!("{} {}", self.addr.ip(), self.addr.port())
    }

    /// `host:port` as the broker names it.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// Every connection accepted so far, in order.
    pub fn connections(&self) -> Vec<Arc<Conn>> {
        self.shared.conns.lock().unwrap().clone()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.conns.lock().unwrap().len()
    }

    /// True when some connection received a byte string containing `needle`.
    pub fn received_somewhere(&self, needle: &[u8]) -> bool {
        self.connections()
            .iter()
            .any(|c| c.received().windows(needle.len()).any(|w| w == needle))
    }

    /// Drops every connection open now (one with unread bytes is reset, as the kernel does).
    pub fn hang_up(&self) {
        let mut token = self.shared.hang_up.lock().unwrap();
        token.cancel();
        *token = CancellationToken::new();
    }

    /// Stops listening; connections already accepted, or completed by the kernel and waiting
    /// to be accepted, are served to their end. Returns once connects are refused.
    pub async fn down(&mut self) {
        if let Some((stop, accepting)) = self.accepting.take() {
            let _ = stop.send(());
            accepting.await.unwrap();
            self.reserved = reserve(self.addr);
        }
    }

    /// Listens again on the same port.
    pub async fn up(&mut self) {
        if self.accepting.is_some() {
            return;
        }
        self.reserved = None;
        let listener = crate::bind_again(self.addr).await;
        self.accepting = Some(spawn_accepting(listener, Arc::clone(&self.shared)));
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.shared.gone.cancel();
        if let Some((_, accepting)) = self.accepting.take() {
            accepting.abort();
        }
    }
}

/// Accepts until told to stop, then closes the listener without resetting anyone.
fn spawn_accepting(
    listener: TcpListener,
    shared: Arc<Shared>,
) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, mut stopped) = oneshot::channel::<()>();
    let accepting = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        shared.serve(stream);
                    }
                }
            }
        }
        close_without_resets(listener, &shared).await;
    });
    (stop, accepting)
}

/// Closing a listener resets the connections the kernel completed but nobody accepted yet: a
/// broker that had just connected would see its client's bytes refused, a failure of this
/// test server, not of the broker. So the listener closes only when the one connection queued
/// is a filler of its own, and no other can be: with a backlog of 0 the kernel queues one
/// connection and drops the SYNs that come while it waits (a connect that meets that waits,
/// as for a host that went away, until its SYN is refused or its CONNECT_TIMEOUT). Real
/// connections that got in first are served. (No privilege needed, unlike a socket filter.)
async fn close_without_resets(listener: TcpListener, shared: &Arc<Shared>) {
    let address = listener.local_addr().unwrap();
    socket2::SockRef::from(&listener)
        .listen(0)
        .expect("lower the backlog");
    loop {
        let filler = match address {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }
        .unwrap();
        filler.bind(SocketAddr::new(address.ip(), 0)).unwrap();
        let filler_address = filler.local_addr().unwrap();
        tokio::select! {
            biased;
            // Connected: the filler is the connection queued, and the queue is full.
            Ok(_filler) = filler.connect(address) => return,
            accepted = listener.accept() => {
                // A real connection was first (the filler's SYN was dropped, or is under
                // way): serve it, and try again with a new filler.
                if let Ok((stream, peer)) = accepted
                    && peer != filler_address
                {
                    shared.serve(stream);
                }
            }
        }
    }
}

async fn behave(stream: TcpStream, mode: Behaviour, name: &str, conn: &Conn) -> io::Result<()> {
    match mode {
        Behaviour::Healthy => healthy(stream, name, conn, None).await,
        Behaviour::Paced(pace) => healthy(stream, name, conn, Some(pace)).await,
        Behaviour::Hang => read_silently(stream, conn).await,
        Behaviour::Reply { bytes, then_close } => {
            let mut stream = stream;
            let mut buf = [0u8; 512];
            let n = stream.read(&mut buf).await?;
            conn.record(&buf[..n]);
            stream.write_all(&bytes).await?;
            if then_close {
                return Ok(());
            }
            read_silently(stream, conn).await
        }
        Behaviour::Trickle { seed, len } => {
            let (mut read, mut write) = stream.into_split();
            let sending = async {
                trickle(&mut write, seed, len).await?;
                write.shutdown().await
            };
            let reading = async {
                read_slowly(&mut read, |bytes| conn.record(bytes)).await;
                Ok::<_, io::Error>(())
            };
            let (sent, _) = tokio::join!(sending, reading);
            sent
        }
        Behaviour::Blast { seed, len } => {
            let (read, mut write) = stream.into_split();
            let sending = async {
                send_pattern(&mut write, seed, len).await?;
                write.shutdown().await
            };
            let (sent, _) = tokio::join!(sending, read_silently(read, conn));
            sent
        }
        Behaviour::NeverRead => {
            let _held = stream;
            std::future::pending().await
        }
        Behaviour::ReadAfter(start) => {
            start.cancelled().await;
            read_silently(stream, conn).await
        }
    }
}

async fn healthy(
    stream: TcpStream,
    name: &str,
    conn: &Conn,
    pace: Option<Duration>,
) -> io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return write.shutdown().await;
        }
        conn.record(&line);
        let reply = if line == b"PING\r\n" {
            b"PONG\r\n".to_vec()
        } else if line.starts_with(b"quiet ") {
            continue;
        } else if let Some((count, every)) = drip_command(&line) {
            for i in 0..count {
                tokio::time::sleep(every).await;
                write
                    .write_all(format!("{name}: tick {i}\n").as_bytes())
                    .await?;
            }
            continue;
        } else {
            let mut reply = format!("{name}: ").into_bytes();
            reply.extend_from_slice(&line);
            reply
        };
        match pace {
            // One write per reply: two small writes would meet Nagle and delayed ACKs.
            None => write.write_all(&reply).await?,
            Some(pace) => {
                for byte in reply {
                    write.write_all(&[byte]).await?;
                    tokio::time::sleep(pace).await;
                }
            }
        }
    }
}

/// Parses `drip <count> <ms>\n`.
fn drip_command(line: &[u8]) -> Option<(u32, Duration)> {
    let text = std::str::from_utf8(line).ok()?.trim_end();
    let mut words = text.strip_prefix("drip ")?.split(' ');
    let count = words.next()?.parse().ok()?;
    let ms = words.next()?.parse().ok()?;
    Some((count, Duration::from_millis(ms)))
}

/// Reads (and records) until the end, never writing.
async fn read_silently(mut from: impl AsyncRead + Unpin, conn: &Conn) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        conn.record(&buf[..n]);
    }
}

/// Writes `len` bytes of pattern `seed` 1 to 8 bytes at a time, pausing 1 to 3 ms after each.
pub async fn trickle(mut to: impl AsyncWrite + Unpin, seed: u64, len: u64) -> io::Result<()> {
    let data = pattern(seed, 0, len as usize);
    let (mut at, mut step) = (0usize, 0usize);
    while at < data.len() {
        let size = (1 + step * 5 % 8).min(data.len() - at);
        to.write_all(&data[at..at + size]).await?;
        at += size;
        step += 1;
        tokio::time::sleep(Duration::from_millis(1 + (step % 3) as u64)).await;
    }
    Ok(())
}

/// Reads to the end three bytes at a time, pausing 1 ms every 16 reads; hands each piece to
/// `sink`.
pub async fn read_slowly(mut from: impl AsyncRead + Unpin, mut sink: impl FnMut(&[u8])) {
    let mut buf = [0u8; 3];
    for reads in 1.. {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => sink(&buf[..n]),
        }
        if reads % 16 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bytes that show corruption
// ---------------------------------------------------------------------------------------------

/// Byte `i` of stream `seed` is byte `i % 8` of a hash of (`seed`, `i / 8`): every position
/// has its own value, so a lost, repeated or reordered chunk shows at its offset (the same
/// pattern as tests/relay.rs).
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len + 16);
    for word in offset / 8..(offset + len as u64).div_ceil(8) {
        // splitmix64's finaliser
        let mut z = (seed << 40 ^ word).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        bytes.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    let skip = (offset % 8) as usize;
    bytes.drain(..skip);
    bytes.truncate(len);
    bytes
}

/// Writes `total` bytes of stream `seed` in 256 KiB pieces.
pub async fn send_pattern(
    mut to: impl AsyncWrite + Unpin,
    seed: u64,
    total: u64,
) -> io::Result<()> {
    const CHUNK: u64 = 256 * 1024;
    let mut sent = 0;
    while sent < total {
        let len = CHUNK.min(total - sent);
        to.write_all(&pattern(seed, sent, len as usize)).await?;
        sent += len;
    }
    Ok(())
}

/// As [`send_pattern`], storing in `written` how many bytes are written so far.
pub async fn send_counted(
    mut to: impl AsyncWrite + Unpin,
    seed: u64,
    total: u64,
    written: &AtomicU64,
) -> io::Result<()> {
    const CHUNK: u64 = 64 * 1024;
    let mut sent = 0;
    while sent < total {
        let len = CHUNK.min(total - sent);
        to.write_all(&pattern(seed, sent, len as usize)).await?;
        sent += len;
        written.store(sent, Ordering::SeqCst);
    }
    Ok(())
}

/// Waits until `written` has not moved for half a second (the writer is blocked: the buffers
/// on the way are full), or `done()`; calls `sample` every 50 ms meanwhile. The wait only
/// decides when a test goes on: no assertion rests on how long it took.
pub async fn until_writes_stop(
    written: &AtomicU64,
    done: impl Fn() -> bool,
    mut sample: impl FnMut(),
) {
    let (mut last, mut unchanged) = (0, 0);
    let end = Instant::now() + DEADLINE;
    while unchanged < 10 && !done() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        sample();
        let now = written.load(Ordering::SeqCst);
        unchanged = if now == last && now > 0 {
            unchanged + 1
        } else {
            0
        };
        last = now;
    }
}

/// The offset of the first byte of `got` that is not pattern `seed`'s, or of its end when it
/// is short of `len`; `None` when it is exactly the first `len` bytes of the pattern.
pub fn first_wrong(got: &[u8], seed: u64, len: u64) -> Option<u64> {
    let want = pattern(seed, 0, len as usize);
    let differ = got.iter().zip(&want).position(|(g, w)| g != w);
    match differ {
        Some(at) => Some(at as u64),
        None if got.len() as u64 != len => Some(got.len().min(want.len()) as u64),
        None => None,
    }
}

/// An ini with one balancer on `@PORT@` over `servers` (`ip port` each), plus `extra` lines.
/// Monitoring is disabled unless `extra` sets it.
/// Keepalive settings that give a dead peer up after 1 + 1 x 2 = 3 s.
pub const SHORT_KEEPALIVE: &str = "KEEPALIVE_TIME=1\nKEEPALIVE_INTERVAL=1\nKEEPALIVE_COUNT=2\n";
/// How long [`SHORT_KEEPALIVE`] takes to give a dead peer up.
pub const SHORT_KEEPALIVE_GIVES_UP_AFTER: Duration = Duration::from_secs(3);

/// An ini like [`ini_for`](crate::ini_for)'s over `servers` given as `REMOTE_SERVER` values (as
/// [`FaultServer::ini`] gives them), with `extra` lines in the section.
pub fn ini_over(servers: &[String], extra: &str) -> String {
    crate::Ini::new()
        .balancer("BALANCE_SMART_CLIENT_DESKTOP", "@PORT@", extra, servers)
        .text()
}

/// True when the peer has ended `stream` (EOF or an error); false when it is open with nothing
/// to read. Reads nothing that is there.
pub fn ended_stream(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match stream.try_read(&mut buf) {
        Ok(0) => true,
        Ok(_) => panic!("unexpected bytes on a connection expected to be silent"),
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Waits until the peer ends `stream`; returns how the end was seen.
pub async fn wait_end(stream: &mut TcpStream) -> io::Result<usize> {
    let mut buf = [0u8; 64];
    within("the connection to end", stream.read(&mut buf)).await
}

/// Asserts a client saw its connection end: EOF, or a reset (an abort passed on).
pub fn assert_end_seen(what: &str, read: &io::Result<usize>) {
    assert!(
        matches!(read, Ok(0))
            || matches!(read, Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe)),
        "{what}: expected the end of the connection, read {read:?}"
    );
}

/// Sends `line` and checks the whole reply is exactly `<name>: <line>\n` for one of `names`;
/// returns the name.
pub async fn exact_exchange(
    stream: &mut TcpStream,
    line: &str,
    names: &[&str],
) -> io::Result<String> {
    stream.write_all(format!("{line}\n").as_bytes()).await?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while reply.last() != Some(&b'\n') {
        let n = tokio::time::timeout(DEADLINE, stream.read(&mut buf))
            .await
            .map_err(|_| io::Error::new(ErrorKind::TimedOut, "no reply"))??;
        if n == 0 {
            return Err(io::Error::new(
                ErrorKind::UnexpectedEof,
                format!("closed after {:?}", String::from_utf8_lossy(&reply)),
            ));
        }
        reply.extend_from_slice(&buf[..n]);
    }
    for name in names {
        if reply == format!("{name}: {line}\n").as_bytes() {
            return Ok(name.to_string());
        }
    }
    Err(io::Error::other(format!(
        "corrupted reply to {} bytes: {:?}",
        line.len(),
        String::from_utf8_lossy(&reply)
    )))
}
