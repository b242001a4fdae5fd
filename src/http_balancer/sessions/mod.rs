//! HTTP session affinity: the `TOTVS_BROKER_SH_001` cookie and the table of
//! live sessions. Pure logic: no sockets, no configuration; the HTTP balancer calls it.
//!
//! A cookie value is `<REMOTE_SERVER id>.<22 base64url characters>`: it names its server by
//! id, so two brokers with one configuration (and one `SESSION_SECRET`) agree on it and a
//! restart keeps every browser on its server; the 22 characters are a nonce and a MAC bound to
//! the balancer's section, so only values the broker issued for that balancer count.
//!
//! - [`ticket`]: the value, the keys that sign and verify it, the upgrade window.
//! - [`cookie_header`]: the `Cookie` header as bytes: the broker's value found among the
//!   others, and taken out of the request forwarded to the server.
//! - [`secret`]: which secret signs: `SESSION_SECRET`, or the broker's own; the previous one.
//! - [`table`]: the live sessions: expiry, the caps (in all and per client), WebSocket pins,
//!   counts per server.

pub mod cookie_header;
pub mod secret;
pub mod table;
pub mod ticket;

pub use cookie_header::{Affinity, mentions_broker_cookie, without_broker_cookie};
pub use secret::{Described, Kept, OwnSecret, SessionSecrets};
pub use table::{Limits, Sessions, Touched};
pub use ticket::{COOKIE, CookieKeys, Signed, Ticket};
