//! HTTP/2 towards clients (TLS with ALPN `h2`), over the `h2` crate: each stream is one
//! HTTP/1.1 exchange of the engine's, so every rule of the engine applies to it by
//! construction (the balancer's choice, affinity by the cookie, the rewrite, limits, timeouts
//! per phase, retries, the access line, figures, query routing, the pool of HTTP/1.1 server
//! connections), as Pingora, nginx and HAProxy forward HTTP/2 to HTTP/1.1 servers.
//!
//! - `connection`: one connection: the crate's server with the broker's settings, its
//!   streams served in its task, its bounds (streams in hand, rapid reset, idle), the drain
//!   (`GOAWAY`) and the cut.
//! - `stream`: one stream as the engine's client connection: the request read as HTTP/1.1
//!   bytes, the answer written as HEADERS and DATA, flow control as the backpressure.
//! - `request`: an HTTP/2 request as the HTTP/1.1 head the engine reads (RFC 9113 §8.3).
//! - `response`: the engine's answer head as an HTTP/2 response; a WebSocket's accept.
//! - `resets`: the streams a client resets, counted over ten seconds, and what its streams tell
//!   the connection of them.

mod connection;
mod request;
mod resets;
mod response;
mod stream;

pub use connection::{refuse, serve};
