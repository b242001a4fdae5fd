//! The demo's stand-in web servers, behind its HTTP balancer: a page that says which server
//! answered it, a script it loads (which says so too) and a WebSocket the script opens back
//! (whose echo names the server holding it), so a newcomer sees in a browser that every
//! request of one browser reaches one server, and that stopping that server moves the browser
//! to another with a new cookie. Each server keeps a record of what it served, which the tests
//! read to tell which server served each request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, HeaderValue, SEC_WEBSOCKET_KEY};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::sync::CancellationToken;

/// The response header naming the server that answered, for clients that are not browsers
/// (`curl -i`).
pub const SERVED_BY: &str = "x-appbroker-demo-server";

/// Where the page's script lives.
pub const SCRIPT_PATH: &str = "/demo.js";

/// Where the script opens its WebSocket.
pub const WEBSOCKET_PATH: &str = "/demo/ws";

/// What a stand-in web server was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// The page (any path but the script's and the WebSocket's).
    Page,
    /// The page's script.
    Script,
    /// A WebSocket opened on [`WEBSOCKET_PATH`].
    WebSocket,
}

/// One request a stand-in web server answered.
#[derive(Debug, Clone)]
pub struct Served {
    /// What was asked for.
    pub resource: Resource,
    /// The request's path and query.
    pub target: String,
    /// The request's `Cookie` header as the server received it: the broker keeps its own
    /// cookie to itself, which a test checks here.
    pub cookie: Option<String>,
}

/// What one stand-in web server served, in order (the last [`KEPT`]); shared with whoever
/// started it.
#[derive(Debug, Clone, Default)]
pub struct Record(Arc<Mutex<VecDeque<Served>>>);

/// Requests a record keeps: plenty for a test or a look, and a demo left running under a load
/// generator stays small.
pub const KEPT: usize = 10_000;

impl Record {
    /// Everything served so far (the last [`KEPT`]).
    pub fn served(&self) -> Vec<Served> {
        self.lock().iter().cloned().collect()
    }

    fn push(&self, served: Served) {
        let mut record = self.lock();
        if record.len() == KEPT {
            record.pop_front();
        }
        record.push_back(served);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Served>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves one connection of a browser as the server `name`, until `stop`; a WebSocket
/// upgraded from it runs until `stop` too, so a stopped server drops its WebSockets as a
/// crashed one would.
pub async fn serve(stream: TcpStream, name: Arc<str>, record: Record, stop: CancellationToken) {
    let service = service_fn(move |request| {
        let answer = answer(request, &name, &record, &stop);
        async move { Ok::<_, Infallible>(answer) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

/// The answer to one request: the page, the script, or a WebSocket's handshake.
fn answer(
    mut request: Request<Incoming>,
    name: &Arc<str>,
    record: &Record,
    stop: &CancellationToken,
) -> Response<Full<Bytes>> {
    let target = request
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_string(), ToString::to_string);
    let cookie = request
        .headers()
        .get(COOKIE)
        .map(|c| String::from_utf8_lossy(c.as_bytes()).into_owned());
    let key = request.headers().get(SEC_WEBSOCKET_KEY).cloned();
    let resource = match (request.uri().path(), &key) {
        (WEBSOCKET_PATH, Some(_)) => Resource::WebSocket,
        (SCRIPT_PATH, _) => Resource::Script,
        _ => Resource::Page,
    };
    record.push(Served {
        resource,
        target,
        cookie,
    });
    let (status, content_type, body) = match (resource, key) {
        (Resource::WebSocket, Some(key)) => {
            let upgrade = hyper::upgrade::on(&mut request);
            let holder = Arc::clone(name);
            tokio::spawn(stop.clone().run_until_cancelled_owned(async move {
                if let Ok(upgraded) = upgrade.await {
                    echo(TokioIo::new(upgraded), &holder).await;
                }
            }));
            let mut response = Response::new(Full::default());
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let headers = response.headers_mut();
            headers.insert("upgrade", HeaderValue::from_static("websocket"));
            headers.insert("connection", HeaderValue::from_static("upgrade"));
            if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
                headers.insert("sec-websocket-accept", accept);
            }
            return with_name(response, name);
        }
        (Resource::Script, _) => (
            StatusCode::OK,
            "text/javascript; charset=utf-8",
            script(name),
        ),
        _ => (StatusCode::OK, "text/html; charset=utf-8", page(name)),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Never from the browser's cache: each load asks the servers again, so a reload shows
    // where the browser goes now.
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    with_name(response, name)
}

/// `response` with the [`SERVED_BY`] header.
fn with_name(mut response: Response<Full<Bytes>>, name: &str) -> Response<Full<Bytes>> {
    if let Ok(value) = HeaderValue::from_str(name) {
        response.headers_mut().insert(SERVED_BY, value);
    }
    response
}

/// Answers every text message with the name of the server holding the WebSocket and the
/// message, until the browser closes it.
async fn echo<S>(io: S, name: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
    while let Some(Ok(message)) = ws.next().await {
        let reply = match message {
            Message::Text(text) => {
                Message::text(format!("{name} holds this WebSocket; echo: {text}"))
            }
            Message::Close(_) => break,
            _ => continue,
        };
        if ws.send(reply).await.is_err() {
            break;
        }
    }
}

/// The page: which server answered, and what the script and the WebSocket say.
fn page(name: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>appbroker demo: {name}</title></head>\n\
         <body>\n<h1>appbroker demo: session affinity</h1>\n\
         <p id=\"page\">page: served by {name}</p>\n\
         <p id=\"script\">script: not loaded</p>\n\
         <p id=\"websocket\">websocket: connecting</p>\n\
         <p>Every request of this browser goes to one server: the broker's first answer set the \
         cookie TOTVS_BROKER_SH_001, which names it. Reload: the same server answers. Stop it on \
         the demo's console (type its id, 01 or 02, and Enter), then reload: the broker moves \
         this browser to the other server and sets a new cookie.</p>\n\
         <script src=\"{SCRIPT_PATH}\"></script>\n</body></html>\n"
    )
}

/// The page's script: says which server served it, opens the WebSocket and shows its echo.
fn script(name: &str) -> String {
    format!(
        "document.getElementById('script').textContent = 'script: served by {name}';\n\
         const shown = document.getElementById('websocket');\n\
         const scheme = location.protocol === 'https:' ? 'wss://' : 'ws://';\n\
         const ws = new WebSocket(scheme + location.host + '{WEBSOCKET_PATH}');\n\
         ws.onopen = () => ws.send('hello from the browser');\n\
         ws.onmessage = e => {{ shown.textContent = 'websocket: ' + e.data; }};\n\
         ws.onclose = () => {{ shown.textContent += ' (closed)'; }};\n"
    )
}
