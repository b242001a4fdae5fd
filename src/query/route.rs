//! From a request to its answer: the path's command looked up in the table of commands
//! ([`commands::COMMANDS`]), its methods checked (405), an unknown one answered with the list
//! of commands (404). A TCP balancer's query connection (`serve`) hands each request here; an
//! HTTP balancer hands its requests to [`intercept`], which takes those whose path is a
//! query's.

use std::net::SocketAddr;

use bytes::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use tracing::debug;

use super::access::{BUSY, refusal, unknown_refusal};
use super::commands::{self, COMMANDS, Query, READ};
use super::reply::text;
use super::snapshot::HttpFigures;
use crate::balancer::Balancer;
use crate::balancer::shared::Shared;
use crate::http::ClientHead;

/// What every query's path starts with, in any case.
const PREFIX: &str = "/TOTVS_BROKER_QUERY";

/// The answer to a request on an HTTP balancer's port when it is a query (its path starts
/// with `/TOTVS_BROKER_QUERY`, in any case, and `QUERY_ENABLED` is on): routed by path, no
/// sniffing. `peer` is the client, `None` when it is unknown (a trusted proxy's chain named
/// no usable address): refused, whatever `QUERY_ALLOW` says. `admit` counts it (a query place
/// while its connection is no client; false: none is free, answered 503 as on a TCP port),
/// once it is known to be a query from an allowed client. `None` for a request to forward.
/// `http` reads the balancer's HTTP figures, for the pages that show them. The engine's head
/// is looked at in place; only a query's is made hyper's, for the commands.
pub fn intercept(
    shared: &Shared,
    balancer: &Balancer,
    peer: Option<SocketAddr>,
    request: &ClientHead<'_>,
    admit: impl FnOnce() -> bool,
    http: impl FnOnce() -> HttpFigures,
) -> Option<Response<Bytes>> {
    let generation = balancer.generation();
    if !generation.config.query.enabled {
        return None;
    }
    let target = request.path_and_query();
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    let prefix = path.get(..PREFIX.len())?;
    if !prefix.eq_ignore_ascii_case(PREFIX.as_bytes()) {
        return None;
    }
    let head = parts_of(request)?;
    let Some(peer) = peer else {
        let refusal = unknown_refusal(&generation);
        debug!(client = "unknown", "query refused: {}", refusal.trim_end());
        return Some(text(StatusCode::FORBIDDEN, refusal));
    };
    if let Some(refusal) = refusal(&generation, peer) {
        debug!(client = %peer, "query refused: {}", refusal.trim_end());
        return Some(text(StatusCode::FORBIDDEN, refusal));
    }
    if !admit() {
        // A query connection whose place went to another closes, as on a TCP port.
        let mut busy = text(StatusCode::SERVICE_UNAVAILABLE, BUSY.to_string());
        let close = HeaderValue::from_static("close");
        busy.headers_mut().insert(header::CONNECTION, close);
        return Some(busy);
    }
    Some(answer(shared, balancer, peer, &head, Some(http())))
}

/// A query's head as hyper's types (what the commands read): its method, its path and query,
/// its header lines. `None` when they are not hyper's to take (then it is no query).
fn parts_of(request: &ClientHead<'_>) -> Option<Parts> {
    let mut builder = hyper::Request::builder()
        .method(Method::from_bytes(request.method_bytes()).ok()?)
        .uri(hyper::Uri::try_from(request.path_and_query()).ok()?);
    for (_, field) in request.fields() {
        builder = builder.header(field.name, field.value);
    }
    Some(builder.body(()).ok()?.into_parts().0)
}

/// Routes one request (from an allowed client) to its command's answer; `http`: the figures
/// of an HTTP balancer.
pub(super) fn answer(
    shared: &Shared,
    balancer: &Balancer,
    peer: SocketAddr,
    request: &Parts,
    http: Option<HttpFigures>,
) -> Response<Bytes> {
    // `ServerStatus/%5B::1%5D:5000` is `ServerStatus/[::1]:5000`.
    let rest = strip_prefix_ignore_case(request.uri.path(), PREFIX).map(percent_decode);
    let (command, argument) = match rest.as_deref().map(|rest| rest.trim_start_matches('/')) {
        Some(rest) => {
            let (name, argument) = rest.split_once('/').unwrap_or((rest, ""));
            let command = COMMANDS.iter().find(|c| c.name.eq_ignore_ascii_case(name));
            (command, argument)
        }
        None => (None, ""),
    };
    let methods = command.map_or(READ, |c| c.methods);
    if !methods.contains(&request.method) {
        return not_allowed(methods);
    }
    let Some(command) = command else {
        return text(StatusCode::NOT_FOUND, commands::list());
    };
    let host = request
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(host_name)
        .unwrap_or_else(|| "localhost".into());
    let query = Query {
        shared,
        balancer,
        peer,
        request,
        http,
        host,
        argument,
    };
    (command.answer)(&query)
}

/// 405: the methods that are answered, in words and in `Allow`.
fn not_allowed(methods: &[Method]) -> Response<Bytes> {
    let names: Vec<&str> = methods.iter().map(Method::as_str).collect();
    let message = format!("only {} are answered here\n", names.join(" and "));
    let mut response = text(StatusCode::METHOD_NOT_ALLOWED, message);
    if let Ok(allow) = HeaderValue::from_str(&names.join(", ")) {
        response.headers_mut().insert(header::ALLOW, allow);
    }
    response
}

/// `%XX` escapes of a path decoded; a malformed escape is kept as it is (and then names
/// nothing), and bytes that are not UTF-8 are replaced.
fn percent_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(hi), Some(lo)) if hex(hi).is_some() && hex(lo).is_some() => {
                out.push((hex(hi).unwrap_or(0) * 16 + hex(lo).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// The host part of a `Host` header (`broker:5000` -> `broker`, `[::1]:5000` -> `::1`).
fn host_name(value: &str) -> String {
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("localhost").to_string();
    }
    value.split(':').next().unwrap_or("localhost").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        assert_eq!(host_name("broker:5000"), "broker");
        assert_eq!(host_name("[::1]:5000"), "::1");
        assert_eq!(host_name("10.0.0.1"), "10.0.0.1");
    }

    #[test]
    fn prefix_ignores_case() {
        assert_eq!(
            strip_prefix_ignore_case("/totvs_broker_query/ping", "/TOTVS_BROKER_QUERY"),
            Some("/ping")
        );
        assert_eq!(
            strip_prefix_ignore_case("/other", "/TOTVS_BROKER_QUERY"),
            None
        );
    }
}
