//! The HTTP rows: the origin (two small, fast HTTP/1.1 servers in one process, each answering
//! a fixed small body with keep-alive and counting what reached it), `wrk` through each
//! target, the idle keep-alive clients of the memory row, and the checks that make the
//! anchors' rows comparable with appbroker's: the cookie routes to its server and is taken
//! out of the request, a request without one gets a `Set-Cookie`, `X-Forwarded-For` arrives.

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, COOKIE};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

use crate::loadgen::{IO_TIMEOUT, connect, hold_with, parse, serve_loop};
use crate::procs::{self, Spec};
use crate::{Bench, CpuWork};

/// The HTTP broker's affinity cookie.
pub const COOKIE_NAME: &str = "TOTVS_BROKER_SH_001";
/// Valid cookies for servers 01 and 02, `<REMOTE_SERVER id>.<22 base64url characters>`
/// (the broker's format), signed with benches/appbroker-http.ini's `SESSION_SECRET` for its
/// balancer `[BALANCE_HTTP]` (the nonce `BenchFix`; the tag is the first 8 bytes of `printf
/// 'appbroker TOTVS_BROKER_SH_001 v2\0BALANCE_HTTP\0%s' 01BenchFix | openssl dgst -sha256
/// -hmac "$SECRET" -binary`, base64url after the nonce: `http_balancer::sessions::ticket`).
/// A value signed otherwise is no cookie to the broker, which would answer every request with
/// a new one: the HTTP rows' affinity check refuses to measure then. HAProxy's servers carry
/// these same values as their `cookie`, so one `Cookie` header routes alike through all three
/// proxies.
pub const COOKIES: [&str; 2] = ["01.QmVuY2hGaXjtvSAg5VUO5w", "02.QmVuY2hGaXg5x9TenX-kLQ"];
/// The origin's own page of counts, read straight from the origin (never through a proxy).
const COUNTS_PATH: &str = "/_origin/counts";
/// The origin's answer: 65 bytes of text.
const BODY: &[u8] = b"appbroker benchmark origin: a small fixed body for every request\n";
/// Keep-alive connections of the keep-alive rows and concurrent connections of the close row.
pub const CONNECTIONS: usize = 64;
/// wrk's threads: one per CPU of the development machine.
const WRK_THREADS: usize = 2;

/// How wrk loads a target.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum HttpLoad {
    /// 64 keep-alive connections, the fixed cookie: routing.
    KeepAlive,
    /// A new connection per request (`Connection: close`), the fixed cookie.
    Close,
    /// 64 keep-alive connections, no cookie: a new session (and a `Set-Cookie`) per request.
    NewSession,
}

impl HttpLoad {
    pub fn name(self) -> &'static str {
        match self {
            HttpLoad::KeepAlive => "http_ka",
            HttpLoad::Close => "http_close",
            HttpLoad::NewSession => "http_session",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            HttpLoad::KeepAlive => "HTTP keep-alive, 64 conn., cookie",
            HttpLoad::Close => "HTTP conn. per request, cookie",
            HttpLoad::NewSession => "HTTP keep-alive, 64 conn., new session",
        }
    }

    fn cookie(self) -> Option<&'static str> {
        match self {
            HttpLoad::KeepAlive | HttpLoad::Close => Some(COOKIES[0]),
            HttpLoad::NewSession => None,
        }
    }
}

/// What reached one origin server.
#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    /// Requests that still carried the affinity cookie.
    cookie: AtomicU64,
    /// Requests with an `X-Forwarded-For`.
    forwarded: AtomicU64,
}

/// `--serve-http PORT_A PORT_B`: REMOTE_SERVER_01 and _02 of the HTTP rows.
pub async fn serve_origin(ports: [u16; 2]) -> Result<()> {
    let counts: Arc<[Counts; 2]> = Arc::default();
    let mut servers = tokio::task::JoinSet::new();
    for (i, port) in ports.into_iter().enumerate() {
        let counts = counts.clone();
        servers.spawn(serve_loop(port, move |tcp| {
            let counts = counts.clone();
            async move {
                let service = service_fn(move |request| {
                    let answer = answer(&request, &counts, i);
                    async move { Ok::<_, Infallible>(answer) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            }
        }));
    }
    match servers.join_next().await {
        Some(result) => result?,
        None => Ok(()),
    }
}

fn answer(request: &Request<Incoming>, counts: &[Counts; 2], i: usize) -> Response<Full<Bytes>> {
    let text = |body: Bytes, kind: &'static str| {
        let mut response = Response::new(Full::new(body));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
        response
    };
    if request.uri().path() == COUNTS_PATH {
        let server = |c: &Counts| {
            serde_json::json!({
                "requests": c.requests.load(Relaxed),
                "cookie": c.cookie.load(Relaxed),
                "forwarded": c.forwarded.load(Relaxed),
            })
        };
        let json = serde_json::json!([server(&counts[0]), server(&counts[1])]);
        return text(Bytes::from(json.to_string()), "application/json");
    }
    let c = &counts[i];
    c.requests.fetch_add(1, Relaxed);
    let has_cookie = request.headers().get_all(COOKIE).iter().any(|v| {
        v.as_bytes()
            .windows(COOKIE_NAME.len())
            .any(|w| w == COOKIE_NAME.as_bytes())
    });
    if has_cookie {
        c.cookie.fetch_add(1, Relaxed);
    }
    if request.headers().contains_key("x-forwarded-for") {
        c.forwarded.fetch_add(1, Relaxed);
    }
    text(Bytes::from_static(BODY), "text/plain")
}

/// `--loadgen http-hold ADDR N SECS [COOKIE]`: N keep-alive clients, one GET each (with the
/// cookie when given), then held idle.
pub async fn hold(args: &[String]) -> Result<()> {
    let addr: SocketAddr = parse(args.get(1), "address")?;
    let n: usize = parse(args.get(2), "count")?;
    let secs: f64 = parse(args.get(3), "seconds")?;
    let request: Arc<[u8]> = request_bytes(args.get(4).map(String::as_str), false).into();
    hold_with(n, Duration::from_secs_f64(secs), move || {
        let request = request.clone();
        async move {
            let mut s = connect(addr).await?;
            timeout(IO_TIMEOUT, async {
                s.write_all(&request).await?;
                read_answer(&mut s).await
            })
            .await
            .map_err(|_| anyhow!("no answer within {IO_TIMEOUT:?}"))??;
            Ok(s)
        }
    })
    .await
}

/// A GET of `/` as the rows send it.
fn request_bytes(cookie: Option<&str>, close: bool) -> Vec<u8> {
    let mut r = String::from("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    if let Some(c) = cookie {
        r.push_str(&format!("Cookie: {COOKIE_NAME}={c}\r\n"));
    }
    if close {
        r.push_str("Connection: close\r\n");
    }
    r.push_str("\r\n");
    r.into_bytes()
}

/// Reads one answer with a `Content-Length` (what every target sends for the origin's page)
/// and checks it is a 200.
async fn read_answer(s: &mut tokio::net::TcpStream) -> Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let end = loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!("closed before the end of the answer's head");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 16 << 10 {
            bail!("an answer head over 16 KiB");
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    let (status, length) = status_and_length(&head)?;
    if status != 200 {
        bail!("answered {status}");
    }
    let mut left = length.saturating_sub(buf.len() - end);
    while left > 0 {
        let n = s.read(&mut chunk[..left.min(1024)]).await?;
        if n == 0 {
            bail!("closed {left} bytes before the end of the body");
        }
        left -= n;
    }
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn status_and_length(head: &str) -> Result<(u16, usize)> {
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("no status line in {head:?}"))?;
    let length = header(head, "content-length")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("no Content-Length in {head:?}"))?;
    Ok((status, length))
}

/// The values of a header, by case-insensitive name, in an answer's head.
fn headers<'a>(head: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    head.lines().skip(1).filter_map(move |l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

fn header<'a>(head: &'a str, name: &'a str) -> Option<&'a str> {
    headers(head, name).next()
}

/// One request from the runner (blocking, `Connection: close`): the status, head and body.
fn get(port: u16, path: &str, cookie: Option<&str>) -> Result<(u16, String, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let request = String::from_utf8(request_bytes(cookie, true))?.replacen(
        "GET / ",
        &format!("GET {path} "),
        1,
    );
    s.write_all(request.as_bytes())?;
    let mut all = Vec::new();
    s.read_to_end(&mut all)?;
    let end = find(&all, b"\r\n\r\n").ok_or_else(|| anyhow!("no answer head"))? + 4;
    let head = String::from_utf8_lossy(&all[..end]).into_owned();
    let (status, _) = status_and_length(&head)?;
    Ok((status, head, all[end..].to_vec()))
}

/// What reached the two origin servers so far: (requests, with the cookie, with
/// X-Forwarded-For) each.
fn origin_counts(port: u16) -> Result<[[u64; 3]; 2]> {
    let (status, _, body) = get(port, COUNTS_PATH, None)?;
    if status != 200 {
        bail!("the origin answered {status} for its counts");
    }
    let json: serde_json::Value = serde_json::from_slice(&body)?;
    let server = |i: usize| -> Result<[u64; 3]> {
        let f = |k: &str| {
            json[i][k]
                .as_u64()
                .ok_or_else(|| anyhow!("no {k} in {json}"))
        };
        Ok([f("requests")?, f("cookie")?, f("forwarded")?])
    };
    Ok([server(0)?, server(1)?])
}

/// wrk's figures.
pub struct Wrk {
    pub rate: f64,
    pub requests: f64,
    pub p50: f64,
    pub p99: f64,
    /// Socket errors (connect, read, write, timeout) and answers other than 2xx/3xx.
    pub errors: String,
    pub bad_answers: f64,
}

/// wrk's text output: `N requests in 5.00s`, `Requests/sec:`, the `--latency` percentiles,
/// `Socket errors:` and `Non-2xx or 3xx responses:`.
fn parse_wrk(text: &str) -> Result<Wrk> {
    let field = |prefix: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix).map(str::trim))
    };
    let duration_us = |v: &str| -> Option<f64> {
        let split = v.find(|c: char| c.is_ascii_alphabetic())?;
        let (n, unit) = v.split_at(split);
        let n: f64 = n.parse().ok()?;
        Some(match unit {
            "us" => n,
            "ms" => n * 1e3,
            "s" => n * 1e6,
            "m" => n * 60e6,
            _ => return None,
        })
    };
    let rate = field("Requests/sec:")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            anyhow!(
                "wrk printed no Requests/sec: {}",
                procs::last_lines(text, 3)
            )
        })?;
    let requests = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in ")?.0.parse().ok())
        .ok_or_else(|| anyhow!("wrk printed no request count"))?;
    let p50 = field("50%")
        .and_then(duration_us)
        .context("wrk printed no p50")?;
    let p99 = field("99%")
        .and_then(duration_us)
        .context("wrk printed no p99")?;
    Ok(Wrk {
        rate,
        requests,
        p50,
        p99,
        errors: field("Socket errors:").unwrap_or("").to_string(),
        bad_answers: field("Non-2xx or 3xx responses:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
    })
}

impl Bench {
    /// One HTTP row through a target (`proxy` is None for the direct path): the checks
    /// (module docs), then wrk, then what reached the origin, then the checks again.
    pub(crate) fn http_row(
        &mut self,
        load: HttpLoad,
        target: crate::Target,
        port: u16,
        pinned: bool,
    ) -> Result<(Vec<(String, f64)>, CpuWork)> {
        let origin = self.ports.http[0];
        let proxied = target != crate::Target::Direct;
        if proxied {
            self.check_affinity(target, port)?;
        }
        let before = origin_counts(origin)?;
        let wrk = self.tools.wrk.as_ref().context("no wrk")?;
        let mut spec = Spec::new("wrk", wrk, &self.log_dir)
            .arg(format!("-t{WRK_THREADS}"))
            .arg(format!("-c{CONNECTIONS}"))
            .arg(format!("-d{}s", self.opts.secs))
            .args(["--timeout", "5s", "--latency"]);
        if let Some(c) = load.cookie() {
            spec = spec.arg("-H").arg(format!("Cookie: {COOKIE_NAME}={c}"));
        }
        if load == HttpLoad::Close {
            spec = spec.args(["-H", "Connection: close"]);
        }
        let mut p = spec
            .arg(format!("http://127.0.0.1:{port}/"))
            .pinned(pinned)
            .spawn()?;
        let (out, _) = p.finish(Duration::from_secs(self.opts.secs + 30))?;
        let w = parse_wrk(&out)?;
        let after = origin_counts(origin)?;
        let delta = |s: usize, k: usize| after[s][k] - before[s][k];
        let name = format!("{} through {}", load.name(), target.name());
        let bad = "answers were not 2xx or 3xx";
        self.failures(&name, w.bad_answers, w.requests, bad)?;
        if !w.errors.is_empty() {
            self.note(format!("{name}: wrk's socket errors: {}", w.errors));
        }
        if proxied {
            let reached = delta(0, 0) + delta(1, 0);
            if load.cookie().is_some() && delta(1, 0) > 0 {
                self.note(format!(
                    "{name}: {} of {reached} requests reached server 02 though the cookie names 01 \
                     (affinity not honoured)",
                    delta(1, 0)
                ));
            }
            if load.cookie().is_none() && (delta(0, 0) == 0 || delta(1, 0) == 0) {
                self.note(format!(
                    "{name}: every new session went to one server ({} and {} requests)",
                    delta(0, 0),
                    delta(1, 0)
                ));
            }
            let cookies = delta(0, 1) + delta(1, 1);
            if cookies > 0 {
                self.note(format!(
                    "{name}: the affinity cookie reached the origin in {cookies} of {reached} \
                     requests (not taken out)"
                ));
            }
            let forwarded = delta(0, 2) + delta(1, 2);
            if forwarded < reached {
                self.note(format!(
                    "{name}: {} of {reached} requests reached the origin without X-Forwarded-For",
                    reached - forwarded
                ));
            }
        }
        let key = load.name();
        let values = vec![
            (key.to_string(), w.rate),
            (format!("{key}_p50"), w.p50),
            (format!("{key}_p99"), w.p99),
        ];
        Ok((values, CpuWork::new(format!("cpu_{key}"), w.requests, 1e6)))
    }

    /// Before a proxy's row: a request without the cookie is answered with a
    /// `Set-Cookie: TOTVS_BROKER_SH_001=01.` or `02.`, one with server 01's cookie without one.
    fn check_affinity(&self, target: crate::Target, port: u16) -> Result<()> {
        let who = target.title();
        let (status, head, _) = get(port, "/", None)?;
        if status != 200 {
            bail!("{who} answered {status} to a GET of / (the origin answers 200)");
        }
        let set = headers(&head, "set-cookie")
            .find(|v| v.starts_with(&format!("{COOKIE_NAME}=")))
            .ok_or_else(|| {
                anyhow!("{who} set no {COOKIE_NAME} cookie on an answer to a request without one")
            })?;
        let value = &set[COOKIE_NAME.len() + 1..];
        if !(value.starts_with("01.") || value.starts_with("02.")) {
            bail!("{who} set {set:?}: the value does not start with a server id (01. or 02.)");
        }
        let (status, head, _) = get(port, "/", Some(COOKIES[0]))?;
        if status != 200 {
            bail!("{who} answered {status} to a GET of / with server 01's cookie");
        }
        if headers(&head, "set-cookie").any(|v| v.starts_with(&format!("{COOKIE_NAME}="))) {
            bail!("{who} set the cookie again on an answer to a request with a valid one");
        }
        Ok(())
    }
}
