//! `TOTVS_BROKER_QUERY` on each balancer's own port: STATUS, CFG, PING, READY, JSON, METRICS
//! and ServerStatus, served with hyper (HTTP/1.1, keep-alive) to browsers and monitoring
//! scripts.
//!
//! On a TCP balancer a connection reaches here when its first bytes were a query (the TCP
//! client's sniff, [`crate::tcp::sniff`]); there queries have their own small limit
//! (`QUERY_MAX_CONNECTIONS`) and timeouts, so slow or never-finished requests cannot use up
//! the broker's descriptors or slow the proxying ([`serve()`]). On an HTTP balancer each
//! request is routed here by its path ([`intercept`]), on a connection that is the balancer's
//! client, with the HTTP engine's limits. Either way a request goes from the route to its
//! command, and the command renders a snapshot.
//!
//! - `serve`: the query connection on a TCP balancer's port: read the first request within
//!   bounds, hold a query place, answer each request with hyper.
//! - `route`: from a request to its command (405, 404), and [`intercept`] for an HTTP
//!   balancer.
//! - `commands`: the table of commands: each one's name, methods, line in the list, answer.
//! - `access`: who may query (`QUERY_ENABLED`, `QUERY_ALLOW`), and the configuration they see.
//! - `reply`: an answer's body, content type and the headers every answer carries.
//! - [`snapshot`]: one consistent read of a balancer's state, which every answer is rendered
//!   from.
//! - `page`: the HTML pages (STATUS, CFG, one server's detail), pure.
//! - `json`: the JSON answer, a superset of the TOTVS broker's schema, pure.
//! - `metrics`: METRICS, the Prometheus text format, pure.
//! - `labels`: the pages' words in English and Brazilian Portuguese.
//! - `language`: which of the two a page is in, for each request (`?lang=`, `LANGUAGE`, the
//!   browser's `Accept-Language`).

mod access;
mod commands;
mod json;
mod labels;
mod language;
mod metrics;
mod page;
mod reply;
mod route;
mod serve;
pub mod snapshot;

pub use route::intercept;
pub use serve::{Connection, serve};
