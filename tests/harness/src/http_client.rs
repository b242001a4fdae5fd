//! Clients of an HTTP balancer: hyper's, kept alive or for one request, and raw bytes for what
//! hyper would not send.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::HeaderMap;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{DEADLINE, OriginBody, full};

/// A kept-alive client connection to `addr`.
pub async fn client(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<OriginBody> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection.with_upgrades());
    sender
}

/// A request with `host`, ready to send.
pub fn request(
    method: &str,
    addr: SocketAddr,
    path: &str,
    body: OriginBody,
) -> Request<OriginBody> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .body(body)
        .unwrap()
}

/// One GET on a new connection: status, headers, body.
pub async fn get(addr: SocketAddr, path: &str) -> (StatusCode, HeaderMap, Bytes) {
    let mut sender = client(addr).await;
    send(&mut sender, request("GET", addr, path, full(""))).await
}

/// Sends on `sender` and reads the whole answer.
pub async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<OriginBody>,
    request: Request<OriginBody>,
) -> (StatusCode, HeaderMap, Bytes) {
    sender.ready().await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, body)
}

/// A whole body of `text`.
pub fn body(text: &'static str) -> OriginBody {
    full(text)
}

/// Sends raw bytes on a new connection and reads until the broker closes it: everything it
/// answered.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the broker did not close the connection");
    String::from_utf8_lossy(&answer).into_owned()
}

/// The status lines in `answer` (one per HTTP answer it holds).
pub fn status_lines(answer: &str) -> Vec<&str> {
    answer
        .lines()
        .filter(|l| l.starts_with("HTTP/1."))
        .collect()
}
