//! One HTTP/2 stream as the engine's client connection ([`Stream`]): its reads give the
//! engine the request as HTTP/1.1 bytes (the head `request` wrote, then the DATA frames as
//! that head frames them), its writes take the engine's HTTP/1.1 answer (each head parsed by
//! the core, sent as informational or final HEADERS, the body's framing stepped over by the
//! core's `BodyReader` and its data sent as DATA frames). The engine serves it as it serves
//! any connection, for one exchange (`Connection: close`), and knows nothing of HTTP/2.
//!
//! Flow control is the backpressure both ways: a DATA frame's bytes are released to the
//! client's window only as the engine takes them, and the engine's writes wait for the
//! client's window (a client that keeps it shut for `HTTP_BODY_TIMEOUT` has its stream
//! failed, as a TCP connection that takes nothing is dropped by `TCP_USER_TIMEOUT`).
//!
//! Once the request is whole, a read waits for the client to reset the stream (the engine
//! then drops the request, as for a client that closed its connection), and ends once the
//! answer did. The answer's end is the stream's: `END_STREAM` after a whole body, a reset
//! (`INTERNAL_ERROR`) after one cut short, never an incomplete answer passed for whole.
//! Trailers are dropped both ways, as the HTTP/1.1 engine drops them.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use hyper::http::{Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::request::{RequestFraming, Written};
use super::resets::ResetTally;
use super::response;
use crate::http::h1::{
    self, Asked, Body as H1Body, BodyReader, Framing, HeadScan, Part, ResponseHead,
};
use crate::net::stream::Stream;
use crate::tls::ALPN_H2;

/// The longest answer head the engine writes ([`h1::MAX_HEAD`]) and a little: more before a
/// blank line is no head of the engine's.
const MOST_HEAD: usize = h1::MAX_HEAD + 1024;

/// The most capacity asked of the client's window at once: a buffer's worth, as the engine
/// writes.
const MOST_RESERVED: usize = 64 * 1024;

/// One stream, as the engine's client.
pub(crate) struct H2Stream {
    request: StreamRequest,
    answer: StreamAnswer,
    /// What the answer's framing depends on (`HEAD`, an upgrade asked).
    asked: Asked,
    /// The `Sec-WebSocket-Key` sent for a WebSocket, its accept checked on the `101`.
    websocket: Option<String>,
    /// How long the client's window may stay shut while the engine has bytes for it.
    stall_limit: Duration,
    /// Running while it does.
    stall: Option<Pin<Box<Sleep>>>,
    /// The engine asked for the stream's end to be a reset ([`Stream::reset_on_close`]).
    abort: AtomicBool,
    /// The client reset the stream before its answer was whole, and it was counted.
    reset_seen: bool,
    /// What the connection counts of its streams.
    shared: Arc<ResetTally>,
}

/// The request's side.
struct StreamRequest {
    /// The HTTP/1.1 head, and how much of it the engine has read.
    head: Vec<u8>,
    head_read: usize,
    body: RequestFraming,
    recv: RecvStream,
    /// The DATA frame being read, what of it the engine has not taken yet.
    data: Bytes,
    /// Chunk framing due before (or after) it: a size line, a CRLF, the last chunk.
    framing: [u8; 24],
    framing_at: u8,
    framing_len: u8,
    /// A chunk's data is being read: its CRLF is due after it.
    in_chunk: bool,
    /// The body reached its end (the client's `END_STREAM`).
    ended: bool,
}

/// The answer's side, as the engine writes it.
enum StreamAnswer {
    /// A head is being written: what came of it so far, and how far the blank line that ends
    /// it is matched (`\r\n\r\n`).
    Head {
        respond: SendResponse<Bytes>,
        head: Vec<u8>,
        matched: u8,
    },
    /// A body, framed as the head said (`until_close`: by the answer's end).
    Body {
        send: SendStream<Bytes>,
        reader: BodyReader,
        until_close: bool,
    },
    /// A WebSocket's bytes, once the server switched.
    Tunnel { send: SendStream<Bytes> },
    /// Ended: the stream's last frame sent (the handle kept to tell a client still sending
    /// a body that it may stop).
    Done { send: Option<SendStream<Bytes>> },
}

impl H2Stream {
    /// The stream of a request written for the engine (`written`), its body from `recv`, its
    /// answer by `respond`.
    pub(super) fn new(
        written: Written,
        recv: RecvStream,
        respond: SendResponse<Bytes>,
        websocket: Option<String>,
        stall_limit: Duration,
        shared: Arc<ResetTally>,
    ) -> H2Stream {
        H2Stream {
            request: StreamRequest {
                head: written.head,
                head_read: 0,
                ended: written.body == RequestFraming::Empty,
                body: written.body,
                recv,
                data: Bytes::new(),
                framing: [0; 24],
                framing_at: 0,
                framing_len: 0,
                in_chunk: false,
            },
            answer: StreamAnswer::Head {
                respond,
                head: Vec::new(),
                matched: 0,
            },
            asked: written.asked,
            websocket,
            stall_limit,
            stall: None,
            abort: AtomicBool::new(false),
            reset_seen: false,
            shared,
        }
    }

    /// The client reset the stream: counted once, while its answer was not whole (a client
    /// that stops a body after its answer has done nothing wrong).
    fn reset_by_client(&mut self) -> io::Error {
        if !self.reset_seen && !matches!(self.answer, StreamAnswer::Done { .. }) {
            self.reset_seen = true;
            self.shared.reset_by_client();
        }
        io::ErrorKind::ConnectionReset.into()
    }

    /// An error of the `h2` crate's as the engine takes it: the client's reset counted.
    fn failed(&mut self, error: &h2::Error) -> io::Error {
        if error.is_reset() && error.is_remote() {
            return self.reset_by_client();
        }
        io::Error::new(io::ErrorKind::BrokenPipe, error.to_string())
    }

    /// Waits for the client to reset the stream (the request is whole, or its body waits for
    /// the answer to switch): the reset is the engine's end of the stream.
    fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let reset = match &mut self.answer {
            StreamAnswer::Head { respond, .. } => respond.poll_reset(cx),
            StreamAnswer::Body { send, .. } | StreamAnswer::Tunnel { send } => send.poll_reset(cx),
            StreamAnswer::Done { .. } => return Poll::Ready(Ok(())),
        };
        match ready!(reset) {
            Ok(_) => Poll::Ready(Err(self.reset_by_client())),
            Err(e) => Poll::Ready(Err(self.failed(&e))),
        }
    }
}

impl StreamRequest {
    /// Copies what is due before the next frame (head, chunk framing, data) into `into`: how
    /// many bytes, and how many of them were a frame's data.
    fn copy_due(&mut self, into: &mut ReadBuf<'_>) -> (usize, usize) {
        let start = into.filled().len();
        if self.head_read < self.head.len() {
            let n = into.remaining().min(self.head.len() - self.head_read);
            into.put_slice(&self.head[self.head_read..self.head_read + n]);
            self.head_read += n;
            if self.head_read == self.head.len() {
                // Read whole: not held for the stream's life.
                self.head = Vec::new();
                self.head_read = 0;
            }
            return (into.filled().len() - start, 0);
        }
        let mut data = 0;
        loop {
            if self.framing_at < self.framing_len {
                let due =
                    &self.framing[usize::from(self.framing_at)..usize::from(self.framing_len)];
                let n = into.remaining().min(due.len());
                into.put_slice(&due[..n]);
                self.framing_at += n as u8;
            }
            if self.framing_at < self.framing_len || into.remaining() == 0 || self.data.is_empty() {
                break;
            }
            let n = into.remaining().min(self.data.len());
            into.put_slice(&self.data.split_to(n));
            data += n;
            if self.data.is_empty() && self.in_chunk {
                self.in_chunk = false;
                self.frame(b"\r\n");
            }
        }
        (into.filled().len() - start, data)
    }

    /// Chunk framing due next.
    fn frame(&mut self, bytes: &[u8]) {
        self.framing[..bytes.len()].copy_from_slice(bytes);
        self.framing_at = 0;
        self.framing_len = bytes.len() as u8;
    }

    /// A DATA frame came: its bytes are due, as a chunk when the body is chunked.
    fn take(&mut self, data: Bytes) {
        if self.body == RequestFraming::Chunked && !data.is_empty() {
            let mut line = [0u8; 24];
            let mut room = &mut line[..];
            let _ = std::io::Write::write_fmt(&mut room, format_args!("{:x}\r\n", data.len()));
            let len = 24 - room.len();
            self.frame(&line[..len]);
            self.in_chunk = true;
        }
        self.data = data;
    }

    /// The client's `END_STREAM`: the last chunk is due when the body is chunked.
    fn end(&mut self) {
        self.ended = true;
        if self.body == RequestFraming::Chunked {
            self.frame(b"0\r\n\r\n");
        }
    }
}

impl AsyncRead for H2Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        into: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.request.head_read == 0 && !this.request.head.is_empty() {
            // A stream reset before the engine read a byte of it (rapid reset) costs no
            // server a request.
            if let Poll::Ready(reset) = this.poll_reset(cx) {
                reset?;
            }
        }
        loop {
            let (copied, data) = this.request.copy_due(into);
            if data > 0 {
                // The client may send as much again: the engine has taken it.
                let _ = this.request.recv.flow_control().release_capacity(data);
            }
            if copied > 0 {
                return Poll::Ready(Ok(()));
            }
            if into.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if matches!(this.answer, StreamAnswer::Done { .. }) {
                // The answer ended: so does the stream, for the engine.
                return Poll::Ready(Ok(()));
            }
            let tunnel = this.request.body == RequestFraming::Tunnel;
            if this.request.ended && tunnel {
                // The client ended its side of the WebSocket: the end of stream, again.
                return Poll::Ready(Ok(()));
            }
            if this.request.ended || (tunnel && !matches!(this.answer, StreamAnswer::Tunnel { .. }))
            {
                // Nothing more until the answer ends (or, for a WebSocket, switches): a reset
                // is the client gone.
                ready!(this.poll_reset(cx))?;
                return Poll::Ready(Ok(()));
            }
            match ready!(this.request.recv.poll_data(cx)) {
                Some(Ok(data)) => this.request.take(data),
                Some(Err(e)) => return Poll::Ready(Err(this.failed(&e))),
                None if this.request.body == RequestFraming::Tunnel => {
                    this.request.ended = true;
                    return Poll::Ready(Ok(()));
                }
                None => this.request.end(),
            }
        }
    }
}

impl H2Stream {
    /// Takes what it can of `input` (the answer's bytes, in order): how many bytes, or
    /// pending when it took none and waits for the client's window.
    fn write_some(&mut self, cx: &mut Context<'_>, input: &[u8]) -> Poll<io::Result<usize>> {
        let mut used = 0;
        while used < input.len() {
            let rest = &input[used..];
            let taken = match &mut self.answer {
                StreamAnswer::Head { .. } => self.head_bytes(rest),
                StreamAnswer::Body { .. } | StreamAnswer::Tunnel { .. } => {
                    match self.body_bytes(cx, rest) {
                        Poll::Ready(taken) => taken,
                        Poll::Pending if used > 0 => break,
                        Poll::Pending => return Poll::Pending,
                    }
                }
                // Bytes past the answer's end: none of the engine's.
                StreamAnswer::Done { .. } if used > 0 => break,
                StreamAnswer::Done { .. } => {
                    return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
                }
            }?;
            used += taken;
        }
        Poll::Ready(Ok(used))
    }

    /// Takes the answer head's bytes up to its blank line; a whole head is sent.
    fn head_bytes(&mut self, input: &[u8]) -> io::Result<usize> {
        let StreamAnswer::Head { head, matched, .. } = &mut self.answer else {
            return Ok(0);
        };
        let mut end = None;
        for (i, &b) in input.iter().enumerate() {
            *matched = match (b, *matched) {
                (b'\r', 2) => 3,
                (b'\r', _) => 1,
                (b'\n', 1) => 2,
                (b'\n', 3) => 4,
                _ => 0,
            };
            if *matched == 4 {
                end = Some(i + 1);
                break;
            }
        }
        let taken = end.unwrap_or(input.len());
        if head.len() + taken > MOST_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "an answer head too large",
            ));
        }
        head.extend_from_slice(&input[..taken]);
        if end.is_some() {
            self.send_head()?;
        }
        Ok(taken)
    }

    /// Sends the head written whole: an interim one as informational HEADERS, the final one
    /// as the response (a WebSocket's `101` as its `200`), its body's reading set up.
    fn send_head(&mut self) -> io::Result<()> {
        let StreamAnswer::Head {
            respond,
            head,
            matched,
        } = &mut self.answer
        else {
            return Ok(());
        };
        let parsed = ResponseHead::parse(head, &mut HeadScan::default(), self.asked);
        let Ok(Some(parsed)) = parsed else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a malformed answer head",
            ));
        };
        // The head's bytes, shared by the response's values.
        let bytes = Bytes::from(std::mem::take(head));
        let websocket = self.websocket.as_deref();
        let Some(response) = response::response(&parsed, &bytes, websocket) else {
            // A 101 that does not answer the broker's key: the server speaks no WebSocket.
            let mut refusal = Response::new(());
            *refusal.status_mut() = StatusCode::BAD_GATEWAY;
            let _ = respond.send_response(refusal, true);
            self.answer = StreamAnswer::Done { send: None };
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server's Sec-WebSocket-Accept does not answer the key",
            ));
        };
        let framing = parsed.framing();
        if framing == Framing::Interim {
            *matched = 0;
            return respond.send_informational(response).map_err(|e| broken(&e));
        }
        let body = match framing {
            Framing::Body(body) => body,
            Framing::Tunnel | Framing::Interim => H1Body::UntilClose,
        };
        let ends = matches!(body, H1Body::Empty | H1Body::Length(0));
        let send = respond
            .send_response(response, ends)
            .map_err(|e| broken(&e))?;
        self.answer = match framing {
            _ if ends => StreamAnswer::Done { send: Some(send) },
            Framing::Tunnel => StreamAnswer::Tunnel { send },
            _ => StreamAnswer::Body {
                send,
                reader: BodyReader::new(body),
                until_close: body == H1Body::UntilClose,
            },
        };
        Ok(())
    }

    /// Takes body (or tunnel) bytes of `input`: its framing stepped over, its data sent as
    /// the client's window allows.
    fn body_bytes(&mut self, cx: &mut Context<'_>, input: &[u8]) -> Poll<io::Result<usize>> {
        let mut probe = match &self.answer {
            StreamAnswer::Body { reader, .. } => *reader,
            _ => BodyReader::new(H1Body::UntilClose),
        };
        let step = match probe.step(input) {
            Ok(step) => step,
            Err(e) => return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e))),
        };
        if step.part != Part::Data || step.len == 0 {
            self.stepped(probe);
            return Poll::Ready(self.end_if_done().map(|()| step.len));
        }
        let room = match ready!(self.window(cx, step.len)) {
            Ok(room) => room,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let n = step.len.min(room);
        if n < step.len {
            // Only so much of it now: stepped again over what goes.
            probe = match &self.answer {
                StreamAnswer::Body { reader, .. } => *reader,
                _ => probe,
            };
            let _ = probe.step(&input[..n]);
        }
        self.stepped(probe);
        let last = matches!(&self.answer, StreamAnswer::Body { reader, .. } if reader.is_done());
        let sent = match &mut self.answer {
            StreamAnswer::Body { send, .. } | StreamAnswer::Tunnel { send } => {
                send.send_data(Bytes::copy_from_slice(&input[..n]), last)
            }
            _ => Ok(()),
        };
        if let Err(e) = sent {
            return Poll::Ready(Err(self.failed(&e)));
        }
        if last {
            self.finish();
        }
        Poll::Ready(Ok(n))
    }

    /// The body's reader moved on.
    fn stepped(&mut self, probe: BodyReader) {
        if let StreamAnswer::Body { reader, .. } = &mut self.answer {
            *reader = probe;
        }
    }

    /// A body that reached its end with framing (the last chunk): the stream ends.
    fn end_if_done(&mut self) -> io::Result<()> {
        let StreamAnswer::Body { send, reader, .. } = &mut self.answer else {
            return Ok(());
        };
        if !reader.is_done() {
            return Ok(());
        }
        let sent = send.send_data(Bytes::new(), true);
        self.finish();
        sent.map_err(|e| broken(&e))
    }

    /// The answer's last frame is sent.
    fn finish(&mut self) {
        let send = match std::mem::replace(&mut self.answer, StreamAnswer::Done { send: None }) {
            StreamAnswer::Body { send, .. } | StreamAnswer::Tunnel { send } => Some(send),
            StreamAnswer::Done { send } => send,
            StreamAnswer::Head { .. } => None,
        };
        self.answer = StreamAnswer::Done { send };
        self.stall = None;
    }

    /// Room in the client's window for up to `want` bytes, waiting for it (at most the stall
    /// limit); an error when the client reset the stream or left.
    fn window(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        let (StreamAnswer::Body { send, .. } | StreamAnswer::Tunnel { send }) = &mut self.answer
        else {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        };
        if send.capacity() == 0 {
            send.reserve_capacity(want.min(MOST_RESERVED));
        }
        loop {
            match send.poll_capacity(cx) {
                Poll::Ready(Some(Ok(0))) => {}
                Poll::Ready(Some(Ok(room))) => {
                    self.stall = None;
                    return Poll::Ready(Ok(room));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(self.failed(&e))),
                Poll::Ready(None) => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
                Poll::Pending => break,
            }
        }
        if send.capacity() > 0 {
            self.stall = None;
            return Poll::Ready(Ok(send.capacity()));
        }
        if let Poll::Ready(reset) = send.poll_reset(cx) {
            return Poll::Ready(Err(match reset {
                Ok(_) => self.reset_by_client(),
                Err(e) => self.failed(&e),
            }));
        }
        let limit = self.stall_limit;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if stall.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client kept its HTTP/2 window shut",
            )));
        }
        Poll::Pending
    }

    /// The stream's end as the engine closes it: `END_STREAM` after an answer whose end is
    /// the close (or a tunnel's), a reset after one cut short or none at all.
    fn close(&mut self) {
        let abort = self.abort.load(Relaxed);
        match std::mem::replace(&mut self.answer, StreamAnswer::Done { send: None }) {
            StreamAnswer::Head { mut respond, .. } => respond.send_reset(Reason::INTERNAL_ERROR),
            StreamAnswer::Body {
                mut send,
                until_close,
                ..
            } => {
                if until_close && !abort {
                    let _ = send.send_data(Bytes::new(), true);
                    self.answer = StreamAnswer::Done { send: Some(send) };
                } else {
                    send.send_reset(Reason::INTERNAL_ERROR);
                }
            }
            StreamAnswer::Tunnel { mut send } if abort => send.send_reset(Reason::INTERNAL_ERROR),
            StreamAnswer::Tunnel { mut send } => {
                let _ = send.send_data(Bytes::new(), true);
                self.answer = StreamAnswer::Done { send: Some(send) };
            }
            done @ StreamAnswer::Done { .. } => self.answer = done,
        }
        self.stall = None;
    }
}

/// An error of the `h2` crate's sending side, as the engine takes it.
fn broken(error: &h2::Error) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, error.to_string())
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_some(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut written = 0;
        for buf in bufs.iter().filter(|b| !b.is_empty()) {
            match this.write_some(cx, buf) {
                Poll::Ready(Ok(n)) => {
                    written += n;
                    if n < buf.len() {
                        break;
                    }
                }
                Poll::Ready(Err(e)) if written == 0 => return Poll::Ready(Err(e)),
                Poll::Pending if written == 0 => return Poll::Pending,
                Poll::Ready(Err(_)) | Poll::Pending => break,
            }
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// The `h2` connection sends what the stream queued: nothing to flush here.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().close();
        Poll::Ready(Ok(()))
    }
}

impl Drop for H2Stream {
    /// An answer the engine left unfinished is reset, never left open; one finished while
    /// the client still sends its body tells it to stop (RFC 9113 §8.1: `NO_ERROR`).
    fn drop(&mut self) {
        match &mut self.answer {
            StreamAnswer::Done { send: Some(send) } if !self.request.ended => {
                send.send_reset(Reason::NO_ERROR);
            }
            StreamAnswer::Done { .. } => {}
            _ => {
                self.abort.store(true, Relaxed);
                self.close();
            }
        }
    }
}

/// A stream of a connection, as the engine's client: no socket, nothing to splice; its
/// protocol is HTTP/2's.
impl Stream for H2Stream {
    fn protocol(&self) -> Option<&[u8]> {
        Some(ALPN_H2)
    }

    fn reset_on_close(&self) {
        self.abort.store(true, Relaxed);
    }
}
