//! `MONITORING_TYPE=HTTP`: one `GET` of `MONITOR_PATH` over a connection the monitor dialed
//! (plain or TLS), passed when the status is within `MONITOR_EXPECT_STATUS`.

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::config::StatusRange;
use crate::net::http_exchange::one_exchange;

/// What one check asks.
#[derive(Debug, Clone)]
pub struct HttpCheck {
    /// `MONITOR_PATH`, e.g. `/`.
    pub path: String,
    /// The `Host` header: the server's address as configured (`host:port`), a name without
    /// its final dot ([`crate::config::Host::authority`]).
    pub host: String,
    /// `MONITOR_EXPECT_STATUS`.
    pub expect: StatusRange,
    /// The whole exchange must finish within this.
    pub timeout: Duration,
}

/// Why a server failed an HTTP check, in an operator's words.
#[derive(Debug, thiserror::Error)]
pub enum HttpCheckError {
    /// Nothing, or not all of an answer's head, within the timeout.
    #[error("no HTTP answer to GET {path} within {timeout:?}")]
    Timeout {
        /// The path asked.
        path: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The answer was not HTTP, or the connection failed.
    #[error("GET {path} failed: {source}")]
    Http {
        /// The path asked.
        path: String,
        /// hyper's words.
        source: hyper::Error,
    },
    /// An answer, with a status out of the expected range.
    #[error("GET {path} answered {status}, expected {expect} (MONITOR_EXPECT_STATUS)")]
    Status {
        /// The path asked.
        path: String,
        /// The status received.
        status: StatusCode,
        /// The range expected.
        expect: StatusRange,
    },
    /// `MONITOR_PATH` or the host cannot make a request.
    #[error("cannot build a check request for {path}: {reason}")]
    Request {
        /// The path asked.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Checks a server over `stream`: `GET path` with `Host`, and `Connection: close`. The
/// status passes when within `check.expect`; the answer's body is read up to 64 KiB.
pub async fn check<S>(stream: S, check: &HttpCheck) -> Result<StatusCode, HttpCheckError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let path = check.path.clone();
    let request = Request::builder()
        .method(Method::GET)
        .uri(&check.path)
        .header(header::HOST, &check.host)
        .header(
            header::USER_AGENT,
            HeaderValue::from_static("appbroker-monitor"),
        )
        .header(header::CONNECTION, HeaderValue::from_static("close"))
        .body(Empty::<Bytes>::new())
        .map_err(|e| HttpCheckError::Request {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    let exchange = async {
        one_exchange(stream, request)
            .await
            .map_err(|source| HttpCheckError::Http {
                path: path.clone(),
                source,
            })
    };
    let status = tokio::time::timeout(check.timeout, exchange)
        .await
        .map_err(|_| HttpCheckError::Timeout {
            path: path.clone(),
            timeout: check.timeout,
        })??;
    if check.expect.contains(status.as_u16()) {
        Ok(status)
    } else {
        Err(HttpCheckError::Status {
            path,
            status,
            expect: check.expect,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_ranges() {
        type Expected = Result<(u16, u16), &'static str>;
        let cases: &[(&str, Expected)] = &[
            ("200-399", Ok((200, 399))),
            (" 204 ", Ok((204, 204))),
            ("200 - 299", Ok((200, 299))),
            ("399-200", Err("is empty")),
            ("2xx", Err("not an HTTP status")),
            ("99", Err("not an HTTP status")),
            ("600", Err("not an HTTP status")),
            ("", Err("not an HTTP status")),
        ];
        for (text, expected) in cases {
            match (text.parse::<StatusRange>(), expected) {
                (Ok(r), Ok((low, high))) => assert_eq!((r.low, r.high), (*low, *high), "{text}"),
                (Err(e), Err(words)) => assert!(e.contains(words), "{text}: {e}"),
                (got, _) => panic!("{text}: {got:?}"),
            }
        }
        assert_eq!(StatusRange::default().to_string(), "200-399");
        assert!(StatusRange::default().contains(302));
        assert!(!StatusRange::default().contains(404));
    }
}
