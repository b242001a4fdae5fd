//! One HTTP/1.1 request over a connection already made, and the status of its answer: hyper's
//! client, for the two places the broker asks a server something over HTTP (the monitor's
//! HTTP check, `broker::monitor::http_check`, and the alerts' webhook). Nothing on a client's
//! path uses it.

use http_body_util::BodyExt;
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// At most this much of an answer's body is read, so its connection ends cleanly; the rest is
/// left unread (the connection is closed anyway).
const BODY_READ: usize = 64 * 1024;

/// One request over `stream` and the status of its answer, the answer's body read up to
/// [`BODY_READ`] (so a short answer ends cleanly; the rest is left unread, the connection
/// being closed anyway). Shared by the monitor's check and the alerts' webhook: hyper's
/// client connection driven in a task of its own for this exchange alone.
pub async fn one_exchange<S, B>(stream: S, request: Request<B>) -> Result<StatusCode, hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(connection);
    let answered = async {
        let response = sender.send_request(request).await?;
        let status = response.status();
        let mut body = response.into_body();
        let mut read = 0;
        while read < BODY_READ {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                _ => break,
            }
        }
        Ok(status)
    }
    .await;
    driver.abort();
    answered
}
