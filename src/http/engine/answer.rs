//! A server's answer on its way to the client: its head rewritten (`HTTP/1.1`, `Connection`
//! as decided, the balancer's `Set-Cookie`) and written with the body's first bytes, the
//! body passed as its framing says, the server's silence bounded by
//! `HTTP_RESPONSE_TIMEOUT` (past it the client's connection is cut: never passed on as a
//! whole answer); a request body still going (the server answered early) goes on meanwhile,
//! bounded by `HTTP_BODY_TIMEOUT`, and no further than the answer's end; such an early answer
//! goes with `Connection: close` and its server connection is closed after it, never pooled.
//! Then, once, which connection serves another exchange ([`h1::reuse`]); an upgrade instead
//! becomes a tunnel, relayed as a TCP connection is.

use std::future::poll_fn;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;

use tokio::time::Instant;
use tracing::debug;

use super::buffers::Buffer;
use super::client::{Next, SwitchedConnection, write_out};
use super::exchange::InHand;
use super::forward::Answered;
use super::pool::ServerConn;
use super::pump::{IdleWatch, Pump, PumpError};
use crate::http::h1::{
    self, Body, BodyReader, Finish, Framing, ResponseHead, Span, ToClient, client_keep_alive,
};
use crate::http::{Choice, ExchangeOutcome, Report, Upstreams};
use crate::net::stream::Stream;

/// How an answer's body went.
enum Streamed {
    /// To its framed end, which is there in the server's buffer; `body_sent`: the request's
    /// body went whole too (before the answer began, or while it streamed).
    Whole { end: usize, body_sent: bool },
    /// The server sent nothing more of it for `HTTP_RESPONSE_TIMEOUT`.
    ServerSilent,
    /// The server broke off, or its body is malformed.
    ServerBroke,
    /// The client is gone.
    ClientGone,
    /// The client's body (still going) stopped for `HTTP_BODY_TIMEOUT`.
    ClientTimeout,
}

/// What the answer's head decided, for the exchange's end.
struct Settled<'h> {
    head: &'h ResponseHead,
    /// The client was told its connection stays open.
    keep_alive: bool,
    /// The whole request was sent before the answer's head arrived.
    request_sent: bool,
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// The server's answer, on its way to the client; what follows on the connection.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub(super) fn answer(
        mut self,
        answered: Answered<U>,
        choice: Choice<U>,
    ) -> impl Future<Output = Next<U>> {
        async move {
            let Answered {
                mut conn,
                mut awaiting,
                head,
                mut upload,
                request_sent,
                to_server,
            } = answered;
            // Interim answers that came with the final one go first.
            let client = &mut *self.client.io;
            if poll_fn(|cx| awaiting.poll_interim(cx, client))
                .await
                .is_err()
            {
                self.record.ended(ExchangeOutcome::Incomplete);
                return Next::Close;
            }
            let mut resp = awaiting.resp;
            self.record.exchange.to_server = to_server;
            self.record.answered_code(head.status());
            if head.framing() == Framing::Tunnel {
                return self.tunnel(conn, &head, resp, choice).await;
            }
            let keep_alive = client_keep_alive(&self.head, &head, request_sent)
                && !self.client.closing.is_cancelled();
            let version = self.head.version();
            let how = ToClient {
                version,
                keep_alive,
            };
            let mut editor = head.to_client(resp.filled(), &how);
            if let Some(cookie) = &choice.set_cookie {
                let _ = editor.add(b"Set-Cookie", &[cookie.as_bytes()]);
            }
            let mut out = head.write(resp.filled(), editor);
            let reader = BodyReader::of_response(head.framing());
            let mut down = Pump::new(reader, !head.dechunks_for(version), head.len());
            let run_end = down.first_run(resp.filled());
            out.append_input(Span::between(head.len(), run_end));
            if down.body_read() && request_sent {
                // The whole answer came with its head (most do): counted before it is written.
                self.record.exchange.outcome = ExchangeOutcome::Served;
                self.record.exchange.to_client = down.moved;
                self.record.report();
            }
            if write_out(&mut *self.client.io, &mut out, resp.filled())
                .await
                .is_err()
            {
                self.record.ended(ExchangeOutcome::Incomplete);
                return Next::Close;
            }
            let streamed = self
                .stream_body(&mut conn, &mut resp, &mut down, &mut upload, request_sent)
                .await;
            self.record.exchange.to_client = down.moved;
            let answered = Settled {
                head: &head,
                keep_alive,
                request_sent,
            };
            self.settle(streamed, answered, conn, &resp, &choice).await
        }
    }

    /// The answer's body (`down`) to its end, the request's (`upload`) on meanwhile when it
    /// is still going; each side's silence bounded.
    async fn stream_body(
        &mut self,
        conn: &mut ServerConn<U>,
        resp: &mut Buffer,
        down: &mut Pump,
        upload: &mut Option<Pump>,
        request_sent: bool,
    ) -> Streamed {
        let mut server_silence = IdleWatch::new(self.settings.response_timeout);
        let mut client_silence = IdleWatch::new(self.settings.body_timeout);
        let (client, buf, server) = (&mut *self.client.io, &mut self.buf, &mut conn.stream);
        let mut body_sent = request_sent;
        let mut body_end = self.body_end;
        let to_server = &mut self.record.exchange.to_server;
        let spliced = &self.engine.stats.spliced;
        let streamed = poll_fn(|cx| {
            if let Some(up) = upload.as_mut() {
                let polled = up.poll(cx, buf, client, server, spliced);
                *to_server = up.moved;
                match polled {
                    Poll::Ready(Ok(end)) => {
                        body_sent = true;
                        body_end = Some(end);
                        *upload = None;
                    }
                    Poll::Ready(Err(PumpError::Write(_))) => {
                        // The server takes no more of it: the answer goes on alone.
                        *upload = None;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Streamed::ClientGone),
                    Poll::Pending => {
                        if client_silence.expired(cx, up.reading, up.progress) {
                            return Poll::Ready(Streamed::ClientTimeout);
                        }
                    }
                }
            }
            match down.poll(cx, resp, server, client, spliced) {
                Poll::Ready(Ok(end)) => Poll::Ready(Streamed::Whole { end, body_sent }),
                Poll::Ready(Err(PumpError::Write(_))) => Poll::Ready(Streamed::ClientGone),
                Poll::Ready(Err(PumpError::Read(e))) => {
                    debug!(error = %e, "the server's connection failed within its answer");
                    Poll::Ready(Streamed::ServerBroke)
                }
                Poll::Ready(Err(PumpError::Body(e))) => {
                    debug!(error = %e, "the server's answer broke off");
                    Poll::Ready(Streamed::ServerBroke)
                }
                Poll::Pending if server_silence.expired(cx, down.reading, down.progress) => {
                    Poll::Ready(Streamed::ServerSilent)
                }
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        self.body_end = body_end;
        streamed
    }

    /// The exchange's end: its outcome, the server connection pooled or closed, the client's
    /// connection kept for another request or closed.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    fn settle(
        mut self,
        streamed: Streamed,
        answered: Settled<'_>,
        conn: ServerConn<U>,
        resp: &Buffer,
        choice: &Choice<U>,
    ) -> impl Future<Output = Next<U>> {
        async move {
            let Settled {
                head,
                keep_alive,
                request_sent,
            } = answered;
            let (end, body_sent) = match streamed {
                Streamed::Whole { end, body_sent } => (end, body_sent),
                cut => {
                    self.record.exchange.outcome = match cut {
                        Streamed::ServerSilent => ExchangeOutcome::ServerTimeout,
                        Streamed::ClientTimeout => ExchangeOutcome::ClientTimeout,
                        _ => ExchangeOutcome::Incomplete,
                    };
                    if head.framing() == Framing::Body(Body::UntilClose) {
                        // Its end is the connection's: a reset, so the cut is not taken for it.
                        self.client.io.reset_on_close();
                    }
                    return Next::Close;
                }
            };
            self.record.exchange.outcome = ExchangeOutcome::Served;
            // An answer whose head came before the request was sent whole closes its server
            // connection, however the rest of the body went after: the server may read that rest
            // as a request of its own, and its answer would meet the next user.
            let finish = Finish {
                request_sent,
                response_read: true,
                server_sent_more: resp.len() > end,
                told_keep_alive: keep_alive,
                response_sent: true,
                failed: false,
            };
            let reuse = h1::reuse(head, &finish);
            let server = &choice.server;
            if reuse.server && self.engine.upstreams.keeps(server) {
                let max_idle = self.settings.max_idle;
                self.engine.pool.put(server, conn, max_idle);
            } else if !self.engine.upstreams.keeps(server) {
                self.engine.pool.forget(server);
            }
            match self.body_end {
                Some(end) if reuse.client => self.next(end),
                _ => self.closed(true, body_sent).await,
            }
        }
    }

    /// The server agreed to switch protocols: its `101` goes to the client with what it sent
    /// after, and the connection becomes a tunnel ([`SwitchedConnection`]), relayed by the
    /// client's loop once this exchange's future is gone, so an idle tunnel holds only what it
    /// relays.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    fn tunnel(
        self,
        conn: ServerConn<U>,
        head: &ResponseHead,
        resp: Buffer,
        choice: Choice<U>,
    ) -> impl Future<Output = Next<U>> {
        async move {
            let InHand {
                engine,
                client,
                buf,
                settings,
                record,
                body_end,
                ..
            } = self;
            let how = ToClient {
                version: h1::Version::Http11,
                keep_alive: false,
            };
            let mut editor = head.to_client(resp.filled(), &how);
            if let Some(cookie) = &choice.set_cookie {
                let _ = editor.add(b"Set-Cookie", &[cookie.as_bytes()]);
            }
            let mut out = head.write(resp.filled(), editor);
            let ahead = Span::between(head.len(), resp.len());
            out.append_input(ahead);
            // Counted now; reported to the balancer when the tunnel ends, with its bytes.
            let mut exchange = record.upgraded();
            let started = Instant::now();
            if write_out(&mut *client.io, &mut out, resp.filled())
                .await
                .is_err()
            {
                exchange.outcome = ExchangeOutcome::Incomplete;
                engine.upstreams.report(Report::Exchange(&exchange));
                return Next::Close;
            }
            let first = buf.filled()[body_end.unwrap_or(buf.len()).min(buf.len())..].to_vec();
            engine.stats.upgrades.fetch_add(1, Relaxed);
            Next::Tunnel(Box::new(SwitchedConnection {
                conn,
                choice,
                client_hold: None,
                first,
                to_client: u64::from(ahead.len),
                exchange,
                idle: settings.tunnel_idle_timeout,
                started,
            }))
        }
    }
}
