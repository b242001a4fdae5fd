//! A webhook receiver on loopback for the broker's alerts: it records every POST (its target,
//! headers and body), answers each as the test says (200, a status, or not at all until
//! released), over plain HTTP or TLS.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::{DEADLINE, eventually};

/// How the receiver answers the next POSTs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// 200.
    Ok,
    /// This status.
    Status(u16),
    /// Nothing, until [`WebhookReceiver::release`] (then 200).
    Hang,
}

/// One POST the receiver took.
#[derive(Debug, Clone)]
pub struct Posted {
    /// The request target (path and query).
    pub target: String,
    /// `Content-Type`.
    pub content_type: String,
    /// `Host`.
    pub host: String,
    /// The body as JSON (`Null` when it is none).
    pub body: serde_json::Value,
}

/// A webhook receiver on a fresh loopback port.
pub struct WebhookReceiver {
    /// Where it listens.
    pub addr: SocketAddr,
    posted: Arc<Mutex<Vec<Posted>>>,
    /// Answers for the next POSTs, in order; then `default`.
    answers: Arc<Mutex<VecDeque<Reply>>>,
    default: Arc<Mutex<Reply>>,
    release: Arc<tokio::sync::Notify>,
    /// POSTs not answered yet (hanging).
    pub hanging: Arc<AtomicUsize>,
    /// Connections accepted.
    pub accepted: Arc<AtomicUsize>,
}

impl WebhookReceiver {
    /// A plain HTTP receiver answering 200.
    pub async fn start() -> WebhookReceiver {
        WebhookReceiver::start_with(None).await
    }

    /// A receiver speaking TLS with `acceptor`'s certificate.
    pub async fn start_tls(acceptor: TlsAcceptor) -> WebhookReceiver {
        WebhookReceiver::start_with(Some(acceptor)).await
    }

    async fn start_with(tls: Option<TlsAcceptor>) -> WebhookReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let receiver = WebhookReceiver {
            addr: listener.local_addr().unwrap(),
            posted: Arc::default(),
            answers: Arc::default(),
            default: Arc::new(Mutex::new(Reply::Ok)),
            release: Arc::new(tokio::sync::Notify::new()),
            hanging: Arc::default(),
            accepted: Arc::default(),
        };
        let shared = receiver.shared();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                shared.accepted.fetch_add(1, SeqCst);
                let (shared, tls) = (shared.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        None => serve(stream, shared).await,
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                serve(stream, shared).await;
                            }
                        }
                    }
                });
            }
        });
        receiver
    }

    fn shared(&self) -> Shared {
        Shared {
            posted: Arc::clone(&self.posted),
            answers: Arc::clone(&self.answers),
            default: Arc::clone(&self.default),
            release: Arc::clone(&self.release),
            hanging: Arc::clone(&self.hanging),
            accepted: Arc::clone(&self.accepted),
        }
    }

    /// Answers the next POSTs so, in order, then as before.
    pub fn then(&self, answers: &[Reply]) {
        self.answers.lock().unwrap().extend(answers.iter().copied());
    }

    /// Answers every POST so from now on.
    pub fn always(&self, answer: Reply) {
        *self.default.lock().unwrap() = answer;
    }

    /// Lets every hanging POST answer 200, and the next ones too.
    pub fn release(&self) {
        self.always(Reply::Ok);
        self.release.notify_waiters();
    }

    /// Every POST so far.
    pub fn posted(&self) -> Vec<Posted> {
        self.posted.lock().unwrap().clone()
    }

    /// The `event` of each JSON body so far, in order.
    pub fn events(&self) -> Vec<String> {
        self.posted()
            .iter()
            .filter_map(|p| p.body.get("event")?.as_str().map(str::to_string))
            .collect()
    }

    /// The first body whose `event` is `event`, waited for.
    pub async fn wait_for(&self, event: &str) -> serde_json::Value {
        let found = || {
            self.posted()
                .into_iter()
                .find(|p| p.body.get("event").and_then(|e| e.as_str()) == Some(event))
        };
        eventually(&format!("a POST of {event} within {DEADLINE:?}"), || {
            found().is_some()
        })
        .await;
        found().unwrap().body
    }

    /// The first `text` body holding `needle`, waited for.
    pub async fn wait_for_text(&self, needle: &str) -> String {
        let found = || {
            self.posted().into_iter().find_map(|p| {
                let text = p.body.get("text")?.as_str()?.to_string();
                text.contains(needle).then_some(text)
            })
        };
        eventually(&format!("a text POST holding `{needle}`"), || {
            found().is_some()
        })
        .await;
        found().unwrap()
    }
}

/// What each connection's task shares with the receiver.
#[derive(Clone)]
struct Shared {
    posted: Arc<Mutex<Vec<Posted>>>,
    answers: Arc<Mutex<VecDeque<Reply>>>,
    default: Arc<Mutex<Reply>>,
    release: Arc<tokio::sync::Notify>,
    hanging: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(stream: S, shared: Shared) {
    let service = service_fn(move |request| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(answer(request, shared).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn answer(request: Request<Incoming>, shared: Shared) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let header = |name: hyper::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let answer = shared
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| *shared.default.lock().unwrap());
    shared.posted.lock().unwrap().push(Posted {
        target: parts.uri.to_string(),
        content_type: header(hyper::header::CONTENT_TYPE),
        host: header(hyper::header::HOST),
        body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    });
    let status = match answer {
        Reply::Ok => 200,
        Reply::Status(status) => status,
        Reply::Hang => {
            shared.hanging.fetch_add(1, SeqCst);
            let released = shared.release.notified();
            released.await;
            shared.hanging.fetch_sub(1, SeqCst);
            200
        }
    };
    let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
}
