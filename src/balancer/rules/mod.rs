//! A balancer's own rules: pure logic, no clock read, no log line, no lock. The balancer applies
//! them to its servers and logs what they decide (linkerd2-proxy's breaker is the model), so
//! each can be tested alone with paused time.
//!
//! - [`health`]: a server's quarantine as pure transitions returning what changed.
//! - [`overrides`]: an operator's overrides of a server (disabled, drain, weight) as pure
//!   transitions.
//! - [`select`]: the balancing policies (`CONNECTION`, `ROUND_ROBIN`), pure logic.
//! - [`places`]: query places (`QUERY_MAX_CONNECTIONS`), given up by idle connections.
//! - [`per_client`]: `MAX_CONNECTIONS_PER_CLIENT`: connections counted per client address,
//!   refusals in episodes, idle addresses forgotten.

pub mod health;
pub mod overrides;
pub mod per_client;
pub mod places;
pub mod select;
