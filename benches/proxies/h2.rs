//! The HTTP/2 rows: `h2load` over TLS (ALPN `h2`) through each proxy to the HTTP rows' origin
//! (HTTP/1.1 behind every proxy, as a browser's HTTP/2 reaches an AppServer), 64 streams on
//! each connection, and the idle HTTP/2 clients of the memory row (a TLS connection that
//! negotiated `h2`, made one request and keeps the connection). No direct path: the origin
//! speaks HTTP/1.1 in the clear, so there is nothing to compare HTTP/2 against without a proxy.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use rustls::pki_types::ServerName;
use tokio::time::timeout;
use tokio_rustls::TlsConnector;

use crate::http::{COOKIE_NAME, COOKIES};
use crate::loadgen::{IO_TIMEOUT, connect, hold_with, parse};
use crate::procs::{self, Spec};
use crate::tls::{self, TlsVersion};
use crate::{Bench, CpuWork};

/// Streams each h2load connection keeps in flight (`-m`).
pub const STREAMS: usize = 64;

/// How h2load loads a target.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum H2Load {
    /// One connection of 64 streams: a browser's page.
    One,
    /// 16 connections of 64 streams each.
    Sixteen,
}

impl H2Load {
    pub fn name(self) -> &'static str {
        match self {
            H2Load::One => "h2_1",
            H2Load::Sixteen => "h2_16",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            H2Load::One => "HTTP/2 over TLS, 1 conn. x 64 streams, cookie",
            H2Load::Sixteen => "HTTP/2 over TLS, 16 conn. x 64 streams, cookie",
        }
    }

    fn connections(self) -> usize {
        match self {
            H2Load::One => 1,
            H2Load::Sixteen => 16,
        }
    }
}

/// h2load's figures.
struct H2loadFigures {
    rate: f64,
    succeeded: f64,
    failed: f64,
    protocol: String,
}

/// h2load's text output: `finished in 5.00s, 12345.67 req/s, ...`, `requests: N total, N
/// started, N done, N succeeded, N failed, ...`, `Application protocol: h2`.
fn parse_h2load(text: &str) -> Result<H2loadFigures> {
    let line = |prefix: &str| text.lines().map(str::trim).find(|l| l.starts_with(prefix));
    let rate = line("finished in")
        .and_then(|l| l.split(", ").nth(1)?.strip_suffix(" req/s")?.parse().ok())
        .ok_or_else(|| anyhow!("h2load printed no rate: {}", procs::last_lines(text, 5)))?;
    let requests = line("requests:").context("h2load printed no request counts")?;
    let count = |what: &str| -> Result<f64> {
        requests
            .split(", ")
            .find_map(|part| part.trim_start_matches("requests: ").strip_suffix(what))
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| anyhow!("no {what:?} in {requests:?}"))
    };
    Ok(H2loadFigures {
        rate,
        succeeded: count(" succeeded")?,
        failed: count(" failed")?,
        protocol: line("Application protocol:")
            .map(|l| {
                l.trim_start_matches("Application protocol:")
                    .trim()
                    .to_string()
            })
            .unwrap_or_default(),
    })
}

impl Bench {
    /// One HTTP/2 row through a proxy: h2load for the round's seconds, the requests that
    /// reached the origin checked against the cookie.
    pub(crate) fn h2_row(
        &mut self,
        load: H2Load,
        target: crate::Target,
        port: u16,
        pinned: bool,
    ) -> Result<(Vec<(String, f64)>, CpuWork)> {
        let h2load = self.tools.h2load.as_ref().context("no h2load")?;
        let connections = load.connections();
        // h2load's threads: one per CPU of the development machine, never more than its
        // connections.
        let threads = connections.min(2);
        let mut p = Spec::new("h2load", h2load, &self.log_dir)
            .arg(format!("-c{connections}"))
            .arg(format!("-m{STREAMS}"))
            .arg(format!("-t{threads}"))
            .arg(format!("-D{}", self.opts.secs))
            .arg("-H")
            .arg(format!("cookie: {COOKIE_NAME}={}", COOKIES[0]))
            .arg(format!("https://127.0.0.1:{port}/"))
            .pinned(pinned)
            .spawn()?;
        let (out, _) = p.finish(Duration::from_secs(self.opts.secs + 30))?;
        let figures = parse_h2load(&out)?;
        if figures.protocol != "h2" {
            bail!(
                "{} spoke {:?}, not h2, to h2load",
                target.title(),
                figures.protocol
            );
        }
        let name = format!("{} through {}", load.name(), target.name());
        let total = figures.succeeded + figures.failed;
        self.failures(&name, figures.failed, total, "requests failed")?;
        let key = load.name();
        let values = vec![(key.to_string(), figures.rate)];
        let cpu = CpuWork::new(format!("cpu_{key}"), figures.succeeded, 1e6);
        Ok((values, cpu))
    }
}

/// `--loadgen h2-hold ADDR N SECS CA COOKIE`: N HTTP/2 clients over TLS (trusting CA), one
/// GET each with the cookie, then held idle with their connections open.
pub async fn hold(args: &[String]) -> Result<()> {
    let addr: SocketAddr = parse(args.get(1), "address")?;
    let n: usize = parse(args.get(2), "count")?;
    let secs: f64 = parse(args.get(3), "seconds")?;
    let ca = args.get(4).context("missing CA file")?;
    let cookie = args.get(5).context("missing cookie")?;
    let mut config = (*tls::client_config(Path::new(ca), TlsVersion::Tls13, false)?).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = TlsConnector::from(Arc::new(config));
    let cookie = format!("{COOKIE_NAME}={cookie}");
    hold_with(n, Duration::from_secs_f64(secs), move || {
        let (connector, cookie) = (connector.clone(), cookie.clone());
        async move {
            timeout(IO_TIMEOUT, one_request(addr, &connector, &cookie))
                .await
                .map_err(|_| anyhow!("no answer within {IO_TIMEOUT:?}"))?
        }
    })
    .await
}

/// An HTTP/2 connection that made one request: the handle that keeps it open, and its
/// connection's task.
type Held = (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
);

/// One TLS connection to `addr` with ALPN `h2`, one GET of `/` answered 200 and read whole.
async fn one_request(addr: SocketAddr, connector: &TlsConnector, cookie: &str) -> Result<Held> {
    let tcp = connect(addr).await?;
    let name = ServerName::try_from(tls::SERVER_NAME)?;
    let stream = connector.connect(name, tcp).await?;
    if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
        bail!("the proxy did not choose h2");
    }
    let (send, connection) = h2::client::handshake(stream).await?;
    let driver = tokio::spawn(connection);
    let mut send = send.ready().await?;
    let request = hyper::Request::get(format!("https://{}/", tls::SERVER_NAME))
        .header("cookie", cookie)
        .body(())?;
    let (answer, _) = send.send_request(request, true)?;
    let answer = answer.await?;
    if answer.status() != 200 {
        bail!("answered {}", answer.status());
    }
    let mut body = answer.into_body();
    while let Some(data) = body.data().await {
        let data = data?;
        let _ = body.flow_control().release_capacity(data.len());
    }
    Ok((send, driver))
}
