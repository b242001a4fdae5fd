//! Fault injection through the real broker: servers that hang, answer wrongly, never answer a
//! connect, trickle, never read, flap, or vanish without a word. For each: what the client
//! sees, what the log says, and that no byte is corrupted.
//!
//! The vanished-peer tests make a network namespace (root, `ip`) and the
//! keepalive-timer test reads `ss` (iproute2): they are `#[ignore]`d with what they need, and
//! fail when run without it (`.ci/run` runs them as root).
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::future::Future;
use std::io::{self, ErrorKind};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const MIB: u64 = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// A server that misbehaves on command
// ---------------------------------------------------------------------------------------------

/// How a [`FaultServer`] treats a connection; read when the connection is accepted, so a
/// change applies to the connections that follow.
#[derive(Debug, Clone)]
enum Mode {
    /// Line by line: `PING\r\n` (the probe these tests configure for SEND_EXPECT) gets
    /// `PONG\r\n`; `drip <n> <ms>` gets `n` lines `<name>: tick <i>`, one every `ms`;
    /// `quiet <text>` gets nothing; any other line is echoed as `<name>: <line>`.
    Healthy,
    /// As `Healthy`, but every reply goes out one byte at a time, this long apart.
    Paced(Duration),
    /// Reads everything, never writes a byte: the port accepts but the application hangs.
    Hang,
    /// Answers the first bytes it reads with `bytes`, then closes or reads on in silence.
    Reply { bytes: Vec<u8>, then_close: bool },
    /// Sends `len` bytes of pattern `seed` a few bytes at a time with short pauses, then shuts
    /// its side down; meanwhile reads the client's bytes a few at a time, with pauses too.
    Trickle { seed: u64, len: u64 },
    /// Sends `len` bytes of pattern `seed` as fast as they are taken, then shuts its side down.
    Blast { seed: u64, len: u64 },
    /// Never reads: its receive window fills and stays full until [`FaultServer::hang_up`].
    NeverRead,
    /// Reads nothing until the token is cancelled, then everything (recorded) to the end.
    ReadAfter(CancellationToken),
}

/// One accepted connection, as the server saw it.
struct Conn {
    /// The connecting side's address (for the broker: its server-side socket).
    peer: SocketAddr,
    /// Every byte read from it, unless the mode discards what it reads.
    received: Mutex<Vec<u8>>,
    /// The server is done with it: the peer ended it, or the test hung up.
    ended: AtomicBool,
}

impl Conn {
    fn record(&self, bytes: &[u8]) {
        self.received.lock().unwrap().extend_from_slice(bytes);
    }

    fn received(&self) -> Vec<u8> {
        self.received.lock().unwrap().clone()
    }

    fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }
}

/// What the accepting task and the connections share with the test.
struct Shared {
    name: String,
    mode: Mutex<Mode>,
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

/// A loopback (or namespace) server whose behaviour the test sets with a [`Mode`], and which
/// can go down and come back up on the same port without dropping a connection in between.
struct FaultServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accepting: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
    /// While down, the port stays bound without listening: connects are refused, and no other
    /// test can be given the port.
    reserved: Option<socket2::Socket>,
}

impl FaultServer {
    async fn start(name: &str, mode: Mode) -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        FaultServer::on(name, mode, listener)
    }

    /// A server on a listener made elsewhere (in a network namespace).
    fn on(name: &str, mode: Mode, listener: TcpListener) -> FaultServer {
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

    fn set_mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// `REMOTE_SERVER` value: `<ip> <port>`.
    fn ini(&self) -> String {
        format!("{} {}", self.addr.ip(), self.addr.port())
    }

    /// `host:port` as the broker names it.
    fn address(&self) -> String {
        self.addr.to_string()
    }

    fn connections(&self) -> Vec<Arc<Conn>> {
        self.shared.conns.lock().unwrap().clone()
    }

    fn accepted(&self) -> usize {
        self.shared.conns.lock().unwrap().len()
    }

    /// True when some connection received a byte string containing `needle`.
    fn received_somewhere(&self, needle: &[u8]) -> bool {
        self.connections()
            .iter()
            .any(|c| c.received().windows(needle.len()).any(|w| w == needle))
    }

    /// Drops every connection open now (one with unread bytes is reset, as the kernel does).
    fn hang_up(&self) {
        let mut token = self.shared.hang_up.lock().unwrap();
        token.cancel();
        *token = CancellationToken::new();
    }

    /// Stops listening; connections already accepted, or completed by the kernel and waiting
    /// to be accepted, are served to their end. Returns once connects are refused.
    async fn down(&mut self) {
        if let Some((stop, accepting)) = self.accepting.take() {
            let _ = stop.send(());
            accepting.await.unwrap();
            self.reserved = reserve(self.addr);
        }
    }

    /// Listens again on the same port.
    async fn up(&mut self) {
        if self.accepting.is_some() {
            return;
        }
        self.reserved = None;
        let end = Instant::now() + DEADLINE;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) => {
                    assert!(Instant::now() < end, "cannot bind {} again: {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
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

async fn behave(stream: TcpStream, mode: Mode, name: &str, conn: &Conn) -> io::Result<()> {
    match mode {
        Mode::Healthy => healthy(stream, name, conn, None).await,
        Mode::Paced(pace) => healthy(stream, name, conn, Some(pace)).await,
        Mode::Hang => read_silently(stream, conn).await,
        Mode::Reply { bytes, then_close } => {
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
        Mode::Trickle { seed, len } => {
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
        Mode::Blast { seed, len } => {
            let (read, mut write) = stream.into_split();
            let sending = async {
                send_pattern(&mut write, seed, len).await?;
                write.shutdown().await
            };
            let (sent, _) = tokio::join!(sending, read_silently(read, conn));
            sent
        }
        Mode::NeverRead => {
            let _held = stream;
            std::future::pending().await
        }
        Mode::ReadAfter(start) => {
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
async fn trickle(mut to: impl AsyncWrite + Unpin, seed: u64, len: u64) -> io::Result<()> {
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
async fn read_slowly(mut from: impl AsyncRead + Unpin, mut sink: impl FnMut(&[u8])) {
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
fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
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
async fn send_pattern(mut to: impl AsyncWrite + Unpin, seed: u64, total: u64) -> io::Result<()> {
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
async fn send_counted(
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
async fn until_writes_stop(written: &AtomicU64, done: impl Fn() -> bool, mut sample: impl FnMut()) {
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
fn first_wrong(got: &[u8], seed: u64, len: u64) -> Option<u64> {
    let want = pattern(seed, 0, len as usize);
    let differ = got.iter().zip(&want).position(|(g, w)| g != w);
    match differ {
        Some(at) => Some(at as u64),
        None if got.len() as u64 != len => Some(got.len().min(want.len()) as u64),
        None => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Broker files and logs
// ---------------------------------------------------------------------------------------------

/// An ini with one balancer on `@PORT@` over `servers` (`ip port` each), plus `extra` lines.
/// Monitoring is disabled unless `extra` sets it.
fn ini_over(servers: &[String], extra: &str) -> String {
    let mut ini = ini_for(&[], extra);
    for (i, server) in servers.iter().enumerate() {
        ini.push_str(&format!("REMOTE_SERVER_{:02}={server}\n", i + 1));
    }
    ini
}

/// The index of the first log line that contains every needle, and the line.
fn find_line(broker: &Broker, needles: &[&str]) -> Option<(usize, String)> {
    broker
        .logs()
        .into_iter()
        .enumerate()
        .find(|(_, l)| needles.iter().all(|n| l.contains(n)))
}

/// Waits for a log line containing every needle; returns its index and the line.
async fn wait_line(broker: &Broker, needles: &[&str]) -> (usize, String) {
    let what = format!("a log line with {needles:?}");
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = find_line(broker, needles) {
            return found;
        }
        assert!(
            Instant::now() < end,
            "timed out waiting for {what}; log:\n{}",
            broker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `connection closed` line the broker logs for the client at local address `client`.
async fn closed_line(broker: &Broker, client: SocketAddr) -> String {
    // The span field ends the line or is followed by a space: never matches a longer port.
    let needle = format!("client={client} ");
    let find = || {
        broker
            .logs()
            .into_iter()
            .find(|l| l.contains("connection closed") && format!("{l} ").contains(&needle))
    };
    eventually("the connection closed line", || find().is_some()).await;
    find().unwrap()
}

/// Awaits `future`, failing the test if it takes longer than [`DEADLINE`].
async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// True when the peer has ended `stream` (EOF or an error); false when it is open with nothing
/// to read. Reads nothing that is there.
fn ended(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match stream.try_read(&mut buf) {
        Ok(0) => true,
        Ok(_) => panic!("unexpected bytes on a connection expected to be silent"),
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Waits until the peer ends `stream`; returns how the end was seen.
async fn wait_end(stream: &mut TcpStream) -> io::Result<usize> {
    let mut buf = [0u8; 64];
    within("the connection to end", stream.read(&mut buf)).await
}

/// Asserts a client saw its connection end: EOF, or a reset (an abort passed on).
fn assert_end_seen(what: &str, read: &io::Result<usize>) {
    assert!(
        matches!(read, Ok(0))
            || matches!(read, Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe)),
        "{what}: expected the end of the connection, read {read:?}"
    );
}

/// Sends `line` and checks the whole reply is exactly `<name>: <line>\n` for one of `names`;
/// returns the name.
async fn exact_exchange(stream: &mut TcpStream, line: &str, names: &[&str]) -> io::Result<String> {
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

// ---------------------------------------------------------------------------------------------
// Hung applications and SEND_EXPECT
// ---------------------------------------------------------------------------------------------

/// The SEND_EXPECT settings most tests here use: the probe `PING\r\n`, the reply `PONG`.
const PING_PONG: &str = "MONITORING_TYPE=SEND_EXPECT\nMONITOR_SEND=PING\\r\\n\nMONITOR_EXPECT=PONG\n\
                         CONNECT_TIMEOUT=1s\nMONITOR_INTERVAL=200ms\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_application_is_quarantined_by_send_expect_but_not_by_connection() {
    let hung = FaultServer::start("hung", Mode::Hang).await;
    let ok = FaultServer::start("ok", Mode::Healthy).await;
    let servers = [hung.ini(), ok.ini()];
    let probing = Broker::start(&ini_over(&servers, PING_PONG)).await;
    let connecting = Broker::start(&ini_over(
        &servers,
        "MONITORING_TYPE=CONNECTION\nCONNECT_TIMEOUT=300ms\nMONITOR_INTERVAL=200ms",
    ))
    .await;

    // SEND_EXPECT: the hung server's port accepts, its application never answers the probe.
    let (failed_at, failed) = wait_line(
        &probing,
        &[&format!(
            "server {} failed the monitor check: ",
            hung.address()
        )],
    )
    .await;
    assert!(failed.contains(" ERROR "), "{failed}");
    for needed in [
        "no reply: the port accepts but the application does not answer within 1s",
        "(SEND_EXPECT, expecting `PONG`)",
        "points at the server's application",
    ] {
        assert!(failed.contains(needed), "{needed:?} in {failed}");
    }
    let (quarantined_at, line) = wait_line(
        &probing,
        &[&format!("putting server {} in quarantine", hung.address())],
    )
    .await;
    assert!(line.contains(" (monitor)"), "{line}");
    assert!(failed_at < quarantined_at);
    wait_line(
        &probing,
        &["monitor: OK - 1 server available, 1 server unavailable"],
    )
    .await;
    // Quarantined, the hung server gets no client: every one is answered, by `ok`.
    for i in 0..6 {
        let mut client = TcpStream::connect(probing.addr()).await.unwrap();
        let name = exact_exchange(&mut client, &format!("probing client {i}"), &["ok"])
            .await
            .unwrap_or_else(|e| panic!("client {i}: {e}; log:\n{}", probing.log_text()));
        assert_eq!(name, "ok");
    }
    assert!(
        !hung.received_somewhere(b"probing client"),
        "a client was sent to the quarantined hung server"
    );
    assert!(
        !probing.has_log(&format!("putting server {} in", ok.address())),
        "the healthy server was blamed; log:\n{}",
        probing.log_text()
    );

    // CONNECTION: the same hung server passes round after round...
    connecting
        .wait_for_logs(
            "monitor: OK - 2 servers available, 0 servers unavailable",
            3,
        )
        .await;
    assert!(
        !connecting.has_log("in quarantine"),
        "CONNECTION cannot see a hung application; log:\n{}",
        connecting.log_text()
    );
    // ...and gets clients, who are left waiting. Two held at once: one goes to each server
    // (fewest connections first).
    let mut first = TcpStream::connect(connecting.addr()).await.unwrap();
    let mut second = TcpStream::connect(connecting.addr()).await.unwrap();
    first.write_all(b"connecting client 1\n").await.unwrap();
    second.write_all(b"connecting client 2\n").await.unwrap();
    eventually(
        "a client of the CONNECTION broker to reach the hung server",
        || hung.received_somewhere(b"connecting client"),
    )
    .await;
    let (mut answered, waiting) = if hung.received_somewhere(b"connecting client 1") {
        (second, first)
    } else {
        (first, second)
    };
    let mut reply = vec![0u8; "ok: connecting client 1\n".len()];
    within("the other client's answer", answered.read_exact(&mut reply))
        .await
        .unwrap();
    assert!(reply.starts_with(b"ok: connecting client "), "{reply:?}");
    assert!(
        !ended(&waiting),
        "the hung server's client should be left open and unanswered"
    );
    let mut none = [0u8; 1];
    assert!(
        matches!(waiting.try_read(&mut none), Err(e) if e.kind() == ErrorKind::WouldBlock),
        "the hung server never writes, yet its client got bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_cut_or_stalled_replies_are_quarantined_and_named_a_slow_right_one_passes() {
    let wrong = FaultServer::start(
        "wrong",
        Mode::Reply {
            bytes: b"PANG\r\n".to_vec(),
            then_close: false,
        },
    )
    .await;
    let cut = FaultServer::start(
        "cut",
        Mode::Reply {
            bytes: b"PO".to_vec(),
            then_close: true,
        },
    )
    .await;
    let stalled = FaultServer::start(
        "stalled",
        Mode::Reply {
            bytes: b"PO".to_vec(),
            then_close: false,
        },
    )
    .await;
    // `PONG\r\n` a byte every 20 ms: complete well within CONNECT_TIMEOUT=1s.
    let paced = FaultServer::start("paced", Mode::Paced(Duration::from_millis(20))).await;
    let ok = FaultServer::start("ok", Mode::Healthy).await;
    let servers = [&wrong, &cut, &stalled, &paced, &ok].map(FaultServer::ini);
    let broker = Broker::start(&ini_over(&servers, PING_PONG)).await;

    let (_, line) = wait_line(
        &broker,
        &[&format!(
            "server {} failed the monitor check: ",
            wrong.address()
        )],
    )
    .await;
    assert!(
        line.contains(concat!(
            r"unexpected reply `PANG\r\n` (SEND_EXPECT, expecting `PONG`); ",
            "points at the server's application or a wrong MONITOR_EXPECT"
        )),
        "{line}"
    );
    let (_, line) = wait_line(
        &broker,
        &[&format!(
            "server {} failed the monitor check: ",
            cut.address()
        )],
    )
    .await;
    assert!(
        line.contains("closed after `PO` (SEND_EXPECT, expecting `PONG`)"),
        "{line}"
    );
    let (_, line) = wait_line(
        &broker,
        &[&format!(
            "server {} failed the monitor check: ",
            stalled.address()
        )],
    )
    .await;
    assert!(
        line.contains("incomplete reply `PO` within 1s (SEND_EXPECT, expecting `PONG`)"),
        "{line}"
    );
    for server in [&wrong, &cut, &stalled] {
        let (_, line) = wait_line(
            &broker,
            &[&format!(
                "putting server {} in quarantine",
                server.address()
            )],
        )
        .await;
        assert!(line.contains(" (monitor)"), "{line}");
    }
    wait_line(
        &broker,
        &["monitor: OK - 2 servers available, 3 servers unavailable"],
    )
    .await;
    // The probe reached the servers byte for byte.
    assert_eq!(wrong.connections()[0].received(), b"PING\r\n");
    // Clients go to the two that passed, and get every byte, however slowly it comes.
    let mut names = Vec::new();
    for i in 0..4 {
        let mut client = TcpStream::connect(broker.addr()).await.unwrap();
        let name = exact_exchange(&mut client, &format!("after {i}"), &["ok", "paced"])
            .await
            .unwrap_or_else(|e| panic!("client {i}: {e}; log:\n{}", broker.log_text()));
        names.push(name);
    }
    assert!(names.iter().any(|n| n == "paced"), "{names:?}");
    for server in [&paced, &ok] {
        assert!(
            !broker.has_log(&format!("server {} failed", server.address())),
            "log:\n{}",
            broker.log_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_in_monitor_send_and_expect_are_bytes_on_the_wire() {
    // Any byte can be sent and expected: NUL, 0xFF, a tab, a backslash, CR LF.
    const PROBE: &[u8] = b"\x00\x01HELLO\t\\\r\n";
    let good = FaultServer::start(
        "good",
        Mode::Reply {
            bytes: b"\x00OK\xff and more".to_vec(),
            then_close: false,
        },
    )
    .await;
    let bad = FaultServer::start(
        "bad",
        Mode::Reply {
            bytes: b"\x00OK\xfe".to_vec(),
            then_close: false,
        },
    )
    .await;
    let settings = r"MONITORING_TYPE=SEND_EXPECT
MONITOR_SEND=\x00\x01HELLO\t\\\r\n
MONITOR_EXPECT=\x00OK\xFf
CONNECT_TIMEOUT=300ms
MONITOR_INTERVAL=200ms
";
    let broker = Broker::start(&ini_over(&[good.ini(), bad.ini()], settings)).await;

    let (_, line) = wait_line(
        &broker,
        &[&format!(
            "server {} failed the monitor check: ",
            bad.address()
        )],
    )
    .await;
    assert!(
        line.contains(r"unexpected reply `\x00OK\xFE` (SEND_EXPECT, expecting `\x00OK\xFF`)"),
        "{line}"
    );
    broker
        .wait_for_logs("monitor: OK - 1 server available, 1 server unavailable", 2)
        .await;
    for server in [&good, &bad] {
        // Every probe read so far (a round may be under way: its probe not read yet).
        let probes: Vec<Vec<u8>> = server
            .connections()
            .iter()
            .map(|c| c.received())
            .filter(|r| !r.is_empty())
            .collect();
        assert!(probes.len() >= 2, "{} probed twice", server.address());
        for probe in probes {
            assert_eq!(probe, PROBE, "the probe {} received", server.address());
        }
    }
    assert!(
        !broker.has_log(&format!("server {} failed", good.address())),
        "the server answering `\\x00OK\\xFF...` passes; log:\n{}",
        broker.log_text()
    );
    assert!(!broker.has_log(&format!("putting server {} in", good.address())));
    assert!(broker.has_log(&format!("putting server {} in", bad.address())));
}

// ---------------------------------------------------------------------------------------------
// MONITOR_FALL and MONITOR_RISE
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_fall_quarantines_only_at_the_third_failed_round() {
    let a = FaultServer::start("a", Mode::Healthy).await;
    let mut b = FaultServer::start("b", Mode::Healthy).await;
    let broker = Broker::start(&ini_over(
        &[a.ini(), b.ini()],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=200ms\nMONITOR_FALL=3",
    ))
    .await;
    wait_line(
        &broker,
        &["monitor: OK - 2 servers available, 0 servers unavailable"],
    )
    .await;
    // No client is sent while b fails: a client's failed connect would quarantine it at once.
    b.down().await;

    let check = format!("server {} failed the monitor check", b.address());
    let (quarantined_at, line) = wait_line(
        &broker,
        &[&format!("putting server {} in quarantine", b.address())],
    )
    .await;
    assert!(line.contains(" (monitor)"), "{line}");
    let logs = broker.logs();
    let failures: Vec<(usize, &String)> = logs
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains(&check))
        .take(3)
        .collect();
    assert_eq!(failures.len(), 3, "log:\n{}", broker.log_text());
    let (first, second, third) = (failures[0].1, failures[1].1, failures[2].1);
    assert!(first.contains(" WARN "), "{first}");
    assert!(
        first.contains("(1 of MONITOR_FALL=3 before quarantine): connection refused"),
        "{first}"
    );
    assert!(second.contains(" WARN "), "{second}");
    assert!(
        second.contains("(2 of MONITOR_FALL=3 before quarantine): connection refused"),
        "{second}"
    );
    assert!(third.contains(" ERROR "), "{third}");
    assert!(
        third.contains(&format!("{check}: connection refused")),
        "{third}"
    );
    assert!(
        failures[2].0 < quarantined_at,
        "the quarantine follows the third failure"
    );
    assert!(
        !logs[..failures[2].0]
            .iter()
            .any(|l| l.contains("in quarantine")),
        "quarantined before the third failed round; log:\n{}",
        broker.log_text()
    );
    assert!(!broker.has_log(&format!("putting server {} in", a.address())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_rise_releases_only_after_the_second_passed_round() {
    let a = FaultServer::start("a", Mode::Healthy).await;
    let b = FaultServer::start("b", Mode::Healthy).await;
    let broker = Broker::start(&ini_over(
        &[a.ini(), b.ini()],
        &format!("{PING_PONG}MONITOR_RISE=2"),
    ))
    .await;
    wait_line(
        &broker,
        &["monitor: OK - 2 servers available, 0 servers unavailable"],
    )
    .await;
    // b's application hangs (its port still accepts) until it is healthy again.
    b.set_mode(Mode::Hang);
    let (quarantined_at, line) = wait_line(
        &broker,
        &[&format!("putting server {} in quarantine", b.address())],
    )
    .await;
    assert!(line.contains(" (monitor)"), "{line}");
    b.set_mode(Mode::Healthy);

    let (released_at, _) = wait_line(
        &broker,
        &[&format!(
            "releasing server {} from quarantine (monitor check passed)",
            b.address()
        )],
    )
    .await;
    // b's check results up to the release: since its last failure, exactly one pass (the
    // first of two) came before the release. (A loaded machine may make b fail a round while
    // it recovers; the count then starts again.)
    let logs = broker.logs();
    let (passed, failed) = (
        format!("server {} passed the monitor check", b.address()),
        format!("server {} failed the monitor check", b.address()),
    );
    let since_failure: Vec<(usize, &String)> = logs[..released_at]
        .iter()
        .enumerate()
        .rev()
        .take_while(|(_, l)| !l.contains(&failed))
        .filter(|(_, l)| l.contains(&passed))
        .collect();
    assert_eq!(
        since_failure.len(),
        1,
        "one passed round before the release; log:\n{}",
        broker.log_text()
    );
    let (pass_at, pass) = since_failure[0];
    assert!(
        pass.contains("(1 of MONITOR_RISE=2 to leave quarantine)"),
        "{pass}"
    );
    assert!(quarantined_at < pass_at && pass_at < released_at);
    // The quarantine held until then: one release line only.
    assert_eq!(
        broker.count_logs(&format!("releasing server {}", b.address())),
        1
    );
    // Released, b takes clients again.
    let mut names = Vec::new();
    for i in 0..4 {
        let mut client = TcpStream::connect(broker.addr()).await.unwrap();
        names.push(
            exact_exchange(&mut client, &format!("back {i}"), &["a", "b"])
                .await
                .unwrap(),
        );
    }
    assert!(names.iter().any(|n| n == "b"), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_failed_connect_quarantines_at_once_whatever_monitor_fall() {
    let a = FaultServer::start("a", Mode::Healthy).await;
    let mut b = FaultServer::start("b", Mode::Healthy).await;
    // One round at start, then none for a minute: only clients can find b down.
    let broker = Broker::start(&ini_over(
        &[a.ini(), b.ini()],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=60\nMONITOR_FALL=3",
    ))
    .await;
    wait_line(
        &broker,
        &["monitor: OK - 2 servers available, 0 servers unavailable"],
    )
    .await;
    b.down().await;

    let quarantine = format!("putting server {} in quarantine", b.address());
    for i in 0..4 {
        let mut client = TcpStream::connect(broker.addr()).await.unwrap();
        let name = exact_exchange(&mut client, &format!("client {i}"), &["a"])
            .await
            .unwrap_or_else(|e| panic!("client {i}: {e}; log:\n{}", broker.log_text()));
        assert_eq!(name, "a");
        if broker.has_log(&quarantine) {
            break;
        }
    }
    let (_, line) = wait_line(&broker, &[&quarantine]).await;
    assert!(line.contains(" (connect)"), "{line}");
    let (_, error) = wait_line(
        &broker,
        &[&format!("cannot connect to server {}", b.address())],
    )
    .await;
    assert!(error.contains("connection refused"), "{error}");
    assert_eq!(
        broker.count_logs(&format!("cannot connect to server {}", b.address())),
        1,
        "one failed connect is enough; log:\n{}",
        broker.log_text()
    );
    assert!(
        !broker.has_log("MONITOR_FALL"),
        "MONITOR_FALL counts monitor rounds only; log:\n{}",
        broker.log_text()
    );
}

// ---------------------------------------------------------------------------------------------
// A connect that hangs
// ---------------------------------------------------------------------------------------------

/// A listener that never accepts, with its accept queue full, so a new connect to it gets no
/// answer at all and hangs as it would to a host that is down: Linux drops a SYN that finds
/// the accept queue full (`tcp_conn_request`), whatever the other settings. Returns the
/// listener and the connections filling its queue (both must be kept).
async fn unresponsive_listener() -> (std::net::TcpListener, Vec<TcpStream>) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let address: SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&address.into()).unwrap();
    socket.listen(0).unwrap();
    let listener: std::net::TcpListener = socket.into();
    let address = listener.local_addr().unwrap();
    let mut held = Vec::new();
    // A loopback connect completes in microseconds; one still pending after this long is
    // hanging on a full queue. Linux queues one connection for listen(0).
    const PROBE: Duration = Duration::from_millis(200);
    for _ in 0..8 {
        match tokio::time::timeout(PROBE, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => held.push(stream),
            Ok(Err(e)) => panic!("connect to the full listener failed: {e}"),
            Err(_) => return (listener, held),
        }
    }
    panic!(
        "this kernel completed every connect to a listener whose accept queue is full; Linux \
         drops them, and these tests need a connect that hangs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_arriving_together_all_pass_a_server_whose_connect_hangs() {
    let (listener, _queue) = unresponsive_listener().await;
    let hanging = listener.local_addr().unwrap();
    let ok = FaultServer::start("ok", Mode::Healthy).await;
    let broker = Broker::start(&ini_over(
        &[format!("127.0.0.1 {}", hanging.port()), ok.ini()],
        "CONNECT_TIMEOUT=300ms",
    ))
    .await;

    // Eight clients at once, so several meet the hanging server before any quarantine.
    let mut clients = Vec::new();
    for i in 0..8 {
        let addr = broker.addr();
        clients.push(tokio::spawn(async move {
            let mut client = TcpStream::connect(addr).await?;
            let line = format!("together {i} {}", "x".repeat(i * 500));
            exact_exchange(&mut client, &line, &["ok"]).await
        }));
    }
    for (i, client) in clients.into_iter().enumerate() {
        let answer = within("a client", client).await.unwrap();
        assert_eq!(
            answer.unwrap_or_else(|e| panic!("client {i}: {e}; log:\n{}", broker.log_text())),
            "ok"
        );
    }
    let (_, line) = wait_line(
        &broker,
        &[&format!("putting server {hanging} in quarantine")],
    )
    .await;
    assert!(line.contains(" (connect)"), "{line}");
    let errors: Vec<String> = broker
        .logs()
        .into_iter()
        .filter(|l| l.contains(&format!("cannot connect to server {hanging}")))
        .collect();
    assert!(!errors.is_empty());
    for error in &errors {
        for needed in [
            "timed out after 300ms",
            "ETIMEDOUT",
            "Windows 121/10060",
            "infrastructure",
        ] {
            assert!(error.contains(needed), "{needed:?} in {error}");
        }
    }
    assert!(!broker.has_log(&format!("putting server {} in", ok.address())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_quarantines_a_server_whose_connect_hangs() {
    let (listener, _queue) = unresponsive_listener().await;
    let hanging = listener.local_addr().unwrap();
    let ok = FaultServer::start("ok", Mode::Healthy).await;
    let broker = Broker::start(&ini_over(
        &[format!("127.0.0.1 {}", hanging.port()), ok.ini()],
        PING_PONG,
    ))
    .await;

    let (_, line) = wait_line(
        &broker,
        &[&format!("server {hanging} failed the monitor check: ")],
    )
    .await;
    assert!(line.contains("timed out after 1s"), "{line}");
    let (_, line) = wait_line(
        &broker,
        &[&format!("putting server {hanging} in quarantine")],
    )
    .await;
    assert!(line.contains(" (monitor)"), "{line}");
    // Found by the monitor first, the hanging server costs clients nothing.
    for i in 0..4 {
        let mut client = TcpStream::connect(broker.addr()).await.unwrap();
        assert_eq!(
            exact_exchange(&mut client, &format!("client {i}"), &["ok"])
                .await
                .unwrap(),
            "ok"
        );
    }
    assert!(!broker.has_log(&format!("cannot connect to server {hanging}")));
}

// ---------------------------------------------------------------------------------------------
// Slow readers and slow writers
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_both_ways_with_slow_readers_loses_no_byte() {
    const LEN: u64 = 2000;
    let server = FaultServer::start("slow", Mode::Trickle { seed: 11, len: LEN }).await;
    let broker = Broker::start(&ini_over(&[server.ini()], "")).await;
    let client = TcpStream::connect(broker.addr()).await.unwrap();
    let local = client.local_addr().unwrap();
    let (mut read, mut write) = client.into_split();

    // The client trickles its upload while reading the server's trickle three bytes at a time.
    let uploading = tokio::spawn(async move {
        trickle(&mut write, 12, LEN).await.unwrap();
        write.shutdown().await.unwrap();
    });
    let mut downloaded = Vec::new();
    within(
        "the download",
        read_slowly(&mut read, |b| downloaded.extend_from_slice(b)),
    )
    .await;
    within("the upload", uploading).await.unwrap();

    assert_eq!(first_wrong(&downloaded, 11, LEN), None, "server to client");
    let conn = &server.connections()[0];
    eventually("the server to read the whole upload", || {
        conn.received().len() as u64 >= LEN
    })
    .await;
    assert_eq!(
        first_wrong(&conn.received(), 12, LEN),
        None,
        "client to server"
    );
    let line = closed_line(&broker, local).await;
    assert!(
        line.contains(&format!("bytes_from_client={LEN} bytes_to_client={LEN}")),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reading_client_gets_a_fast_answer_intact_and_memory_stays_bounded() {
    const LEN: u64 = 32 * MIB;
    let server = FaultServer::start("fast", Mode::Blast { seed: 21, len: LEN }).await;
    let broker = Broker::start(&ini_over(&[server.ini()], "")).await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    let local = client.local_addr().unwrap();
    client.write_all(b"go\n").await.unwrap();
    eventually("the broker to reach the server", || server.accepted() == 1).await;
    let baseline = broker.resident_bytes().expect("the broker's VmRSS");

    // The client reads 4 KiB at a time, pausing every 256 KiB; every pause lets the server
    // fill the buffers on the way, and the broker must then stop reading from it.
    let mut got = 0u64;
    let mut first_bad = None;
    let mut peak = baseline;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = within("the download", client.read(&mut buf)).await.unwrap();
        if n == 0 {
            break;
        }
        if first_bad.is_none() {
            let want = pattern(21, got, n);
            first_bad = (0..n).find(|&i| buf[i] != want[i]).map(|i| got + i as u64);
        }
        let before = got;
        got += n as u64;
        if got / (256 * 1024) != before / (256 * 1024) {
            peak = peak.max(broker.resident_bytes().unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert_eq!((got, first_bad), (LEN, None), "the download");
    drop(client);
    let grew = peak.saturating_sub(baseline);
    assert!(
        grew < 16 * MIB,
        "the broker's resident memory grew by {grew} bytes relaying {LEN} to a slow reader"
    );
    let line = closed_line(&broker, local).await;
    assert!(line.contains(&format!("bytes_to_client={LEN}")), "{line}");
    assert!(line.contains("ended_by=server"), "{line}");
}

/// The most a chain of two TCP connections can hold in kernel buffers: each socket's buffer
/// can grow to the sysctl maximum (`tcp_rmem`, `tcp_wmem`, third field).
fn kernel_buffers_at_most() -> u64 {
    let max = |file: &str| -> u64 {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.split_whitespace().nth(2).and_then(|v| v.parse().ok()))
            .unwrap_or(32 * MIB)
    };
    let (rmem, wmem) = (
        max("/proc/sys/net/ipv4/tcp_rmem"),
        max("/proc/sys/net/ipv4/tcp_wmem"),
    );
    // client send, broker receive, broker send, server receive
    2 * (rmem + wmem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_reads_blocks_the_client_not_the_brokers_memory() {
    // More than every kernel buffer on the way can hold, so the whole upload can only have
    // been written if the broker buffered it.
    let total = (32 * MIB).max(kernel_buffers_at_most() + 8 * MIB);
    let server = FaultServer::start("sink", Mode::NeverRead).await;
    let broker = Broker::start(&ini_over(&[server.ini()], "")).await;
    let client = TcpStream::connect(broker.addr()).await.unwrap();
    let local = client.local_addr().unwrap();
    let (mut read, mut write) = client.into_split();
    write.write_all(b"upload follows\n").await.unwrap();
    eventually("the broker to reach the server", || server.accepted() == 1).await;
    let baseline = broker.resident_bytes().expect("the broker's VmRSS");

    let written = Arc::new(AtomicU64::new(0));
    let uploading = tokio::spawn({
        let written = Arc::clone(&written);
        async move { send_counted(&mut write, 31, total, &written).await }
    });

    // Sample the broker's memory until the client's writes stop moving: the buffers on the
    // way are full.
    let mut peak = baseline;
    until_writes_stop(
        &written,
        || uploading.is_finished(),
        || peak = peak.max(broker.resident_bytes().unwrap_or(0)),
    )
    .await;
    eprintln!(
        "the client's writes stopped after {} of {total} bytes; the broker's VmRSS went from {} \
         to at most {} bytes",
        written.load(Ordering::SeqCst),
        baseline,
        peak
    );
    assert!(
        !uploading.is_finished(),
        "the client wrote all {total} bytes to a server that reads nothing: the broker buffered \
         them"
    );
    let grew = peak.saturating_sub(baseline);
    assert!(
        grew < 16 * MIB,
        "the broker's resident memory grew by {grew} bytes while the client pushed {} bytes at \
         a server that reads nothing",
        written.load(Ordering::SeqCst)
    );
    assert!(
        !ended(read.as_ref()),
        "the client's connection stays open while the server is only slow"
    );

    // The server finally closes with the upload unread (the kernel resets it): the client's
    // blocked write fails and its read sees the end.
    server.hang_up();
    let upload = within("the client's write to fail", uploading)
        .await
        .unwrap();
    assert!(upload.is_err(), "the upload cannot have completed");
    assert!(written.load(Ordering::SeqCst) < total);
    let mut buf = [0u8; 64];
    let read = within("the client's read", read.read(&mut buf)).await;
    assert_end_seen("after the server closed", &read);
    let line = closed_line(&broker, local).await;
    assert!(line.contains("ended_by=\"error (server side"), "{line}");
}

/// Keepalive settings that give a dead peer up after 1 + 1 x 2 = 3 s.
const SHORT_KEEPALIVE: &str = "KEEPALIVE_TIME=1\nKEEPALIVE_INTERVAL=1\nKEEPALIVE_COUNT=2\n";
const SHORT_KEEPALIVE_GIVES_UP_AFTER: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tcp_user_timeout_off_live_peers_that_stop_reading_keep_their_connection() {
    // Keepalive is for peers that are gone. A peer that is there but does not read for a
    // while (a busy server, a paused client) closes its TCP window and answers every window
    // probe. Linux bounds that too by TCP_USER_TIMEOUT (by default the keepalive arithmetic:
    // see the next test); with TCP_USER_TIMEOUT=0 such a peer keeps its connection however
    // long it pauses, and gets every byte once it reads again.
    const LEN: u64 = 32 * MIB;
    let start_reading = CancellationToken::new();
    let slow_server = FaultServer::start("slow", Mode::ReadAfter(start_reading.clone())).await;
    let fast_server = FaultServer::start("fast", Mode::Blast { seed: 42, len: LEN }).await;
    let settings = format!("{SHORT_KEEPALIVE}TCP_USER_TIMEOUT=0\n");
    let to_slow = Broker::start(&ini_over(&[slow_server.ini()], &settings)).await;
    let to_fast = Broker::start(&ini_over(&[fast_server.ini()], &settings)).await;

    // A client uploads to a server that does not read for a while...
    let uploader = TcpStream::connect(to_slow.addr()).await.unwrap();
    let up_local = uploader.local_addr().unwrap();
    let (_up_read, mut up_write) = uploader.into_split();
    let written = Arc::new(AtomicU64::new(0));
    let uploading = tokio::spawn({
        let written = Arc::clone(&written);
        async move {
            send_counted(&mut up_write, 41, LEN, &written).await?;
            up_write.shutdown().await
        }
    });
    // ...and a client does not read for a while what its server sends.
    let mut downloader = TcpStream::connect(to_fast.addr()).await.unwrap();
    let down_local = downloader.local_addr().unwrap();
    downloader.write_all(b"go\n").await.unwrap();
    eventually("both servers to be reached", || {
        slow_server.accepted() == 1 && fast_server.accepted() == 1
    })
    .await;
    until_writes_stop(&written, || uploading.is_finished(), || {}).await;

    // Both brokers now hold bytes for a live peer whose window is closed. Watch for twice
    // the time after which a dead peer is given up.
    let watched = Instant::now();
    let mut cut = Vec::new();
    while watched.elapsed() < 2 * SHORT_KEEPALIVE_GIVES_UP_AFTER && cut.len() < 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cut = [(&to_slow, up_local), (&to_fast, down_local)]
            .into_iter()
            .filter_map(|(broker, client)| {
                let needle = format!("client={client} ");
                broker
                    .logs()
                    .into_iter()
                    .find(|l| l.contains("connection closed") && format!("{l} ").contains(&needle))
                    .map(|l| (watched.elapsed(), l))
            })
            .collect();
    }
    assert!(
        cut.is_empty(),
        "live peers that only stopped reading were cut off (after the window had been closed \
         this long, and the line):\n{cut:#?}"
    );

    // They read again, and every byte arrives.
    start_reading.cancel();
    let mut downloaded = Vec::new();
    within("the download", downloader.read_to_end(&mut downloaded))
        .await
        .unwrap();
    assert_eq!(first_wrong(&downloaded, 42, LEN), None, "server to client");
    within("the upload", uploading).await.unwrap().unwrap();
    let conn = &slow_server.connections()[0];
    eventually("the server to read the whole upload", || conn.ended()).await;
    assert_eq!(
        first_wrong(&conn.received(), 41, LEN),
        None,
        "client to server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_peer_that_keeps_its_window_shut_past_tcp_user_timeout_is_dropped() {
    // The documented other side of TCP_USER_TIMEOUT: by default it is the keepalive
    // arithmetic (here 1 + 1 x 2 = 3 s), and a client that takes nothing of what its server
    // sends for that long is treated as dead, as one that vanished would be.
    let server = FaultServer::start(
        "fast",
        Mode::Blast {
            seed: 7,
            len: 64 * MIB,
        },
    )
    .await;
    let broker = Broker::start(&ini_over(&[server.ini()], SHORT_KEEPALIVE)).await;
    let mut client = TcpStream::connect(broker.addr()).await.unwrap();
    let local = client.local_addr().unwrap();
    client.write_all(b"go\n").await.unwrap();
    // The client never reads: its window shuts, and the broker's sends go unacknowledged.
    let line = closed_line(&broker, local).await;
    assert!(
        line.contains("ended_by=\"error (client side: connection timed out)\""),
        "{line}"
    );
}

// ---------------------------------------------------------------------------------------------
// IDLE_TIMEOUT
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_by_idle_timeout_and_logged() {
    let server = FaultServer::start("a", Mode::Healthy).await;
    // LOG_CONNECTIONS=0: the broker's own close is logged anyway.
    let broker = Broker::start(&ini_over(
        &[server.ini()],
        "IDLE_TIMEOUT=500ms\nLOG_CONNECTIONS=0",
    ))
    .await;
    let (mut client, name) = hold(broker.addr()).await;
    assert_eq!(name, "a");
    let local = client.local_addr().unwrap();

    let read = wait_end(&mut client).await;
    assert!(
        matches!(read, Ok(0)),
        "an idle close is a clean end: {read:?}"
    );
    let line = closed_line(&broker, local).await;
    assert!(line.contains("ended_by=idle-timeout"), "{line}");
    assert!(line.contains(" INFO "), "{line}");
    assert!(
        line.contains("bytes_from_client=5 bytes_to_client=8"),
        "{line}"
    );
    // The server's side was closed too.
    let conn = &server.connections()[0];
    assert_eq!(conn.received(), b"hold\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_every_200ms_either_way_keeps_a_connection_past_idle_timeout() {
    let server = FaultServer::start("a", Mode::Healthy).await;
    // Two and a half times the idle timeout, with bytes every 200 ms. (A timeout of 1 s
    // rather than 500 ms leaves room for a loaded machine's late timers.)
    let broker = Broker::start(&ini_over(&[server.ini()], "IDLE_TIMEOUT=1s")).await;
    const ROUNDS: u32 = 12;
    const EVERY: Duration = Duration::from_millis(200);

    // Both ways: a question and its answer every 200 ms.
    let both = tokio::spawn({
        let addr = broker.addr();
        async move {
            let mut client = TcpStream::connect(addr).await.unwrap();
            let local = client.local_addr().unwrap();
            for i in 0..ROUNDS {
                exact_exchange(&mut client, &format!("both {i}"), &["a"])
                    .await
                    .unwrap_or_else(|e| panic!("both ways, round {i}: {e}"));
                tokio::time::sleep(EVERY).await;
            }
            local
        }
    });
    // Server to client only: after one command the client just listens.
    let down = tokio::spawn({
        let addr = broker.addr();
        async move {
            let mut client = TcpStream::connect(addr).await.unwrap();
            let local = client.local_addr().unwrap();
            client
                .write_all(format!("drip {ROUNDS} {}\n", EVERY.as_millis()).as_bytes())
                .await
                .unwrap();
            let mut reader = BufReader::new(&mut client);
            for i in 0..ROUNDS {
                let mut line = String::new();
                reader.read_line(&mut line).await.unwrap();
                assert_eq!(
                    line,
                    format!("a: tick {i}\n"),
                    "server to client, round {i}"
                );
            }
            local
        }
    });
    // Client to server only: the server never answers `quiet` lines.
    let up = tokio::spawn({
        let addr = broker.addr();
        async move {
            let mut client = TcpStream::connect(addr).await.unwrap();
            let local = client.local_addr().unwrap();
            for i in 0..ROUNDS {
                client
                    .write_all(format!("quiet {i}\n").as_bytes())
                    .await
                    .unwrap();
                tokio::time::sleep(EVERY).await;
            }
            (client, local)
        }
    });
    let both = within("both ways", both).await.unwrap();
    let down = within("server to client", down).await.unwrap();
    let (up_client, up) = within("client to server", up).await.unwrap();
    // Still open after 2 s: the server answers the client that only talked.
    let mut up_client = up_client;
    assert_eq!(
        exact_exchange(&mut up_client, "still there", &["a"])
            .await
            .unwrap(),
        "a"
    );
    let expected: Vec<u8> = (0..ROUNDS)
        .flat_map(|i| format!("quiet {i}\n").into_bytes())
        .chain(b"still there\n".iter().copied())
        .collect();
    assert!(
        server
            .connections()
            .iter()
            .any(|c| c.received() == expected),
        "the quiet lines arrived intact"
    );
    drop(up_client);
    assert!(
        !broker.has_log("idle-timeout"),
        "a connection with traffic was closed as idle; log:\n{}",
        broker.log_text()
    );
    for local in [both, down, up] {
        // Each ends when the test lets go of it; none was ended by the broker before.
        let line = closed_line(&broker, local).await;
        assert!(line.contains("ended_by=client"), "{line}");
    }
}

// ---------------------------------------------------------------------------------------------
// Keepalive
// ---------------------------------------------------------------------------------------------

/// `ss -tno` (established TCP sockets, numeric, with timers), or `None` when ss cannot run.
fn ss() -> Option<String> {
    let output = Command::new("ss").args(["-tno"]).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The `ss` line of the socket from `local` to `peer`.
fn socket_line(ss: &str, local: SocketAddr, peer: SocketAddr) -> Option<String> {
    ss.lines()
        .find(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.len() >= 5 && fields[3] == local.to_string() && fields[4] == peer.to_string()
        })
        .map(str::to_string)
}

/// The `ss` line of the socket from `local` to `peer` once nothing it sent awaits an
/// acknowledgement: while something does, ss shows the retransmission timer (`timer:(on,`)
/// in place of any keepalive timer.
async fn settled_socket_line(local: SocketAddr, peer: SocketAddr) -> String {
    let mut last = None;
    let end = Instant::now() + DEADLINE;
    loop {
        let table = ss().expect("ss ran before");
        last = socket_line(&table, local, peer).or(last);
        if let Some(line) = last.as_ref().filter(|l| !l.contains("timer:(on,")) {
            return line.clone();
        }
        assert!(
            Instant::now() < end,
            "no settled socket {local} -> {peer}; last seen {last:?} in:\n{table}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs ss (apt-get install iproute2)"]
async fn keepalive_timers_run_on_both_of_the_brokers_sockets_unless_turned_off() {
    assert!(
        ss().is_some(),
        "`ss` (iproute2) is needed to show the sockets' timers: apt-get install iproute2"
    );
    let server = FaultServer::start("a", Mode::Healthy).await;
    let on = Broker::start(&ini_over(&[server.ini()], SHORT_KEEPALIVE)).await;
    let off = Broker::start(&ini_over(&[server.ini()], "KEEPALIVE_TIME=0")).await;

    for (broker, wanted) in [(&on, true), (&off, false)] {
        let (client, name) = hold(broker.addr()).await;
        assert_eq!(name, "a");
        let local = client.local_addr().unwrap();
        // The broker's server-side socket is the server's peer; the held connection is the
        // latest the server accepted.
        let to_server = server.connections().last().unwrap().peer;
        let client_side = settled_socket_line(broker.addr(), local).await;
        let server_side = settled_socket_line(to_server, server.addr).await;
        let ours = settled_socket_line(local, broker.addr()).await;
        for (what, line) in [("client side", &client_side), ("server side", &server_side)] {
            assert_eq!(
                line.contains("timer:(keepalive,"),
                wanted,
                "broker's {what} socket, keepalive {}: {line}",
                if wanted { "on" } else { "off" }
            );
        }
        // The test's own socket has no keepalive: the timer seen is the broker's setting.
        assert!(!ours.contains("keepalive"), "{ours}");
    }
}

/// A network namespace joined to this one by a veth pair, with a /30 between them; removed
/// (with the pair) when dropped, whatever happened in between.
struct Netns {
    name: String,
    outside_if: String,
    inside_if: String,
    outside: Ipv4Addr,
    inside: Ipv4Addr,
}

/// Runs `ip` (or another command) with `args`; its error output when it fails.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl Netns {
    /// Creates the namespace `tag` (0 to 3, one per test) and its link; `Err` (the reason)
    /// when namespaces cannot be made here (not root, no `ip`). A failure after that fails
    /// the test.
    fn create(tag: u32) -> Result<Netns, String> {
        let pid = std::process::id();
        // The pid and the tag pick the /30, so tests and test runs at once do not share one.
        let index = (pid * 4 + tag) & 0x3fff;
        let (third, fourth) = ((index >> 6) as u8, ((index & 63) * 4) as u8);
        let netns = Netns {
            name: format!("abfault{pid}{tag}"),
            outside_if: format!("abf{pid}{tag}o"),
            inside_if: format!("abf{pid}{tag}i"),
            outside: Ipv4Addr::new(10, 200, third, fourth + 1),
            inside: Ipv4Addr::new(10, 200, third, fourth + 2),
        };
        run("ip", &["netns", "add", &netns.name])?;
        // From here on `netns` is dropped on any failure, which removes what was made.
        let (ns, o, i) = (&netns.name, &netns.outside_if, &netns.inside_if);
        let (outside, inside) = (
            format!("{}/30", netns.outside),
            format!("{}/30", netns.inside),
        );
        let steps: [&[&str]; 6] = [
            &[
                "link", "add", o, "type", "veth", "peer", "name", i, "netns", ns,
            ],
            &["addr", "add", &outside, "dev", o],
            &["link", "set", o, "up"],
            &["-n", ns, "addr", "add", &inside, "dev", i],
            &["-n", ns, "link", "set", i, "up"],
            &["-n", ns, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if let Err(e) = run("ip", step) {
                panic!("setting up the namespace: {e}");
            }
        }
        Ok(netns)
    }

    /// Runs `make` on a thread that has entered the namespace: a socket belongs to the
    /// namespace it was made in, whoever uses it afterwards.
    fn inside<T: Send + 'static>(&self, make: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open the namespace");
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("enter the namespace");
            make()
        })
        .join()
        .expect("the namespace thread")
    }

    /// A listener on the inside address.
    fn listen_inside(&self) -> TcpListener {
        let inside = self.inside;
        let listener = self.inside(move || {
            let listener = std::net::TcpListener::bind((inside, 0)).expect("bind inside");
            listener.set_nonblocking(true).unwrap();
            listener
        });
        TcpListener::from_std(listener).unwrap()
    }

    /// A connection from inside the namespace to `to`.
    fn connect_from_inside(&self, to: SocketAddr) -> TcpStream {
        let stream = self.inside(move || {
            let stream = std::net::TcpStream::connect(to).expect("connect from inside");
            stream.set_nonblocking(true).unwrap();
            stream
        });
        TcpStream::from_std(stream).unwrap()
    }

    /// Makes everything inside vanish without a word: every packet in or out is dropped
    /// (iptables), or failing that the inside end of the link is taken down. Returns how.
    fn vanish(&self) -> &'static str {
        let dropped = ["INPUT", "OUTPUT"].iter().all(|chain| {
            run(
                "ip",
                &[
                    "netns", "exec", &self.name, "iptables", "-I", chain, "-j", "DROP",
                ],
            )
            .is_ok()
        });
        if dropped {
            return "iptables DROP inside the namespace";
        }
        run(
            "ip",
            &["-n", &self.name, "link", "set", &self.inside_if, "down"],
        )
        .expect("take the link down");
        "the namespace's end of the link taken down"
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["link", "del", &self.outside_if]);
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a network namespace (ip)"]
async fn a_vanished_server_is_noticed_by_keepalive_and_user_timeout_and_only_then() {
    let netns = Netns::create(0).unwrap_or_else(|why| {
        panic!(
            "cannot create a network namespace for a server to vanish in ({why}); this test \
             needs root (CAP_NET_ADMIN) and iproute2"
        )
    });
    let server = FaultServer::on("far", Mode::Healthy, netns.listen_inside());
    // time + interval x count = 1 + 1 x 2 = 3 s until a dead peer is given up.
    let on = Broker::start(&ini_over(&[server.ini()], SHORT_KEEPALIVE)).await;
    let off = Broker::start(&ini_over(&[server.ini()], "KEEPALIVE_TIME=0")).await;

    // Through each broker: one connection left idle (keepalive's case) and one that sends
    // after the server is gone, so the broker's bytes wait unacknowledged (TCP_USER_TIMEOUT's
    // case: keepalive does not probe while data is outstanding).
    let mut held = Vec::new();
    for broker in [&on, &off] {
        for _ in 0..2 {
            let (client, name) = hold(broker.addr()).await;
            assert_eq!(name, "far");
            held.push(client);
        }
    }
    let [mut on_idle, mut on_busy, off_idle, mut off_busy]: [TcpStream; 4] =
        held.try_into().unwrap();
    let how = netns.vanish();
    let vanished = Instant::now();
    on_busy.write_all(b"anyone there?\n").await.unwrap();
    off_busy.write_all(b"anyone there?\n").await.unwrap();

    for (what, client) in [("idle", &mut on_idle), ("busy", &mut on_busy)] {
        let read = wait_end(client).await;
        assert_end_seen(&format!("the {what} client with keepalive on"), &read);
        let line = closed_line(&on, client.local_addr().unwrap()).await;
        assert!(
            line.contains("ended_by=\"error (server side") && line.contains("timed out"),
            "{what}: {line}"
        );
    }
    eprintln!(
        "server vanished by {how}; the broker gave up on it after {:.1}s (time + interval x \
         count = 3s)",
        vanished.elapsed().as_secs_f64()
    );
    // Without keepalive, the same silence goes unnoticed past that. (The broker with
    // keepalive cannot have given up sooner; waiting here only makes sure of "past".)
    tokio::time::sleep_until((vanished + SHORT_KEEPALIVE_GIVES_UP_AFTER).into()).await;
    assert!(
        !ended(&off_idle),
        "the idle client without keepalive was closed"
    );
    assert!(
        !ended(&off_busy),
        "the busy client without keepalive was closed"
    );
    assert!(
        !off.has_log("connection closed"),
        "without keepalive nothing notices the vanished server; log:\n{}",
        off.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a network namespace (ip)"]
async fn a_vanished_client_is_noticed_by_keepalive_and_its_server_connection_released() {
    let netns = Netns::create(1).unwrap_or_else(|why| {
        panic!(
            "cannot create a network namespace for a client to vanish in ({why}); this test \
             needs root (CAP_NET_ADMIN) and iproute2"
        )
    });
    let server = FaultServer::start("near", Mode::Healthy).await;
    // The brokers listen on the outside end of the link, where the namespace's clients can
    // reach them.
    let listening_outside = |extra: &str| {
        ini_over(&[server.ini()], extra).replace(
            "LOCAL_SERVER_ADDRESS=127.0.0.1",
            &format!("LOCAL_SERVER_ADDRESS={}", netns.outside),
        )
    };
    let on = Broker::start(&listening_outside(SHORT_KEEPALIVE)).await;
    let off = Broker::start(&listening_outside("KEEPALIVE_TIME=0")).await;

    // Through each broker: an idle client, and a busy one whose server keeps sending, so the
    // broker's bytes to the vanished client wait unacknowledged (TCP_USER_TIMEOUT's case).
    let mut held = Vec::new();
    for broker in [&on, &off] {
        let address = SocketAddr::from((netns.outside, broker.ports[0]));
        for busy in [false, true] {
            let mut client = netns.connect_from_inside(address);
            let name = exact_exchange(&mut client, "hello from inside", &["near"])
                .await
                .unwrap();
            assert_eq!(name, "near");
            let conn = server.connections().last().unwrap().clone();
            if busy {
                client.write_all(b"drip 200 50\n").await.unwrap();
                let mut tick = [0u8; 13];
                within("the first tick", client.read_exact(&mut tick))
                    .await
                    .unwrap();
                assert_eq!(&tick, b"near: tick 0\n");
            }
            held.push((client, conn));
        }
    }
    let how = netns.vanish();
    let vanished = Instant::now();

    // The broker with keepalive gives the clients up and releases their servers' connections.
    for (client, conn) in &held[..2] {
        let local = client.local_addr().unwrap();
        eventually("the server connection of a vanished client to end", || {
            conn.ended()
        })
        .await;
        let line = closed_line(&on, local).await;
        assert!(
            line.contains("ended_by=\"error (client side") && line.contains("timed out"),
            "{line}"
        );
    }
    eprintln!(
        "client vanished by {how}; the broker gave up on it after {:.1}s (time + interval x \
         count = 3s)",
        vanished.elapsed().as_secs_f64()
    );
    // Without keepalive, the servers' connections stay held for clients that are gone.
    tokio::time::sleep_until((vanished + SHORT_KEEPALIVE_GIVES_UP_AFTER).into()).await;
    for (_, conn) in &held[2..] {
        assert!(
            !conn.ended(),
            "a server connection of the broker without keepalive ended"
        );
    }
    assert!(
        !off.has_log("connection closed"),
        "without keepalive nothing notices the vanished clients; log:\n{}",
        off.log_text()
    );
}

// ---------------------------------------------------------------------------------------------
// Flapping servers
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_lose_nothing_while_servers_flap() {
    let mut servers = Vec::new();
    for name in ["a", "b", "c"] {
        servers.push(FaultServer::start(name, Mode::Healthy).await);
    }
    let ini = ini_over(
        &servers.iter().map(FaultServer::ini).collect::<Vec<_>>(),
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=100ms\nCONNECT_TIMEOUT=1s",
    );
    let broker = Broker::start(&ini).await;
    wait_line(
        &broker,
        &["monitor: OK - 3 servers available, 0 servers unavailable"],
    )
    .await;

    // One server at a time goes down for 250 ms, then up for 100 ms before the next: never
    // all down at once.
    const CYCLES: usize = 6;
    let stop = CancellationToken::new();
    let cycles = Arc::new(AtomicUsize::new(0));
    let flapping = tokio::spawn({
        let (stop, cycles) = (stop.clone(), Arc::clone(&cycles));
        async move {
            let mut turn = 0;
            while !stop.is_cancelled() {
                let server = &mut servers[turn % 3];
                server.down().await;
                tokio::time::sleep(Duration::from_millis(250)).await;
                server.up().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                turn += 1;
                cycles.store(turn, Ordering::SeqCst);
            }
            servers
        }
    });

    // Two clients in a loop until every server has gone down twice and 300 exchanges are
    // done (bounded by the deadline), each exchange with its own bytes.
    let exchanges = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for client in 0..2u64 {
        let (addr, exchanges, failures, done) = (
            broker.addr(),
            Arc::clone(&exchanges),
            Arc::clone(&failures),
            Arc::clone(&done),
        );
        loops.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !done.load(Ordering::SeqCst) {
                let len = 1 + (i * 997 + client * 131) % 3000;
                let line: String = pattern((client << 20) | i, 0, len as usize)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                let result = async {
                    let mut stream = TcpStream::connect(addr).await?;
                    exact_exchange(&mut stream, &line, &["a", "b", "c"]).await
                }
                .await;
                if let Err(e) = result {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("client {client} exchange {i}: {e}"));
                }
                exchanges.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        }));
    }
    eventually("the flapping and the exchanges to be done", || {
        cycles.load(Ordering::SeqCst) >= CYCLES && exchanges.load(Ordering::SeqCst) >= 300
    })
    .await;
    done.store(true, Ordering::SeqCst);
    for client in loops {
        within("a client loop", client).await.unwrap();
    }
    stop.cancel();
    let _servers = within("the flapping", flapping).await.unwrap();

    let failures = failures.lock().unwrap().clone();
    eprintln!(
        "{} exchanges over {} down-and-up cycles; {} quarantine and {} release lines",
        exchanges.load(Ordering::SeqCst),
        cycles.load(Ordering::SeqCst),
        broker.count_logs("in quarantine start="),
        broker.count_logs("releasing server")
    );
    assert!(
        failures.is_empty(),
        "{} of {} exchanges failed while at least one server was up: {failures:#?}\nlog:\n{}",
        failures.len(),
        exchanges.load(Ordering::SeqCst),
        broker.log_text()
    );
    assert!(
        broker.has_log("in quarantine"),
        "log:\n{}",
        broker.log_text()
    );
    assert!(
        broker.has_log("releasing server"),
        "log:\n{}",
        broker.log_text()
    );
    assert!(!broker.has_log("no remote servers available"));
}
