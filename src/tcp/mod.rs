//! A TCP balancer's connections: each accepted connection as one struct whose methods are its
//! way through the broker, and the first step of that way on a port that also answers
//! queries. Above the HTTP balancer, for now, because the TLS step of every accepted
//! connection is the client's and an HTTP one is handed from there to its engine.
//!
//! - [`client`]: one accepted connection as a [`client::Client`]: the TLS step, sniff, take a
//!   `MAX_CONNECTIONS` place, choose and dial (quarantine, retry), relay, account.
//! - [`sniff`]: telling a query from a client by its first bytes.

pub mod client;
pub mod sniff;
