//! Telling a query from a client: a connection whose first bytes are a request line for
//! `/TOTVS_BROKER_QUERY` (GET, HEAD or another standard method, the path in any case, exactly that or going on with `/`,
//! `?` or a blank) is answered by the broker (the HTTP engine reads it from its first bytes
//! on: [`Sniffed`]); anything else is forwarded, its first bytes included.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::net::stream::{READ_NOW, Stream};

/// What the first bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A request for the query interface.
    Query,
    /// Anything else: forward it (with the bytes read so far).
    Forward,
    /// The client closed before sending anything: nothing to forward, no server to bother.
    Closed,
}

const PATH: &[u8] = b"/TOTVS_BROKER_QUERY";

/// The methods a query may come with: those of RFC 9110 and PATCH, compared exactly (HTTP
/// methods are case-sensitive). Only a prefix of one of these followed by the query path makes
/// the broker read on before forwarding, so a client whose first bytes are any other word
/// (`x`, `PING`, `SSH-2.0-...`) is forwarded at once: waiting for more from a client that sent
/// a short first segment and waits for its server would cost it `QUERY_SNIFF_TIMEOUT`.
const METHODS: [&[u8]; 9] = [
    b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"CONNECT",
];

/// Classifies the bytes a client has sent so far: `None` while they could still be either.
///
/// Any of [`METHODS`] counts (`POST /TOTVS_BROKER_QUERY` is answered 405 rather than forwarded
/// to a server that knows nothing of it). The path is compared without regard to case.
pub fn classify(bytes: &[u8]) -> Option<Verdict> {
    // Most clients are no query: their first byte begins no method, and one look says so
    // (the walk below compares each method in turn, a byte at a time).
    if let Some(first) = bytes.first()
        && !METHODS.iter().any(|method| method[0] == *first)
    {
        return Some(Verdict::Forward);
    }
    let mut undecided = false;
    for method in METHODS {
        match classify_with(bytes, method) {
            Some(Verdict::Query) => return Some(Verdict::Query),
            None => undecided = true,
            Some(_) => {}
        }
    }
    (!undecided).then_some(Verdict::Forward)
}

/// [`classify`] for one method.
fn classify_with(bytes: &[u8], method: &[u8]) -> Option<Verdict> {
    let line = method.iter().chain(b" ").chain(PATH);
    let mut matched = 0;
    for (i, (have, want)) in bytes.iter().zip(line).enumerate() {
        let same = if i <= method.len() {
            have == want
        } else {
            have.eq_ignore_ascii_case(want)
        };
        if !same {
            return Some(Verdict::Forward);
        }
        matched += 1;
    }
    match bytes.get(method.len() + 1 + PATH.len()) {
        _ if matched < method.len() + 1 + PATH.len() => None, // a prefix of the line so far
        None => None,
        Some(b'/' | b'?' | b' ') => Some(Verdict::Query),
        Some(_) => Some(Verdict::Forward), // `/TOTVS_BROKER_QUERYX`: another path
    }
}

/// Reads a client's first bytes into `first` until they classify, for at most `limit`
/// (`QUERY_SNIFF_TIMEOUT`). A client that sends nothing within it is taken for a
/// server-first protocol client; one whose bytes could still begin a query but have not
/// become one by then is a client that waits for its server (a one-byte `H` of some binary
/// protocol, say): both are forwarded, with whatever they sent, in order. Nothing is held
/// meanwhile but the connection itself, so no client can keep a query place by sending
/// half a request line.
pub async fn sniff<S: Stream>(
    stream: &mut S,
    first: &mut Vec<u8>,
    limit: Duration,
) -> io::Result<Verdict> {
    let deadline = Instant::now() + limit;
    // A client-first client's bytes are usually there already: the first read tries the
    // socket at once (an accepted socket is taken to be readable), without waiting for the
    // reactor's first report on it and without arming a timer (which costs the runtime a
    // wake-up of its own).
    let mut read = stream.read_now(first);
    loop {
        match read {
            Ok(0) if first.is_empty() => return Ok(Verdict::Closed),
            // Closed after a few bytes that could have been a query: they are the client's.
            Ok(0) => return Ok(Verdict::Forward),
            Ok(_) => {
                if let Some(verdict) = classify(first) {
                    return Ok(verdict);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        first.reserve(READ_NOW);
        read = match tokio::time::timeout_at(deadline, stream.read_buf(first)).await {
            Err(_) => return Ok(Verdict::Forward),
            Ok(read) => read,
        };
    }
}

/// A query connection's stream with the bytes the sniff read in front of it, for the engine
/// that answers it: those are read first, then the stream's own. While any are left the
/// stream is no plain socket to the engine (its bytes are not all on the socket), so it is
/// read rather than waited on.
pub struct Sniffed<S> {
    first: Vec<u8>,
    read: usize,
    stream: S,
}

impl<S> Sniffed<S> {
    /// `stream`, whose first bytes (`first`) were read already.
    pub fn new(first: Vec<u8>, stream: S) -> Sniffed<S> {
        Sniffed {
            first,
            read: 0,
            stream,
        }
    }

    fn sniffed_left(&self) -> bool {
        self.read < self.first.len()
    }
}

impl<S: Stream> AsyncRead for Sniffed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.sniffed_left() {
            let n = (this.first.len() - this.read).min(buf.remaining());
            buf.put_slice(&this.first[this.read..this.read + n]);
            this.read += n;
            if !this.sniffed_left() {
                this.first = Vec::new();
                this.read = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl<S: Stream> AsyncWrite for Sniffed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl<S: Stream> Stream for Sniffed<S> {
    fn socket(&self) -> Option<&TcpStream> {
        self.stream.socket()
    }

    fn plain(&self) -> Option<&TcpStream> {
        if self.sniffed_left() {
            return None;
        }
        self.stream.plain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let cases: &[(&[u8], Option<Verdict>)] = &[
            (b"", None),
            (b"G", None),
            (b"GET /totvs_broker_q", None),
            (b"get /TOTVS_BROKER_QUERY/PING", Some(Verdict::Forward)),
            (b"GET /TOTVS_BROKER_QUERY", None),
            (b"GET /TOTVS_BROKER_QUERY ", Some(Verdict::Query)),
            (
                b"GET /TOTVS_BROKER_QUERY/STATUS HTTP/1.1\r\n",
                Some(Verdict::Query),
            ),
            (
                b"GET /totvs_broker_query?x=1 HTTP/1.1",
                Some(Verdict::Query),
            ),
            (b"HEAD /TOTVS_BROKER_QUERY/PING", Some(Verdict::Query)),
            (b"GET /TOTVS_BROKER_QUERYX HTTP/1.1", Some(Verdict::Forward)),
            (b"GET /rest/api HTTP/1.1", Some(Verdict::Forward)),
            (b"POST /TOTVS_BROKER_QUERY HTTP/1.1", Some(Verdict::Query)),
            (b"OPTIONS /totvs_broker_query/PING", Some(Verdict::Query)),
            (b"M-SEARCH /TOTVS_BROKER_QUERY?x", Some(Verdict::Forward)),
            (b"PROPFIND /TOTVS_BROKER_QUERY/PING", Some(Verdict::Forward)),
            (b"POST /rest/api HTTP/1.1", Some(Verdict::Forward)),
            (b"PUT", None),
            (b"DELETE /TOTVS", None),
            (b" /TOTVS_BROKER_QUERY/PING", Some(Verdict::Forward)),
            (b"GET  /TOTVS_BROKER_QUERY/PING", Some(Verdict::Forward)),
            (b"GET\t/TOTVS_BROKER_QUERY/PING", Some(Verdict::Forward)),
            // A short first segment that is no method's start is forwarded at once: a
            // client sending it may be waiting for its server.
            (b"x", Some(Verdict::Forward)),
            (b"a", Some(Verdict::Forward)),
            (b"PING", Some(Verdict::Forward)),
            (b"ABCDEFGHIJKLMNOPQRST", Some(Verdict::Forward)),
            (b"GE", None),
            (b"GEX", Some(Verdict::Forward)),
            (b"P", None),
            (b"OPTION", None),
            (b"HEA", None),
            (b"\x00\x01SmartClient", Some(Verdict::Forward)),
            (b"SSH-2.0-OpenSSH", Some(Verdict::Forward)),
            (
                b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n",
                Some(Verdict::Forward),
            ),
        ];
        for (bytes, verdict) in cases {
            assert_eq!(
                classify(bytes),
                *verdict,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_is_no_socket_is_sniffed_too() {
        use tokio::io::AsyncWriteExt;
        let limit = Duration::from_millis(200);
        let (mut client, mut accepted) = tokio::io::duplex(64);
        client.write_all(b"GET /TOTVS_BROKER_QUERY").await.unwrap();
        let sniffing = async {
            let mut first = Vec::new();
            let verdict = sniff(&mut accepted, &mut first, limit).await;
            (verdict.unwrap(), first)
        };
        let finishing = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            client.write_all(b"/PING HTTP/1.1\r\n").await.unwrap();
        };
        let ((verdict, first), ()) = tokio::join!(sniffing, finishing);
        assert_eq!(verdict, Verdict::Query);
        assert!(first.starts_with(b"GET /TOTVS_BROKER_QUERY/PING"));

        // Silent: forwarded once QUERY_SNIFF_TIMEOUT is over, with nothing read.
        let (_client, mut accepted) = tokio::io::duplex(64);
        let mut first = Vec::new();
        let verdict = sniff(&mut accepted, &mut first, limit).await.unwrap();
        assert_eq!((verdict, first.len()), (Verdict::Forward, 0));
    }
}
