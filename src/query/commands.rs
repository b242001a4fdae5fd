//! The table of commands: each command an entry ([`QueryCommand`]): its name in the path, the
//! methods it answers, its line in the list of commands (the 404's text), and its answer.
//! Adding a command is adding an entry; README's list of queries is held to the names here
//! (tests/readme.rs).

use std::fmt::Write;
use std::future::{Future, ready};
use std::pin::Pin;

use super::access::visible_config;
use super::asking::Query;
use super::operate::{self, Acting};
use super::reply::{body, html, text};
use super::snapshot::{Snapshot, Standing};
use super::{json, labels, metrics, page};
use crate::balancer::Balancer;
use crate::balancer::shared::Shared;
use crate::http::{LocalAnswer, LocalRequest};

/// A command's answer on its way. Most are ready at once (rendered from a snapshot); one
/// that awaits (a body, a check run off the worker threads) is a future all the same, boxed
/// since the commands are entries of one table.
pub(super) type Answering<'q> = Pin<Box<dyn Future<Output = LocalAnswer> + Send + 'q>>;

/// An answer ready at once.
fn now(answer: LocalAnswer) -> Answering<'static> {
    Box::pin(ready(answer))
}

/// A command of the query interface: an entry of [`COMMANDS`].
pub(super) struct QueryCommand {
    /// Its name after `/TOTVS_BROKER_QUERY/`, matched in any case; `""` for the bare path.
    pub(super) name: &'static str,
    /// How the list of commands shows it (with its argument), and what it says of it.
    usage: &'static str,
    help: &'static str,
    /// The methods it answers; any other is answered 405, with these in `Allow`.
    pub(super) methods: &'static [&'static str],
    /// Its answer (ADMIN's acts through the process's operators, and gives the connection's
    /// admission back while a throttled sign-in waits).
    pub(super) answer: for<'q> fn(&'q Query<'q>, Acting<'q>) -> Answering<'q>,
}

/// GET and HEAD: every command reads, none changes anything, but ADMIN's actions.
pub(super) const READ: &[&str] = &["GET", "HEAD"];

/// Every command, in the order the list of commands shows them.
pub(super) const COMMANDS: &[QueryCommand] = &[
    QueryCommand {
        name: "STATUS",
        usage: "STATUS",
        help: "the status page (HTML; ?refresh=N reloads every N seconds)",
        methods: READ,
        answer: |q, _| {
            now(html(page::status(
                &q.snapshot(),
                &q.host,
                refresh(q.request),
            )))
        },
    },
    QueryCommand {
        name: "CFG",
        usage: "CFG",
        help: "the effective configuration (HTML)",
        methods: READ,
        answer: |q, _| {
            now(html(page::config(
                &q.snapshot(),
                &visible_config(q.shared, q.peer),
                &q.host,
            )))
        },
    },
    QueryCommand {
        name: "PING",
        usage: "PING",
        help: "200 while accepting clients, 503 while shutting down",
        methods: READ,
        answer: |q, _| now(ping(q)),
    },
    QueryCommand {
        name: "READY",
        usage: "READY",
        help: "200 while a client would be served, 503 (and why) otherwise",
        methods: READ,
        answer: |q, _| now(readiness_answer(q)),
    },
    QueryCommand {
        name: "JSON",
        usage: "JSON",
        help: "the status for scripts",
        methods: READ,
        answer: |q, _| now(json_status(&q.snapshot())),
    },
    QueryCommand {
        name: "METRICS",
        usage: "METRICS",
        help: "Prometheus metrics",
        methods: READ,
        answer: |q, _| {
            let content_type = "text/plain; version=0.0.4; charset=utf-8";
            now(body(200, content_type, metrics::render(&q.snapshot())))
        },
    },
    QueryCommand {
        name: "SERVERSTATUS",
        usage: "SERVERSTATUS/<host>:<port>",
        help: "one server and its quarantine history (HTML)",
        methods: READ,
        answer: |q, _| now(server_status(q)),
    },
    QueryCommand {
        name: "ADMIN",
        usage: "ADMIN",
        help: "act on servers, signed in (ADMIN_USERS; off by default)",
        methods: &["GET", "HEAD", "POST"],
        answer: |q, acting| Box::pin(operate::answer(q, acting)),
    },
    QueryCommand {
        name: "",
        usage: "/TOTVS_BROKER_QUERY",
        help: "alone answers HTML to browsers and JSON to everyone else.",
        methods: READ,
        answer: |q, _| {
            let mut answer = if wants_html(q.request) {
                html(page::status(&q.snapshot(), &q.host, None))
            } else {
                json_status(&q.snapshot())
            };
            // Which of the two, and in which language, is the request's `Accept` and
            // `Accept-Language`'s to say: a cache keeps one answer per pair.
            answer
                .fields
                .retain(|(name, _)| !name.eq_ignore_ascii_case("vary"));
            now(answer.with("Vary", "Accept, Accept-Language"))
        },
    },
];

/// The list of commands, for the 404 answer: each with its usage and help, the bare path last.
pub(super) fn list() -> String {
    let mut list = String::from("Commands (after /TOTVS_BROKER_QUERY/, any case):\n");
    let (named, bare): (Vec<_>, Vec<_>) = COMMANDS.iter().partition(|c| !c.name.is_empty());
    for command in named {
        let _ = writeln!(list, "  {:<28}{}", command.usage, command.help);
    }
    for command in bare {
        let _ = writeln!(list, "{} {}", command.usage, command.help);
    }
    list
}

/// JSON: the status for scripts.
fn json_status(snapshot: &Snapshot) -> LocalAnswer {
    body(200, "application/json", json::render(snapshot))
}

/// PING: 200 while the broker accepts clients, 503 once it is shutting down.
fn ping(q: &Query<'_>) -> LocalAnswer {
    if q.shared.shutdown.is_draining() {
        return text(
            503,
            "DRAINING: appbroker is shutting down and will stop accepting clients\n",
        );
    }
    text(200, "OK: appbroker is accepting clients\n")
}

/// READY: 200 while a client arriving now would be served, else 503; the text says why.
fn readiness_answer(q: &Query<'_>) -> LocalAnswer {
    let (ready, why) = readiness(q.shared, q.balancer);
    text(if ready { 200 } else { 503 }, why)
}

/// `SERVERSTATUS/<host>:<port>`: one server's page, or 404 naming the balancer's servers.
fn server_status(q: &Query<'_>) -> LocalAnswer {
    let snap = q.snapshot();
    if let Some(server) = snap.server(q.argument.trim_end_matches('/')) {
        return html(page::server(&snap, server, &q.host));
    }
    let known: Vec<&str> = snap
        .state
        .servers
        .iter()
        .map(|s| s.address.as_str())
        .collect();
    let message = format!(
        "no server {} in [{}]; its servers are {}\n",
        q.argument,
        snap.state.kind.section(),
        known.join(", ")
    );
    text(404, message)
}

/// READY: whether a client arriving now would be served (the balancer accepts clients and a
/// server is available to it), and the answer's text saying why, in the pages' language.
fn readiness(shared: &Shared, balancer: &Balancer) -> (bool, String) {
    let l = labels::of(shared.config.load().general.language);
    let generation = balancer.generation();
    if shared.shutdown.is_draining() {
        return (false, format!("NOT READY: {}\n", l.ready_shutting_down));
    }
    let max = generation.config.max_connections;
    if balancer.at_limit(&generation) {
        return (
            false,
            format!("NOT READY: MAX_CONNECTIONS ({max}) {}\n", l.ready_full),
        );
    }
    let servers = balancer.state().servers;
    let total = servers.len();
    let count = |standing| servers.iter().filter(|s| s.state == standing).count();
    let (quarantined, drained) = (count(Standing::Quarantined), count(Standing::Draining));
    let disabled = count(Standing::Disabled);
    let available = total - quarantined - drained - disabled;
    if available == 0 {
        let mut why = Vec::new();
        if quarantined > 0 {
            why.push(format!("{quarantined} {}", l.quarantined));
        }
        if drained > 0 {
            why.push(format!("{drained} {}", l.draining_server));
        }
        if disabled > 0 {
            why.push(format!("{disabled} {}", l.disabled_server));
        }
        return (
            false,
            format!("NOT READY: {} ({})\n", l.ready_no_server, why.join(", ")),
        );
    }
    let (one, many) = l.servers_available;
    let servers = if total == 1 { one } else { many };
    (
        true,
        format!(
            "READY: {available} {} {total} {servers}, {}\n",
            l.of, l.ready_accepting
        ),
    )
}

/// A browser asks for HTML; scripts and monitors (no Accept, `*/*`, JSON) get JSON.
fn wants_html(request: &LocalRequest) -> bool {
    request
        .values("accept")
        .filter_map(|v| std::str::from_utf8(v).ok())
        .any(|v| v.to_ascii_lowercase().contains("text/html"))
}

/// `?refresh=N`, 1 to 3600 seconds.
fn refresh(request: &LocalRequest) -> Option<u32> {
    let query = std::str::from_utf8(request.query()?).ok()?;
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        let seconds = value.parse::<u32>().ok()?;
        (key.eq_ignore_ascii_case("refresh") && (1..=3600).contains(&seconds)).then_some(seconds)
    })
}
