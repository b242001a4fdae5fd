//! `TOTVS_BROKER_QUERY` on each balancer's own port: STATUS, CFG, PING, READY, JSON, METRICS
//! and ServerStatus, for browsers and monitoring scripts; and ADMIN, the actions on servers
//! for a signed-in user (off by default).
//!
//! Every query is served by the HTTP engine, on both kinds of port, and answered here from the
//! balancer's own request type ([`LocalRequest`](crate::http::LocalRequest)), which no front ties
//! to HTTP/1.1 or to a library's types: on an HTTP balancer each request whose path is a query's is
//! routed here ([`intercepts`]) on a connection that may be the balancer's client; on a TCP
//! balancer a connection whose first bytes were a query (the TCP client's sniff,
//! [`crate::tcp::sniff`]) is handed to an engine whose upstreams answer every request ([`port`]).
//! Either way a query holds one of the balancer's few query places (`QUERY_MAX_CONNECTIONS`) while
//! its connection is no client, is held to the same limits ([`limits`]), goes from the route to its
//! command, and the command renders a snapshot.
//!
//! - `route`: who may query (403), the query place (503), the limits (414, 431), then from a
//!   request to its command (405, 404).
//! - [`port`]: a TCP balancer's query connections as the engine's upstreams.
//! - [`limits`]: a query's line, head, wait and life, the same on every port.
//! - `asking`: one query as a command answers it: the request, who asks, the balancer's
//!   state read for it, the page's language.
//! - `commands`: the table of commands: each one's name, methods, line in the list, answer.
//! - [`operate`]: ADMIN: acting on servers from the browser, signed in (off by default).
//! - `access`: who may query (`QUERY_ENABLED`, `QUERY_ALLOW`), and the configuration they see.
//! - `reply`: an answer's body, content type and the lines every answer carries.
//! - [`snapshot`]: one consistent read of a balancer's state, which every answer is rendered
//!   from.
//! - `page`: the HTML pages (STATUS, CFG, one server's detail), pure.
//! - `json`: the JSON answer, a superset of the TOTVS broker's schema, pure.
//! - `metrics`: METRICS, the Prometheus text format, pure.
//! - `labels`: the pages' words in English and Brazilian Portuguese.
//! - `language`: which of the two a page is in, for each request (`?lang=`, `LANGUAGE`, the
//!   browser's `Accept-Language`).

mod access;
mod asking;
mod commands;
mod json;
mod labels;
mod language;
pub mod limits;
mod metrics;
pub mod operate;
mod page;
pub mod port;
mod reply;
mod route;
pub mod snapshot;

pub use operate::Operators;
pub use port::{QueryEngine, QueryPort};
pub use route::{answer, intercepts};
