//! A request the balancer answers itself (the query interface): made the balancer's own
//! [`LocalRequest`] (its bytes copied: only such requests pay for it), its body read whole
//! within [`MOST_LOCAL_BODY`] and `HTTP_BODY_TIMEOUT`, handed to [`Upstreams::intercept`],
//! which may await, and its [`LocalAnswer`] written by the engine's one formatter within
//! [`WRITE_TIMEOUT`].

use std::future::poll_fn;
use std::time::Duration;

use hyper::StatusCode;

use super::client::Next;
use super::exchange::InHand;
use super::own;
use crate::http::h1::{Body, BodyReader, Part};
use crate::http::refusal::Refusal;
use crate::http::{
    ClientHead, ExchangeOutcome, LocalAnswer, LocalBody, LocalRequest, MOST_LOCAL_BODY, Upstreams,
};
use crate::net::stream::Stream;

/// How long a client may take to read the balancer's answer (a status page of some tens of
/// KiB): past it the connection is closed, so a client that never reads holds no query place
/// for longer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a body was not read whole.
enum BodyFault {
    /// The client closed or failed: the connection closes without a word.
    Gone,
    /// Its chunks are malformed: 400.
    Malformed,
    /// It stopped coming for `HTTP_BODY_TIMEOUT`: 408.
    Silent,
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// The balancer's own answer to this request; the connection goes on after it when the
    /// client wants it, its body was read whole, no drain is on and the balancer did not end
    /// it (a query place given up, a query connection past its life).
    pub(super) async fn intercepted(mut self) -> Next<U> {
        let mut request = self.local_request();
        // The request is the balancer's now: the buffer keeps what follows its head.
        self.buf.consume(self.head.len());
        let whole = match self.head.body() {
            Body::Empty | Body::Length(0) => true,
            body => match self.local_body(body).await {
                Ok(body) => {
                    let whole = body != LocalBody::TooLarge;
                    request.body = body;
                    whole
                }
                Err(BodyFault::Gone) => return Next::Close,
                Err(BodyFault::Malformed) => return self.refuse(Refusal::Body).await,
                Err(BodyFault::Silent) => {
                    self.record.exchange.outcome = ExchangeOutcome::ClientTimeout;
                    return self.page(StatusCode::REQUEST_TIMEOUT, None, false).await;
                }
            },
        };
        let upstreams = &self.engine.upstreams;
        let answer: LocalAnswer = upstreams.intercept(request, self.admission).await;
        let mut ending = self.own_ending();
        ending.close =
            !self.head.keep_alive() || !whole || answer.close || self.client.closing.is_cancelled();
        self.record.exchange.outcome = ExchangeOutcome::Local;
        self.record.answered_code(answer.status);
        if !ending.head_only {
            self.record.exchange.to_client = answer.body.len() as u64;
        }
        self.record.report();
        let bytes = own::local(&answer, ending);
        drop(answer);
        let written = tokio::time::timeout(WRITE_TIMEOUT, self.client.write(&bytes)).await;
        let written = written.unwrap_or(false);
        if written && !ending.close {
            return self.next(0);
        }
        self.closed(written, whole).await
    }

    /// The request as the balancer's own type: its method, target and lines copied, and
    /// what its head measured.
    fn local_request(&self) -> LocalRequest {
        let view = ClientHead::new(&self.head, self.buf.filled());
        let peer = &self.client.peer;
        let target = view.path_and_query();
        let mut request = LocalRequest::new(view.method_bytes(), target, peer.peer, peer.tls);
        for (_, field) in view.fields() {
            request.push_field(field.name, field.value);
        }
        request.proxied = self.client.via.is_some();
        let line = self.buf.filled().iter().position(|&b| b == b'\n');
        request.line_len = line.map_or(self.head.len(), |end| end + 1);
        request.head_len = self.head.len();
        request
    }

    /// The request's body, from the start of the buffer on (its head consumed), read whole
    /// when it is [`MOST_LOCAL_BODY`] or less; the buffer keeps what follows it (a pipelined
    /// request). Each silence is bounded by `HTTP_BODY_TIMEOUT`.
    async fn local_body(&mut self, body: Body) -> Result<LocalBody, BodyFault> {
        let mut reader = BodyReader::new(body);
        let mut data = Vec::new();
        loop {
            let mut used = 0;
            while used < self.buf.len() && !reader.is_done() {
                let input = &self.buf.filled()[used..];
                let step = reader.step(input).map_err(|_| BodyFault::Malformed)?;
                if step.part == Part::Data {
                    if data.len() + step.len > MOST_LOCAL_BODY {
                        return Ok(LocalBody::TooLarge);
                    }
                    data.extend_from_slice(&input[..step.len]);
                }
                used += step.len;
            }
            self.buf.consume(used);
            if reader.is_done() {
                return Ok(LocalBody::Whole(data));
            }
            let (buf, io) = (&mut self.buf, &mut *self.client.io);
            let read = poll_fn(|cx| buf.poll_read_from(cx, io));
            match tokio::time::timeout(self.settings.body_timeout, read).await {
                Ok(Ok(0) | Err(_)) => return Err(BodyFault::Gone),
                Ok(Ok(_)) => {}
                Err(_) => return Err(BodyFault::Silent),
            }
        }
    }
}
