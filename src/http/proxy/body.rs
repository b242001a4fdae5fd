//! Bodies streamed through the broker, frame by frame as hyper reads them (memory stays
//! bounded by hyper's buffers whatever the size), with their bytes counted and each side's
//! silence bounded ([`Silence`]: `HTTP_BODY_TIMEOUT` for the client's body,
//! `HTTP_RESPONSE_TIMEOUT` for the server's).
//!
//! A request's body tells the engine when its last byte was handed to the server's
//! connection ([`Upload::is_finished`]): a server connection is reused only when that came
//! before the answer ended. A body the server answered without is abandoned: nothing more of
//! it is read from the client or sent.
//!
//! A request that says `Expect: 100-continue` is held end to end: its body is not asked for
//! (so the client is not told to send it) until the server says `100 Continue`, or stays
//! silent for [`EXPECT_WAIT`] (a server that ignores `Expect`), and never after a final
//! status (a 401 or 413 before any upload). Trailers are not forwarded.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

/// How long a server that says neither `100 Continue` nor a final status is waited for before
/// the body is sent anyway (curl waits 1 s too): it may be one that ignores `Expect`.
pub(crate) const EXPECT_WAIT: Duration = Duration::from_secs(1);

/// Why a body stopped before its end, as the engine's own error (hyper's errors cannot be
/// made outside hyper).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Stalled {
    /// `HTTP_BODY_TIMEOUT`: the client sent nothing more of its body for that long.
    #[error("the client sent nothing of its body for {0:?}")]
    Client(Duration),
    /// `HTTP_RESPONSE_TIMEOUT`: the server sent nothing more of its answer for that long.
    #[error("the server sent nothing of its answer for {0:?}")]
    Server(Duration),
}

/// A body's error as hyper takes it back.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// How a request's body went, shared between the body (inside hyper's client connection)
/// and the request's handler.
#[derive(Debug, Default)]
pub(crate) struct Upload {
    /// Data bytes handed to the server's connection so far.
    pub(crate) sent: AtomicU64,
    /// The client's body broke off or was malformed (a bad chunk): the client's fault, not
    /// the server's.
    pub(crate) failed: AtomicBool,
    /// The client sent nothing of its body for `HTTP_BODY_TIMEOUT`: its fault too.
    pub(crate) timed_out: AtomicBool,
    /// Cancelled once the body's last byte was handed to the server's connection (at once
    /// for a request without a body).
    finished: CancellationToken,
    /// The server answered without the rest of the body: none of it is read or sent any
    /// more.
    abandoned: AtomicBool,
}

impl Upload {
    /// Whether the whole request was handed to the server's connection.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished.is_cancelled()
    }

    /// Completes once the whole request was handed to the server's connection.
    pub(crate) fn finished(&self) -> WaitForCancellationFuture<'_> {
        self.finished.cancelled()
    }

    fn finish(&self) {
        self.finished.cancel();
    }

    /// Stops the body where it is: the server answered without it.
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Relaxed);
    }

    /// The body failed for the client's reasons (broken off, malformed, or too slow).
    pub(crate) fn clients_fault(&self) -> bool {
        self.failed.load(Relaxed) || self.timed_out.load(Relaxed)
    }
}

/// The longest a peer may stay silent while the engine waits on it for the next frame of a
/// body. Armed when the engine starts waiting and disarmed when a frame comes, so the time
/// the engine spends not asking (the other side slow to take what was read) is never counted
/// against this one.
pub(crate) struct Silence {
    limit: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    waiting: bool,
}

impl Silence {
    pub(crate) fn new(limit: Duration) -> Silence {
        Silence {
            limit,
            timer: None,
            waiting: false,
        }
    }

    /// Called while the peer has nothing for us: true once it has been silent for the limit
    /// since the wait began (until then `cx` is woken when the limit passes).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.waiting {
            self.waiting = true;
            let deadline = Instant::now() + self.limit;
            match self.timer.as_mut() {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        self.timer
            .as_mut()
            .is_some_and(|timer| timer.as_mut().poll(cx).is_ready())
    }

    /// A frame came: the next wait starts its own count.
    fn heard(&mut self) {
        self.waiting = false;
    }
}

/// A request's body on its way to the server.
pub(crate) struct RequestBody {
    inner: Option<Incoming>,
    upload: Arc<Upload>,
    gate: Option<Gate>,
    silence: Silence,
}

/// Holds an `Expect: 100-continue` body back until the server's `100 Continue`.
struct Gate {
    open: Pin<Box<WaitForCancellationFutureOwned>>,
    wait: Pin<Box<Sleep>>,
}

impl RequestBody {
    /// No body (a retried request that had none).
    pub(crate) fn empty() -> RequestBody {
        RequestBody {
            inner: None,
            upload: Arc::default(),
            gate: None,
            silence: Silence::new(Duration::ZERO),
        }
    }

    /// The client's body, each wait for its next frame bounded by `timeout`; with
    /// `continued`, held until it is cancelled (the server's `100 Continue`) or
    /// [`EXPECT_WAIT`] passed.
    pub(crate) fn new(
        inner: Incoming,
        upload: Arc<Upload>,
        continued: Option<CancellationToken>,
        timeout: Duration,
    ) -> RequestBody {
        if inner.is_end_stream() {
            upload.finish();
        }
        RequestBody {
            inner: Some(inner),
            upload,
            gate: continued.map(|token| Gate {
                open: Box::pin(token.cancelled_owned()),
                wait: Box::pin(tokio::time::sleep(EXPECT_WAIT)),
            }),
            silence: Silence::new(timeout),
        }
    }

    /// Whether nothing of the body was asked for yet (so it could go to another server).
    pub(crate) fn untouched(&self) -> bool {
        self.upload.sent.load(Relaxed) == 0
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.upload.abandoned.load(Relaxed) {
            // Dropping the client's body tells its connection to read no more of it; hyper
            // is never told the body ended, so it sends nothing more on the server's
            // connection, which closes once the answer is read.
            this.inner = None;
            this.gate = None;
            return Poll::Pending;
        }
        if let Some(gate) = this.gate.as_mut() {
            if gate.open.as_mut().poll(cx).is_pending() && gate.wait.as_mut().poll(cx).is_pending()
            {
                return Poll::Pending;
            }
            this.gate = None;
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            let frame = match Pin::new(&mut *inner).poll_frame(cx) {
                Poll::Pending if this.silence.expired(cx) => {
                    this.upload.timed_out.store(true, Relaxed);
                    return Poll::Ready(Some(Err(Stalled::Client(this.silence.limit).into())));
                }
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.upload.finish();
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    this.upload.failed.store(true, Relaxed);
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            this.silence.heard();
            // Trailers: not forwarded.
            if let Ok(data) = frame.into_data() {
                this.upload.sent.fetch_add(data.len() as u64, Relaxed);
                if inner.is_end_stream() {
                    this.upload.finish();
                }
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // An abandoned body did not end: hyper must not close its framing as if it had.
        !self.upload.abandoned.load(Relaxed) && self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// How an answer's body ended for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// To its framed end.
    Whole,
    /// Broken off: by the server, by the client, or by a failed request body.
    Cut,
    /// The server sent nothing more of it for `HTTP_RESPONSE_TIMEOUT`: the client's
    /// connection is cut.
    ServerSilent,
}

/// What to do once an answer's body is finished with: account the exchange, give the
/// server's connection back when the answer went whole.
pub(crate) trait Done: Send + Unpin + 'static {
    /// `sent`: body bytes sent to the client; `ended`: how the body ended.
    fn done(self, sent: u64, ended: Ended);
}

/// An answer's body on its way to the client: the server's, or the broker's own page.
pub(crate) struct ResponseBody<D: Done> {
    inner: Source,
    sent: u64,
    done: Option<D>,
}

enum Source {
    Page(Option<Bytes>),
    Server(Incoming, Silence),
}

impl<D: Done> ResponseBody<D> {
    /// The server's body, each wait for its next frame bounded by `timeout`.
    pub(crate) fn server(inner: Incoming, done: D, timeout: Duration) -> Self {
        ResponseBody {
            inner: Source::Server(inner, Silence::new(timeout)),
            sent: 0,
            done: Some(done),
        }
    }

    /// The broker's own body.
    pub(crate) fn page(page: Bytes, done: D) -> Self {
        ResponseBody {
            inner: Source::Page(Some(page).filter(|p| !p.is_empty())),
            sent: 0,
            done: Some(done),
        }
    }

    /// Reports how the body ended, once.
    fn ended(&mut self, ended: Ended) {
        if let Some(done) = self.done.take() {
            done.done(self.sent, ended);
        }
    }
}

impl<D: Done> Body for ResponseBody<D> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let polled = match &mut this.inner {
            Source::Page(page) => page.take().map(|p| Ok(Frame::data(p))),
            Source::Server(inner, silence) => loop {
                match Pin::new(&mut *inner).poll_frame(cx) {
                    Poll::Pending if silence.expired(cx) => {
                        let limit = silence.limit;
                        this.ended(Ended::ServerSilent);
                        return Poll::Ready(Some(Err(Stalled::Server(limit).into())));
                    }
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(polled) => {
                        silence.heard();
                        match polled {
                            Some(Ok(frame)) if !frame.is_data() => continue,
                            other => break other.map(|r| r.map_err(BodyError::from)),
                        }
                    }
                }
            },
        };
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.sent += data.len() as u64;
                }
            }
            None => this.ended(Ended::Whole),
            Some(Err(_)) => this.ended(Ended::Cut),
        }
        // The last frame is out of the server's connection: give it back now, before the
        // client has the last bytes and sends its next request (which would find the pool
        // empty and open another connection).
        if this.is_end_stream() {
            this.ended(Ended::Whole);
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Source::Page(page) => page.is_none(),
            Source::Server(inner, _) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Source::Page(page) => SizeHint::with_exact(page.as_ref().map_or(0, |p| p.len() as u64)),
            Source::Server(inner, _) => inner.size_hint(),
        }
    }
}

impl<D: Done> Drop for ResponseBody<D> {
    fn drop(&mut self) {
        let ended = if self.is_end_stream() {
            Ended::Whole
        } else {
            Ended::Cut
        };
        self.ended(ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `silence` once, as a body waiting on its peer does.
    async fn expired(silence: &mut Silence) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(silence.expired(cx))).await
    }

    #[tokio::test(start_paused = true)]
    async fn silence_counts_from_the_last_frame_and_only_while_waiting() {
        let minute = Duration::from_secs(60);
        let mut silence = Silence::new(minute);
        assert!(!expired(&mut silence).await);
        tokio::time::advance(minute - Duration::from_millis(1)).await;
        assert!(!expired(&mut silence).await, "just before the limit");
        // A frame: the next wait has a minute of its own.
        silence.heard();
        assert!(!expired(&mut silence).await);
        tokio::time::advance(minute - Duration::from_millis(1)).await;
        assert!(!expired(&mut silence).await);
        // Time while nobody waits on the peer (the other side slow to take bytes) is not
        // the peer's silence.
        silence.heard();
        tokio::time::advance(minute * 10).await;
        assert!(!expired(&mut silence).await);
        tokio::time::advance(minute).await;
        assert!(
            expired(&mut silence).await,
            "a minute of silence while waiting"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_silence_wakes_its_waiter() {
        let mut silence = Silence::new(Duration::from_secs(5));
        let started = Instant::now();
        std::future::poll_fn(|cx| {
            if silence.expired(cx) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
