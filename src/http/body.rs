//! Bodies streamed through the broker, frame by frame as hyper reads them (memory stays
//! bounded by hyper's buffers whatever the size), with their bytes counted.
//!
//! A request that says `Expect: 100-continue` is held end to end: its body is not asked for
//! (so the client is not told to send it) until the server says `100 Continue`, or stays
//! silent for [`EXPECT_WAIT`] (a server that ignores `Expect`), and never when the server
//! answers at once (a 401 or 413 before any upload). Trailers are not forwarded.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// How long a server that says neither `100 Continue` nor a final status is waited for before
/// the body is sent anyway (curl waits 1 s too): it may be one that ignores `Expect`.
pub(crate) const EXPECT_WAIT: Duration = Duration::from_secs(1);

/// How a request's body went, shared between the body (inside hyper's client connection)
/// and the request's handler.
#[derive(Debug, Default)]
pub(crate) struct Upload {
    /// Data bytes handed to the server's connection so far.
    pub(crate) sent: AtomicU64,
    /// The client's body broke off or was malformed (a bad chunk): the client's fault, not
    /// the server's.
    pub(crate) failed: AtomicBool,
}

/// A request's body on its way to the server.
pub(crate) struct RequestBody {
    inner: Option<Incoming>,
    upload: Arc<Upload>,
    gate: Option<Gate>,
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
        }
    }

    /// The client's body; with `continued`, held until it is cancelled (the server's `100
    /// Continue`) or [`EXPECT_WAIT`] passed.
    pub(crate) fn new(
        inner: Incoming,
        upload: Arc<Upload>,
        continued: Option<CancellationToken>,
    ) -> RequestBody {
        RequestBody {
            inner: Some(inner),
            upload,
            gate: continued.map(|token| Gate {
                open: Box::pin(token.cancelled_owned()),
                wait: Box::pin(tokio::time::sleep(EXPECT_WAIT)),
            }),
        }
    }

    /// Whether nothing of the body was asked for yet (so it could go to another server).
    pub(crate) fn untouched(&self) -> bool {
        self.upload.sent.load(Relaxed) == 0
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(gate) = self.gate.as_mut() {
            if gate.open.as_mut().poll(cx).is_pending() && gate.wait.as_mut().poll(cx).is_pending()
            {
                return Poll::Pending;
            }
            self.gate = None;
        }
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            match ready!(Pin::new(&mut *inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        self.upload.sent.fetch_add(data.len() as u64, Relaxed);
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    // Trailers: not forwarded.
                    Err(_) => continue,
                },
                Some(Err(e)) => {
                    self.upload.failed.store(true, Relaxed);
                    return Poll::Ready(Some(Err(e)));
                }
                None => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// What to do once an answer's body is finished with: account the exchange, give the
/// server's connection back when the answer went whole.
pub(crate) trait Done: Send + Unpin + 'static {
    /// `sent`: body bytes sent to the client; `complete`: the body went whole.
    fn done(self, sent: u64, complete: bool);
}

/// An answer's body on its way to the client: the server's, or the broker's own page.
pub(crate) struct ResponseBody<D: Done> {
    inner: Source,
    sent: u64,
    complete: bool,
    done: Option<D>,
}

enum Source {
    Page(Option<Bytes>),
    Server(Incoming),
}

impl<D: Done> ResponseBody<D> {
    /// The server's body.
    pub(crate) fn server(inner: Incoming, done: D) -> Self {
        ResponseBody {
            inner: Source::Server(inner),
            sent: 0,
            complete: false,
            done: Some(done),
        }
    }

    /// The broker's own body.
    pub(crate) fn page(page: Bytes, done: D) -> Self {
        ResponseBody {
            inner: Source::Page(Some(page).filter(|p| !p.is_empty())),
            sent: 0,
            complete: false,
            done: Some(done),
        }
    }
}

impl<D: Done> Body for ResponseBody<D> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = match &mut this.inner {
            Source::Page(page) => page.take().map(|p| Ok(Frame::data(p))),
            Source::Server(inner) => loop {
                match ready!(Pin::new(&mut *inner).poll_frame(cx)) {
                    Some(Ok(frame)) if !frame.is_data() => continue,
                    other => break other,
                }
            },
        };
        match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.sent += data.len() as u64;
                }
            }
            None => this.complete = true,
            Some(Err(_)) => {}
        }
        // The last frame is out of the server's connection: give it back now, before the
        // client has the last bytes and sends its next request (which would find the pool
        // empty and open another connection).
        if (this.complete || this.is_end_stream())
            && let Some(done) = this.done.take()
        {
            this.complete = true;
            done.done(this.sent, true);
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Source::Page(page) => page.is_none(),
            Source::Server(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Source::Page(page) => SizeHint::with_exact(page.as_ref().map_or(0, |p| p.len() as u64)),
            Source::Server(inner) => inner.size_hint(),
        }
    }
}

impl<D: Done> Drop for ResponseBody<D> {
    fn drop(&mut self) {
        let complete = self.complete || self.is_end_stream();
        if let Some(done) = self.done.take() {
            done.done(self.sent, complete);
        }
    }
}
