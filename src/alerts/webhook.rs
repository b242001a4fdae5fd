//! `ALERT_WEBHOOK`: one POST of an alert to an `http://` or `https://` URL, over hyper's
//! client and rustls (`https` verified with the system's roots, or `ALERT_WEBHOOK_CA`), each
//! attempt bounded by `ALERT_TIMEOUT`, retried 3 times with back-off. The URL's path and
//! query are secrets: no error here repeats them.

use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::config::{Host, Webhook};
use crate::tls::{Cause, SslMethod, UpstreamSettings, UpstreamTls};

/// The waits before each retry: a receiver that blinks (a restart, a proxy's hiccup) gets
/// seven seconds to come back before the alert is given up.
pub const BACKOFF: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// Why one attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookFailure {
    /// Worth another try: no connection, no answer in time, 5xx or 429.
    Again(String),
    /// Not: the receiver refused the alert (another 4xx, a redirect).
    Refused(String),
}

impl WebhookFailure {
    /// The failure in words.
    pub fn words(&self) -> &str {
        match self {
            WebhookFailure::Again(w) | WebhookFailure::Refused(w) => w,
        }
    }
}

/// A webhook, ready to be posted to.
#[derive(Debug)]
pub struct Receiver {
    hook: Webhook,
    /// The TLS of an `https` webhook; `Err` (why) when it cannot be had.
    tls: Option<Result<UpstreamTls, String>>,
    timeout: Duration,
}

impl Receiver {
    /// A receiver at `hook`, its TLS verified against `ca` (else the system's roots), each
    /// attempt bounded by `timeout`.
    pub fn new(hook: Webhook, ca: Option<std::path::PathBuf>, timeout: Duration) -> Receiver {
        let tls = hook.tls.then(|| {
            let settings = UpstreamSettings {
                verify: true,
                ca,
                server_name: None,
                method: SslMethod::default(),
                alpn_http1: true,
            };
            UpstreamTls::load(&settings, &crate::tls::upstream::system_roots())
                .map_err(|findings| findings.to_string().replace('\n', "; "))
        });
        Receiver { hook, tls, timeout }
    }

    /// `https://host`, as logs name the receiver.
    pub fn name(&self) -> String {
        format!("webhook {}", self.hook.origin())
    }

    /// Posts `body` (JSON), retrying a failure worth it after each of [`BACKOFF`]; the
    /// attempts made, or the last failure.
    pub async fn deliver(&self, body: &[u8]) -> Result<u32, WebhookFailure> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.post(body).await {
                Ok(()) => return Ok(attempts),
                Err(WebhookFailure::Again(words)) if (attempts as usize) <= BACKOFF.len() => {
                    tracing::debug!("{}: {words}; trying again", self.name());
                    tokio::time::sleep(BACKOFF[attempts as usize - 1]).await;
                }
                Err(failure) => return Err(failure),
            }
        }
    }

    /// One attempt, bounded by the timeout.
    pub async fn post(&self, body: &[u8]) -> Result<(), WebhookFailure> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.exchange(body)).await {
            Ok(result) => result,
            Err(_) => Err(WebhookFailure::Again(format!(
                "no answer within {} (ALERT_TIMEOUT)",
                crate::config::show_duration(timeout)
            ))),
        }
    }

    async fn exchange(&self, body: &[u8]) -> Result<(), WebhookFailure> {
        let host = match &self.hook.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Name(name) => name.clone(),
        };
        let stream = TcpStream::connect((host.as_str(), self.hook.port))
            .await
            .map_err(|e| {
                WebhookFailure::Again(format!(
                    "cannot connect: {}",
                    crate::support::os_error::words(&e)
                ))
            })?;
        let _ = stream.set_nodelay(true);
        match &self.tls {
            None => self.send(stream, body).await,
            Some(Err(why)) => Err(WebhookFailure::Refused(format!("no TLS: {why}"))),
            Some(Ok(tls)) => {
                let stream = tls
                    .connect(&host, stream, self.timeout)
                    .await
                    .map_err(|e| match e.cause {
                        // The receiver's certificate will not change by the next try.
                        Cause::Expired
                        | Cause::NotYetValid
                        | Cause::UnknownIssuer
                        | Cause::NameMismatch
                        | Cause::WrongPurpose
                        | Cause::BadCertificate
                        | Cause::Incompatible
                        | Cause::NotTls => WebhookFailure::Refused(format!("TLS: {e}")),
                        _ => WebhookFailure::Again(format!("TLS: {e}")),
                    })?;
                self.send(stream, body).await
            }
        }
    }

    /// The request over `stream`, and its status judged.
    async fn send<S>(&self, stream: S, body: &[u8]) -> Result<(), WebhookFailure>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.hook.expose_target())
            .header(header::HOST, self.authority())
            .header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
            .header(
                header::USER_AGENT,
                HeaderValue::from_static(concat!("appbroker/", env!("CARGO_PKG_VERSION"))),
            )
            .header(header::CONNECTION, HeaderValue::from_static("close"))
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|_| WebhookFailure::Refused("the URL cannot make a request".into()))?;
        let status = crate::net::http_exchange::one_exchange(stream, request)
            .await
            .map_err(|e| WebhookFailure::Again(format!("HTTP: {e}")))?;
        match status.as_u16() {
            200..=299 => Ok(()),
            429 | 500..=599 => Err(WebhookFailure::Again(format!("answered {status}"))),
            _ => Err(WebhookFailure::Refused(format!("answered {status}"))),
        }
    }

    /// The `Host` header: the host, and the port unless it is the scheme's.
    fn authority(&self) -> String {
        let default = if self.hook.tls { 443 } else { 80 };
        let with_port = self.hook.host.authority(self.hook.port);
        if self.hook.port == default {
            with_port
                .strip_suffix(&format!(":{default}"))
                .map_or(with_port.clone(), str::to_string)
        } else {
            with_port
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_receiver_that_refuses_is_tried_four_times_over_seven_seconds() {
        // A port that refuses: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a port");
        let hook = Webhook::parse(&format!("http://127.0.0.1:{port}/x")).expect("a URL");
        let receiver = Receiver::new(hook, None, Duration::from_secs(10));
        let started = tokio::time::Instant::now();
        let failure = receiver.deliver(b"{}").await.expect_err("refused");
        assert!(failure.words().starts_with("cannot connect"), "{failure:?}");
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(7),
            "1 + 2 + 4 s of back-off"
        );
    }
}
