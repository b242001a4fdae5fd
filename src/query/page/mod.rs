//! The HTML pages: STATUS (the server table, a chart of the last hour, the facts), CFG and the
//! detail of one server. Plain HTML and CSS with inline SVG charts: no external assets, no
//! JavaScript, so the page works on an operator's locked-down machine, and on a phone: the
//! table comes first and fits a 390-pixel screen.
//!
//! The pages keep the contracts of the TOTVS page that public monitors parse
//! (tests/monitors.rs runs their parsers on them): the heading carries `TOTVS Broker para
//! SmartClient` (`TOTVS Broker para HTTP` on an HTTP balancer) whatever the language
//! (peder1981/monitor recognises the page by it, and reads each layout by it); the
//! version text is followed by `<br>`; the server table follows a `Servers (N)` heading, every
//! row opens with a plain `<tr>`, every data cell is a `<td>`, and the first three are plain
//! `<td>`s: a link to `/TOTVS_BROKER_QUERY/ServerStatus/host:port`, the connections, and the
//! quarantine cell (`-` or the local time the quarantine ends). On an HTTP balancer the
//! TOTVS HTTP broker's layout: server, sessions, connections, the quarantine's start (`-`
//! when none), its reasons. Columns of our own, and the state classes (`inQuarantine`,
//! `isDisabled`), come after those. Each layout is a list of columns ([`table::Layout`]) from which
//! the header, the cells and the stylesheet's rules for them (under a class on `<table>`, as
//! the cells carry no attributes) are all made.
//!
//! The pages, and what they share, each in its own file (the stylesheet is `page.css`):
//! - `status`: STATUS, its summary line and its facts.
//! - `cfg`: CFG, the effective configuration.
//! - `operate`: ADMIN's page of actions and its confirmations, for a signed-in user.
//! - `server`: one server's detail (ServerStatus) and, on an HTTP balancer, its sessions.
//! - `chart`: the SVG chart of the last hour's connections, wide and narrow.
//! - `table`: the server table, its two layouts of columns, its cells and their rules.
//! - `head`: what every page opens with: the `<head>` and its stylesheet, the header.
//! - `words`: how a page writes values: escaped text, bytes, spans of time, plurals.
//! - `fixtures`: snapshots for the pages' unit tests.

mod cfg;
mod chart;
#[cfg(test)]
mod fixtures;
mod head;
mod operate;
mod server;
mod status;
mod table;
mod words;

pub use cfg::config;
pub use operate::{Operating, PATH as ADMIN_PATH, confirm, operate, restart_refused};
pub use server::server;
pub use status::status;
