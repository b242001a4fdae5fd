//! A TCP balancer's connections: each accepted connection, its port's TLS step done (at the
//! listener layer: `net::handshake`), as one struct whose methods are its way through the
//! broker, and the first step of that way on a port that also answers queries. Beside the
//! HTTP balancer, not above it: neither path knows the other.
//!
//! - [`client`]: one accepted connection as a [`client::TcpClient`]: sniff (a query handed to the
//!   balancer's query engine), take a `MAX_CONNECTIONS` place, choose and dial (quarantine,
//!   retry), relay, account.
//! - [`sniff`]: telling a query from a client by its first bytes, and a query connection's
//!   stream with those bytes in front.

pub mod client;
pub mod sniff;
