//! From a request to its answer, the same on every port: who asks is checked first
//! (`QUERY_ALLOW`, 403), then the connection's query place (503), then the query's limits
//! (414, 431); the path's command is looked up in the table of commands
//! ([`commands::COMMANDS`]), its methods checked (405), an unknown one answered with the list
//! of commands (404). An HTTP balancer hands a request here when [`intercepts`] says its path
//! is a query's; a TCP balancer's query connection hands every request here.

use std::net::SocketAddr;

use tracing::debug;

use super::access::{BUSY, refusal, unknown_refusal};
use super::asking::{Query, percent_decode};
use super::commands::{self, COMMANDS, READ};
use super::limits;
use super::operate::{Acting, Operators};
use super::reply::{closing, text};
use super::snapshot::HttpFigures;
use crate::balancer::shared::Shared;
use crate::balancer::{Admission, Balancer, Generation};
use crate::http::{LocalAnswer, LocalRequest};

/// What every query's path starts with, in any case.
const PREFIX: &str = "/TOTVS_BROKER_QUERY";

/// Whether a request for `target` (path and query) on an HTTP balancer's port is a query: its
/// path starts with `/TOTVS_BROKER_QUERY`, in any case, and `QUERY_ENABLED` is on. Asked of
/// every request: the path is compared first, so a request that is no query reads nothing
/// else.
pub fn intercepts(balancer: &Balancer, target: &[u8]) -> bool {
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    let is_query = path
        .get(..PREFIX.len())
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case(PREFIX.as_bytes()));
    is_query && balancer.generation().config.query.enabled
}

/// The answer to a query, on either kind of port. Its client is checked first, at every
/// request (a reload may have changed `QUERY_ALLOW`): an unknown one (a trusted proxy's chain
/// named no usable address) is refused whatever `QUERY_ALLOW` says, and a refused one's
/// connection closes unless a trusted proxy's connection carries it. Then `admission` counts
/// it (a query place while its connection is no client; none free, or its place given to
/// another query while it idled: 503, closed), the query's limits hold, and its command
/// answers. `http` reads an HTTP balancer's figures, for the pages that show them. A query
/// connection past its life closes after its answer.
pub async fn answer(
    shared: &Shared,
    balancer: &Balancer,
    operators: &Operators,
    request: LocalRequest,
    admission: &mut Admission,
    http: impl FnOnce() -> Option<HttpFigures>,
) -> LocalAnswer {
    let peer = match allowed(&balancer.generation(), &request) {
        Ok(peer) => peer,
        Err(refusal) => {
            debug!(client = %request.client, "query refused: {}", refusal.trim_end());
            let mut answer = text(403, refusal);
            answer.close = request.via.is_none();
            return answer;
        }
    };
    if admission.given_up() {
        // Its place went to another query while it idled: it closes as any kept-alive
        // connection may, and its client asks again on a new one.
        return LocalAnswer::none();
    }
    if !balancer.admit_query(admission) {
        return closing(503, BUSY);
    }
    if let Some(refusal) = limits::refusal(&request) {
        return refusal;
    }
    let asking = Asking {
        shared,
        balancer,
        operators,
        peer,
    };
    let mut answer = route(&asking, &request, http(), admission).await;
    answer.close |= limits::past_life(admission);
    answer
}

/// The client of `request`, when it may query the balancer of `generation`; else why not
/// (the 403's text).
fn allowed(generation: &Generation, request: &LocalRequest) -> Result<SocketAddr, String> {
    match request.client.known() {
        None => Err(unknown_refusal(generation)),
        Some(peer) => refusal(generation, peer).map_or(Ok(peer), Err),
    }
}

/// Who asks what of whom: the broker, the balancer, the page's operators, the client.
struct Asking<'a> {
    shared: &'a Shared,
    balancer: &'a Balancer,
    operators: &'a Operators,
    peer: SocketAddr,
}

/// Routes one request (from an allowed client) to its command's answer.
async fn route(
    asking: &Asking<'_>,
    request: &LocalRequest,
    http: Option<HttpFigures>,
    admission: &mut Admission,
) -> LocalAnswer {
    // `ServerStatus/%5B::1%5D:5000` is `ServerStatus/[::1]:5000`.
    let path = String::from_utf8_lossy(request.path());
    let rest = strip_prefix_ignore_case(&path, PREFIX).map(percent_decode);
    let (command, argument) = match rest.as_deref().map(|rest| rest.trim_start_matches('/')) {
        Some(rest) => {
            let (name, argument) = rest.split_once('/').unwrap_or((rest, ""));
            let command = COMMANDS.iter().find(|c| c.name.eq_ignore_ascii_case(name));
            (command, argument)
        }
        None => (None, ""),
    };
    let methods = command.map_or(READ, |c| c.methods);
    if !methods.iter().any(|m| m.as_bytes() == request.method()) {
        return not_allowed(methods);
    }
    let Some(command) = command else {
        return text(404, commands::list());
    };
    let host = request
        .value("host")
        .and_then(|h| std::str::from_utf8(h).ok())
        .map(host_name)
        .unwrap_or_else(|| "localhost".into());
    let query = Query {
        shared: asking.shared,
        balancer: asking.balancer,
        peer: asking.peer,
        request,
        http,
        host,
        argument,
    };
    let acting = Acting {
        operators: asking.operators,
        admission,
    };
    (command.answer)(&query, acting).await
}

/// 405: the methods that are answered, in words and in `Allow`.
fn not_allowed(methods: &[&str]) -> LocalAnswer {
    let message = format!("only {} are answered here\n", methods.join(" and "));
    text(405, message).with("Allow", methods.join(", "))
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
