//! A raw HTTP/1.1 server of the tests' own, byte for byte (its client: `raw_client.rs`), so
//! what a test checks is what crosses the broker on the wire, whatever engine the broker runs: the server's
//! behaviour is chosen by the request's path, every head it receives is kept exactly as it
//! came, and every connection's bytes and end are recorded.
//!
//! Paths the [`Scripted`] server knows (anything else: the body read by its framing, then
//! `200` with `ok <path>`):
//! - `/early...`: `401` at once, without reading the body, and the connection kept: the next
//!   bytes are read as the next request (the server the early-response desync needs);
//! - `/smuggled`: `200` with [`ATTACKER_ANSWER`] (counted as unasked: [`Scripted::unasked`]);
//! - `/hang`: no answer ever, the connection kept open;
//! - `/stall-body`: a head with `Content-Length: 100` and 10 bytes of body, then silence;
//! - `/cl-and-chunked`: `Content-Length: 3` and `Transfer-Encoding: chunked`, `hello` in chunks;
//! - `/informational`: `102 Processing`, `103 Early Hints` with a `Link`, then `200`;
//! - `/upgrade`: `101` to `echo`, then every byte echoed;
//! - `/double`: the body read, `200` with `ok /double`, then 200 ms later a second answer
//!   nobody asked for ([`ATTACKER_ANSWER`]) on the same connection, which stays open;
//! - `/ignore-length`: `200` with `ok /ignore-length` at once, whatever the request's
//!   `Content-Length` says: its body is read as the next request (the CL.0 gadget), 100 ms
//!   later;
//! - `/early-slow`: a `401` of [`EARLY_SLOW_LENGTH`] bytes sent over about a second, from the
//!   head alone, the body left unread and read as the next request;
//! - `/interim-flood`: `103 Early Hints` heads, without end, until the broker stops reading;
//! - `/trickle/<ms>`: a `200` of 30 bytes, one byte every `<ms>` milliseconds.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::eventually;

/// What `/smuggled` answers: a victim must never see it.
pub const ATTACKER_ANSWER: &str = "the attacker's answer";

/// The length of `/early-slow`'s `401` body.
pub const EARLY_SLOW_LENGTH: usize = 50 * 1024;

/// A server connection's stream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One request head as the server received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The connection it came on (0 for the first accepted).
    pub conn: usize,
    /// The head, request line to blank line, exactly as received.
    pub head: Vec<u8>,
    /// The request target.
    pub path: String,
}

impl Received {
    /// The head as text (lossy), for assertions.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.head).into_owned()
    }
}

/// One accepted connection's record.
#[derive(Debug, Clone, Default)]
pub struct ScriptedConn {
    /// Every byte received on it.
    pub bytes: Vec<u8>,
    /// The broker closed it (EOF or reset).
    pub ended: bool,
}

#[derive(Default)]
struct Records {
    heads: Mutex<Vec<Received>>,
    conns: Mutex<Vec<ScriptedConn>>,
    /// Answers written that no request asked for (`/double`'s second one, `/smuggled`'s).
    unasked: AtomicUsize,
    /// `103` heads written by `/interim-flood`.
    interim: AtomicUsize,
}

/// The scripted server on a loopback port.
pub struct Scripted {
    /// Where it listens.
    pub addr: SocketAddr,
    records: Arc<Records>,
    accepted: Arc<AtomicUsize>,
}

impl Scripted {
    /// The server on a fresh port.
    pub async fn start() -> Scripted {
        Scripted::start_with(None).await
    }

    /// The server on a fresh port, speaking TLS with `acceptor`.
    pub async fn start_tls(acceptor: TlsAcceptor) -> Scripted {
        Scripted::start_with(Some(acceptor)).await
    }

    async fn start_with(tls: Option<TlsAcceptor>) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let records = Arc::new(Records::default());
        let accepted = Arc::new(AtomicUsize::new(0));
        let (r, a) = (Arc::clone(&records), Arc::clone(&accepted));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // Each write goes out at once (no Nagle delay behind an unacknowledged
                // segment), so a test that saw a write done knows its bytes are on their way.
                stream.set_nodelay(true).unwrap();
                let id = {
                    let mut conns = r.conns.lock().unwrap();
                    conns.push(ScriptedConn::default());
                    conns.len() - 1
                };
                a.fetch_add(1, SeqCst);
                let (records, tls) = (Arc::clone(&r), tls.clone());
                tokio::spawn(async move {
                    let stream: Box<dyn Io> = match tls {
                        None => Box::new(stream),
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(stream) => Box::new(stream),
                            Err(_) => {
                                records.conns.lock().unwrap()[id].ended = true;
                                return;
                            }
                        },
                    };
                    let wire = Wire {
                        stream,
                        buf: Vec::new(),
                        id,
                        records,
                    };
                    serve(wire, id).await;
                });
            }
        });
        Scripted {
            addr,
            records,
            accepted,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(SeqCst)
    }

    /// Every head received so far, in order.
    pub fn heads(&self) -> Vec<Received> {
        self.records.heads.lock().unwrap().clone()
    }

    /// The heads received for `path`.
    pub fn heads_for(&self, path: &str) -> Vec<Received> {
        self.heads()
            .into_iter()
            .filter(|h| h.path == path)
            .collect()
    }

    /// Every connection's record, in the order accepted.
    pub fn conns(&self) -> Vec<ScriptedConn> {
        self.records.conns.lock().unwrap().clone()
    }

    /// Answers written that no request asked for, so far.
    pub fn unasked(&self) -> usize {
        self.records.unasked.load(SeqCst)
    }

    /// `103` heads `/interim-flood` wrote, so far.
    pub fn interim(&self) -> usize {
        self.records.interim.load(SeqCst)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.conns().iter().filter(|c| !c.ended).count()
    }

    /// The record of connection `id` once the broker has closed it (fails the test after
    /// [`DEADLINE`]).
    pub async fn wait_closed(&self, id: usize) -> ScriptedConn {
        eventually(&format!("server connection {id} closed"), || {
            self.conns().get(id).is_some_and(|c| c.ended)
        })
        .await;
        self.conns()[id].clone()
    }
}

/// A server connection with the bytes read ahead of the current message.
struct Wire {
    stream: Box<dyn Io>,
    buf: Vec<u8>,
    id: usize,
    records: Arc<Records>,
}

impl Wire {
    /// Reads more; false at EOF or an error (recorded as the end).
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        match self.stream.read(&mut chunk).await {
            Ok(n) if n > 0 => {
                self.buf.extend_from_slice(&chunk[..n]);
                self.records.conns.lock().unwrap()[self.id]
                    .bytes
                    .extend_from_slice(&chunk[..n]);
                true
            }
            _ => {
                self.records.conns.lock().unwrap()[self.id].ended = true;
                false
            }
        }
    }

    /// The next head, up to its blank line; `None` at EOF.
    async fn head(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                return Some(self.buf.drain(..end + 4).collect());
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// `n` bytes of body; `None` at EOF.
    async fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill().await {
                return None;
            }
        }
        Some(self.buf.drain(..n).collect())
    }

    /// A line (without its CRLF); `None` at EOF.
    async fn line(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = self.buf.drain(..end + 2).take(end).collect();
                return Some(line);
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// The body `head` frames (a length, chunks, or none); `None` at EOF.
    async fn body(&mut self, head: &[u8]) -> Option<Vec<u8>> {
        if header(head, "transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            let mut body = Vec::new();
            loop {
                let size = self.line().await?;
                let size = String::from_utf8_lossy(&size);
                let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
                if size == 0 {
                    while !self.line().await?.is_empty() {}
                    return Some(body);
                }
                body.extend(self.take(size).await?);
                self.line().await?;
            }
        }
        let length = header(head, "content-length").map_or(0, |v| v.trim().parse().unwrap_or(0));
        self.take(length).await
    }

    /// Reads until the broker closes the connection.
    async fn until_closed(&mut self) {
        while self.fill().await {}
    }

    async fn send(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok() && self.stream.flush().await.is_ok()
    }
}

/// Serves connection `id` request by request, each by its path's script.
async fn serve(mut wire: Wire, id: usize) {
    while let Some(head) = wire.head().await {
        let path = target(&head);
        wire.records.heads.lock().unwrap().push(Received {
            conn: id,
            head: head.clone(),
            path: path.clone(),
        });
        if let Some(go_on) = hostile(&mut wire, &head, &path).await {
            if !go_on {
                return;
            }
            continue;
        }
        let go_on = match path.as_str() {
            p if p.starts_with("/early") => {
                wire.send(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 6\r\n\r\ndenied")
                    .await
            }
            "/smuggled" => {
                let sent = wire.send(&answer(ATTACKER_ANSWER)).await;
                wire.records.unasked.fetch_add(1, SeqCst);
                sent
            }
            "/hang" => {
                wire.until_closed().await;
                false
            }
            "/stall-body" => {
                wire.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
                    .await;
                wire.until_closed().await;
                false
            }
            "/cl-and-chunked" => {
                wire.body(&head).await.is_some()
                    && wire
                        .send(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
                              2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n",
                        )
                        .await
            }
            "/informational" => {
                wire.body(&head).await.is_some()
                    && wire.send(b"HTTP/1.1 102 Processing\r\n\r\n").await
                    && wire
                        .send(b"HTTP/1.1 103 Early Hints\r\nLink: </app.css>; rel=preload\r\n\r\n")
                        .await
                    && wire.send(&answer("final")).await
            }
            "/upgrade" => {
                if wire
                    .send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: upgrade\r\n\r\n")
                    .await
                {
                    echo(wire).await;
                }
                return;
            }
            _ => match wire.body(&head).await {
                Some(_) => wire.send(&answer(&format!("ok {path}"))).await,
                None => false,
            },
        };
        if !go_on {
            return;
        }
    }
}

/// The scripts of servers hostile to the broker's pool and bounds, by `path`: whether the
/// connection goes on; `None` for a path that is none of them.
async fn hostile(wire: &mut Wire, head: &[u8], path: &str) -> Option<bool> {
    let go_on = match path {
        "/early-slow" => early_slow(wire).await,
        "/double" => double(wire, head).await,
        "/ignore-length" => {
            let sent = wire.send(&answer("ok /ignore-length")).await;
            // The next request (the body) is answered once the broker had time to take the
            // connection back, so its answer waits on an idle connection.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            sent
        }
        "/interim-flood" => {
            interim_flood(wire).await;
            false
        }
        p if p.starts_with("/trickle/") => {
            let ms = p["/trickle/".len()..].parse().unwrap_or(500);
            trickle(wire, head, ms).await
        }
        _ => return None,
    };
    Some(go_on)
}

/// `/double`: the body read, the asked answer, then 200 ms later one nobody asked for.
async fn double(wire: &mut Wire, head: &[u8]) -> bool {
    if wire.body(head).await.is_none() || !wire.send(&answer("ok /double")).await {
        return false;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let sent = wire.send(&answer(ATTACKER_ANSWER)).await;
    wire.records.unasked.fetch_add(1, SeqCst);
    sent
}

/// `/early-slow`: a long `401` from the head alone, in pieces over about a second.
async fn early_slow(wire: &mut Wire) -> bool {
    let head = format!("HTTP/1.1 401 Unauthorized\r\nContent-Length: {EARLY_SLOW_LENGTH}\r\n\r\n");
    if !wire.send(head.as_bytes()).await {
        return false;
    }
    let piece = vec![b'd'; EARLY_SLOW_LENGTH / 10];
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if !wire.send(&piece).await {
            return false;
        }
    }
    true
}

/// `/interim-flood`: `103` heads until a write fails or stalls for a while (the broker
/// stopped reading).
async fn interim_flood(wire: &mut Wire) {
    let hint = b"HTTP/1.1 103 Early Hints\r\nLink: </flood.css>; rel=preload\r\n\r\n";
    let stall = std::time::Duration::from_secs(5);
    while let Ok(Ok(())) = tokio::time::timeout(stall, wire.stream.write_all(hint)).await {
        wire.records.interim.fetch_add(1, SeqCst);
    }
    wire.until_closed().await;
}

/// `/trickle/<ms>`: the body read, then a 30-byte answer, a byte every `ms` milliseconds.
async fn trickle(wire: &mut Wire, head: &[u8], ms: u64) -> bool {
    if wire.body(head).await.is_none()
        || !wire
            .send(b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n")
            .await
    {
        return false;
    }
    for byte in b"abcdefghijklmnopqrstuvwxyz0123" {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        if !wire.send(&[*byte]).await {
            return false;
        }
    }
    true
}

/// Echoes every byte back until the broker closes.
async fn echo(mut wire: Wire) {
    let ahead = std::mem::take(&mut wire.buf);
    if !wire.send(&ahead).await {
        return;
    }
    while wire.fill().await {
        let bytes = std::mem::take(&mut wire.buf);
        if !wire.send(&bytes).await {
            return;
        }
    }
}

/// A `200` with `body` and its length.
fn answer(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The request target of `head` (its request line's second word).
fn target(head: &[u8]) -> String {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let text = String::from_utf8_lossy(line);
    text.split(' ').nth(1).unwrap_or_default().to_string()
}

/// The value of the first header `name` (any case) in `head`.
pub fn header(head: &[u8], name: &str) -> Option<String> {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
}
