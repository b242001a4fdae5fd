//! One request sent to a server: its head rewritten for the server (hop-by-hop lines out,
//! `X-Forwarded-*`, an upgrade narrowed to the allowed protocols, `Max-Forwards` counted
//! down, the balancer's own change) and written with the body's first bytes in one write,
//! the rest of the body passed on while the server is watched for an early answer, and the
//! answer's head awaited (interim answers passed on, `100 Continue` said by the broker when
//! the server stays silent on an `Expect`).

use std::future::poll_fn;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use super::awaiting::{Awaiting, MOST_INTERIM_BYTES, MOST_INTERIM_HEADS, ServerHeard};
use super::client::write_out;
use super::exchange::{InHand, max_forwards};
use super::ip_text::IpText;
use super::pump::{IdleWatch, Pump, PumpError};
use crate::http::h1::{
    Asked, BodyReader, Editor, FieldName, Forwarded, HeadError, Method, OutHead, Span, ToServer,
};
use crate::http::{ClientHead, Upstreams};
use crate::net::stream::Stream;
use crate::support::os_error::words;

/// How long a server that says neither `100 Continue` nor a final status is waited for before
/// the client is told to send its body anyway (curl waits 1 s too): it may be a server that
/// ignores `Expect`.
const EXPECT_WAIT: Duration = Duration::from_secs(1);

/// The upgrade a request asks for, as `HTTP_UPGRADE_PROTOCOLS` allows it.
#[derive(Debug, Clone, Copy, Default)]
struct Offer {
    /// Some protocol offered is allowed: the upgrade goes on.
    goes: bool,
    /// Some protocol offered is not: `Upgrade` is said anew with the allowed ones only.
    narrowed: bool,
    /// `h2c` is among the allowed ones.
    h2c: bool,
}

/// A request that got no answer.
#[derive(Debug)]
pub(super) struct SendFailure {
    pub(super) error: String,
    /// Nothing of the request was written.
    pub(super) unsent: bool,
    /// Some byte of an answer arrived.
    pub(super) answered: bool,
    /// The server stayed silent past the response timeout.
    pub(super) timeout: bool,
    /// The client's connection closes after the page (the server flooded it with interim
    /// answers: what else it sent is in doubt).
    pub(super) close_client: bool,
}

/// How the client's side failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientFault {
    /// It closed, or its connection failed, before its request was whole.
    Gone,
    /// Its body stopped coming for `HTTP_BODY_TIMEOUT`.
    Timeout,
    /// Its body is malformed, or ended before its framed end.
    Body,
}

/// How a request sent on one connection went.
#[allow(clippy::large_enum_variant)] // as `Tried`
pub(super) enum Sent {
    Answered(Reply),
    Failed(SendFailure),
    Client(ClientFault),
}

/// An answer's head, before its connection is joined to it.
pub(super) struct Reply {
    pub(super) awaiting: Awaiting,
    pub(super) head: crate::http::h1::ResponseHead,
    pub(super) upload: Option<Pump>,
    pub(super) request_sent: bool,
    pub(super) to_server: u64,
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// Sends the request on `server` (its head, its body) and waits for the answer's head;
    /// `to` is the server, whose `host:port` a request without a `Host` is given.
    pub(super) async fn send(&mut self, server: &mut U::Stream, to: &U::Server) -> Sent {
        let host = match self.head.host(self.buf.filled()) {
            Some(_) => String::new(),
            None => to.to_string(),
        };
        let (mut out, asked, mut upload) = self.request_out(&host);
        let expects = self.head.expects_continue(self.buf.filled());
        let whole = out.remaining();
        if let Err(e) = write_out(server, &mut out, self.buf.filled()).await {
            return Sent::Failed(SendFailure {
                error: words(&e),
                unsent: out.remaining() == whole,
                answered: false,
                timeout: false,
                close_client: false,
            });
        }
        let mut awaiting = Awaiting::new(asked, self.head.version());
        if upload.body_read() {
            self.body_end = Some(upload.at());
        } else {
            match self
                .upload(server, &mut upload, &mut awaiting, expects)
                .await
            {
                Uploaded::Sent(end) => self.body_end = Some(end),
                Uploaded::Early(head) => {
                    // A final status to `Expect: 100-continue`: no body follows it.
                    let to_server = upload.moved;
                    let upload = (!expects).then_some(upload);
                    return Sent::Answered(Reply {
                        awaiting,
                        head,
                        upload,
                        request_sent: false,
                        to_server,
                    });
                }
                Uploaded::Failed(failure) => return Sent::Failed(failure),
                Uploaded::Client(fault) => {
                    // The access log says what of the body was read before it broke off.
                    self.record.exchange.to_server = upload.moved;
                    return Sent::Client(fault);
                }
            }
        }
        let to_server = upload.moved;
        match self.await_head(server, &mut awaiting).await {
            Ok(head) => Sent::Answered(Reply {
                awaiting,
                head,
                upload: None,
                request_sent: true,
                to_server,
            }),
            Err(sent) => sent,
        }
    }
}

/// How the request's body went, while the server was watched.
enum Uploaded {
    /// Sent whole; the body ended there in the buffer.
    Sent(usize),
    /// The server gave its final answer first.
    Early(crate::http::h1::ResponseHead),
    Failed(SendFailure),
    Client(ClientFault),
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// The head for the server this try goes to (`server`: its `host:port`, the `Host` of a
    /// request that named none), with the body's first bytes; what the request asks, and the
    /// body's pump from after those bytes.
    fn request_out(&self, server: &str) -> (OutHead, Asked, Pump) {
        let (head, buf) = (&self.head, self.buf.filled());
        let offer = offer(head, buf, &self.settings.upgrade_protocols);
        // The connection's peer, as written when the request began; a client a trusted proxy
        // named for this request is written here, and an unknown one is named to no one.
        let named = self
            .client
            .via
            .map(|_| self.client.peer.peer.ip().map(IpText::of));
        let client = match &named {
            None => Some(&self.client.ip),
            Some(named) => named.as_ref(),
        };
        let how = ToServer {
            forwarded: self.settings.forwarded_headers.then(|| Forwarded {
                client: client.map(IpText::as_bytes),
                peer: self.client.ip.as_bytes(),
                https: self.client.peer.tls,
            }),
            upgrade: offer.goes,
            host: server.as_bytes(),
            http2_settings: offer.h2c,
        };
        let mut editor = head.to_server(buf, &how);
        if offer.goes && offer.narrowed {
            narrow_upgrade(head, buf, &self.settings.upgrade_protocols, &mut editor);
        }
        let view = ClientHead::new(head, buf);
        count_down_max_forwards(&view, &mut editor);
        self.engine.upstreams.rewrite(&view, &mut editor);
        let mut out = head.write(buf, editor);
        let mut pump = Pump::new(BodyReader::new(head.body()), true, head.len());
        let run_end = pump.first_run(buf);
        out.append_input(Span::between(head.len(), run_end));
        (out, head.asked(&how), pump)
    }

    /// Passes the body on while the server is watched: an answer may come before the body is
    /// whole (the server refused it, or answers as it reads). Interim answers go to the
    /// client as they come; with `Expect: 100-continue`, the client is told to send its body
    /// by the broker itself when the server says nothing for [`EXPECT_WAIT`].
    async fn upload(
        &mut self,
        server: &mut U::Stream,
        pump: &mut Pump,
        awaiting: &mut Awaiting,
        expects: bool,
    ) -> Uploaded {
        let mut silence = IdleWatch::new(self.settings.body_timeout);
        let mut expect_wait = expects.then(|| Box::pin(tokio::time::sleep(EXPECT_WAIT)));
        let (client, buf) = (&mut *self.client.io, &mut self.buf);
        let spliced = &self.engine.stats.spliced;
        poll_fn(|cx| {
            if let Some(wait) = expect_wait.as_mut()
                && wait.as_mut().poll(cx).is_ready()
            {
                if pump.moved == 0 && !awaiting.heard {
                    awaiting.say_continue();
                }
                expect_wait = None;
            }
            match awaiting.poll_head(cx, server, client) {
                Poll::Ready(Ok(ServerHeard::Final(head))) => {
                    return Poll::Ready(Uploaded::Early(head));
                }
                Poll::Ready(Ok(heard)) => {
                    return Poll::Ready(Uploaded::Failed(failed(heard, awaiting)));
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Uploaded::Client(ClientFault::Gone)),
                Poll::Pending => {}
            }
            match pump.poll(cx, buf, client, server, spliced) {
                Poll::Ready(Ok(end)) => return Poll::Ready(Uploaded::Sent(end)),
                Poll::Ready(Err(PumpError::Read(e))) => {
                    debug!(error = %e, "the client's connection failed within its body");
                    return Poll::Ready(Uploaded::Client(ClientFault::Gone));
                }
                Poll::Ready(Err(PumpError::Body(e))) => {
                    debug!(error = %e, "the client's body is refused");
                    return Poll::Ready(Uploaded::Client(ClientFault::Body));
                }
                Poll::Ready(Err(PumpError::Write(e))) => {
                    return Poll::Ready(Uploaded::Failed(SendFailure {
                        error: words(&e),
                        unsent: false,
                        answered: awaiting.heard,
                        timeout: false,
                        close_client: false,
                    }));
                }
                Poll::Pending => {}
            }
            if silence.expired(cx, pump.reading, pump.progress) {
                return Poll::Ready(Uploaded::Client(ClientFault::Timeout));
            }
            Poll::Pending
        })
        .await
    }

    /// The final answer's head, once the whole request was sent: within
    /// `HTTP_RESPONSE_TIMEOUT`, interim answers passed on meanwhile. The client is watched
    /// too: one that closes has gone away (a browser tab closed), and its request is dropped,
    /// which closes its server connection, as nginx does; what it sends meanwhile is kept
    /// (a pipelined request).
    async fn await_head(
        &mut self,
        server: &mut U::Stream,
        awaiting: &mut Awaiting,
    ) -> Result<crate::http::h1::ResponseHead, Sent> {
        let timeout = self.settings.response_timeout;
        // The connection's timer, its head's wait over, is reset for this one (the next
        // head's wait resets it again): a timer made for each request would be added to the
        // runtime's wheel at its first poll and taken out as it is dropped, every request.
        let deadline = &mut self.client.deadline;
        deadline.as_mut().reset(Instant::now() + timeout);
        let (client, buf) = (&mut *self.client.io, &mut self.buf);
        poll_fn(|cx| {
            match awaiting.poll_head(cx, server, client) {
                Poll::Ready(Ok(ServerHeard::Final(head))) => return Poll::Ready(Ok(head)),
                Poll::Ready(Ok(heard)) => {
                    return Poll::Ready(Err(Sent::Failed(failed(heard, awaiting))));
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Err(Sent::Client(ClientFault::Gone))),
                Poll::Pending => {}
            }
            while !buf.is_full() {
                match buf.poll_read_from(cx, client) {
                    Poll::Ready(Ok(0) | Err(_)) => {
                        return Poll::Ready(Err(Sent::Client(ClientFault::Gone)));
                    }
                    Poll::Ready(Ok(_)) => {}
                    Poll::Pending => break,
                }
            }
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(Sent::Failed(SendFailure {
                    error: format!("no answer within {timeout:?} of the request"),
                    unsent: false,
                    answered: awaiting.heard,
                    timeout: true,
                    close_client: false,
                })));
            }
            Poll::Pending
        })
        .await
    }
}

/// The failure of a server that ended, failed or sent a head the broker does not pass on.
fn failed(heard: ServerHeard, awaiting: &Awaiting) -> SendFailure {
    let error = match &heard {
        ServerHeard::Final(_) | ServerHeard::Closed => {
            "the server closed the connection".to_string()
        }
        ServerHeard::Failed(e) => words(e),
        ServerHeard::Bad(HeadError::UnaskedSwitch) => {
            "switched protocols unasked (101)".to_string()
        }
        ServerHeard::Bad(e) => format!("a malformed answer: {e}"),
        ServerHeard::Flood => format!(
            "more than {MOST_INTERIM_HEADS} interim answers (1xx), or {} KiB of them",
            MOST_INTERIM_BYTES / 1024
        ),
    };
    SendFailure {
        error,
        unsent: false,
        answered: awaiting.heard,
        timeout: false,
        close_client: matches!(heard, ServerHeard::Flood),
    }
}

/// The upgrade `head` asks for, as `allowed` (`HTTP_UPGRADE_PROTOCOLS`) takes it: a name
/// without `/version` stands for every version of it, in any case.
fn offer(head: &crate::http::h1::RequestHead, buf: &[u8], allowed: &[String]) -> Offer {
    if !head.wants_upgrade() {
        return Offer::default();
    }
    let mut offer = Offer::default();
    for protocol in head.upgrade_protocols(buf) {
        if allowed.iter().any(|a| names(a.as_bytes(), protocol)) {
            offer.goes = true;
            let name = protocol.split(|&b| b == b'/').next().unwrap_or_default();
            offer.h2c |= name.eq_ignore_ascii_case(b"h2c");
        } else {
            offer.narrowed = true;
        }
    }
    offer
}

/// Whether the allowed protocol `allowed` names the offered `protocol` (`websocket` names
/// `WebSocket/13`; `h2c/1` names only itself).
fn names(allowed: &[u8], protocol: &[u8]) -> bool {
    let name = protocol.split(|&b| b == b'/').next().unwrap_or_default();
    protocol.eq_ignore_ascii_case(allowed)
        || (!allowed.contains(&b'/') && name.eq_ignore_ascii_case(allowed))
}

/// `Upgrade` said anew with the allowed protocols of the offer only.
fn narrow_upgrade(
    head: &crate::http::h1::RequestHead,
    buf: &[u8],
    allowed: &[String],
    editor: &mut Editor,
) {
    let kept: Vec<&[u8]> = head
        .upgrade_protocols(buf)
        .filter(|p| allowed.iter().any(|a| names(a.as_bytes(), p)))
        .collect();
    for id in head.fields().named(FieldName::Upgrade) {
        editor.remove(id);
    }
    let joined = kept.join(&b", "[..]);
    let _ = editor.add(b"Upgrade", &[&joined]);
}

/// An `OPTIONS` with hops left goes on with one less (RFC 9110 §7.6.2).
fn count_down_max_forwards(request: &ClientHead<'_>, editor: &mut Editor) {
    if request.method() != Method::Options {
        return;
    }
    let Some(hops) = max_forwards(request).filter(|&hops| hops > 0) else {
        return;
    };
    if let Some(id) = request.head().fields().named(FieldName::MaxForwards).next() {
        let _ = editor.set(id, &[(hops - 1).to_string().as_bytes()]);
    }
}
