//! TLS with rustls: the balancers' identity towards clients (certificate chain and key from
//! PEM files, `SSL_CERTIFICATE`/`SSL_KEY`), connections to the servers (`SSL_ENCRYPT_UPSTREAM`),
//! the configuration doctor that reads the certificates for an operator, and handshake
//! failures in words.
//!
//! Everything here is built from plain settings ([`ServerSettings`], [`UpstreamSettings`]) and
//! knows nothing of the configuration file, listeners or servers: the caller fills the settings
//! from its keys, builds once per (re)load, and hands the result to the accept and connect
//! paths.
//!
//! - [`files`]: PEM files to certificates and keys, every way a file can be wrong in words.
//! - [`doctor`]: what a loaded certificate and key mean for its clients, and the certificates
//!   of `SSL_UPSTREAM_CA` for the servers: [`Finding`]s, one file per diagnosis and one for
//!   the report.
//! - [`server`]: [`ServerTls`], the acceptor side, with session resumption kept across
//!   reloads ([`Resumption`]).
//! - [`upstream`]: [`UpstreamTls`], the connector side, verifying the servers' certificates or,
//!   when told to, not.
//! - [`verify`]: how a server's certificate is trusted: pinned (one of `SSL_UPSTREAM_CA`'s
//!   own, as `openssl req -x509` makes them) or issued by a trusted CA; a refusal with what
//!   the certificate is.
//! - [`failure`]: a failed handshake in an operator's words ([`HandshakeFailure`]).
//! - [`first_byte`]: TLS or plain, told apart by a client's first byte
//!   (`SSL_PLAIN_ON_SAME_PORT`).
//!
//! One crypto provider serves all of it, aws-lc-rs ([`provider`]); docs/architecture.md gives
//! the measurement behind the choice.

pub mod doctor;
pub mod failure;
pub mod files;
pub mod first_byte;
pub mod server;
pub mod upstream;
pub mod verify;

#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use rustls::SupportedProtocolVersion;
use rustls::crypto::CryptoProvider;

pub use doctor::{CertificateSummary, Finding, Findings, Presented, Severity};
pub use failure::{Cause, HandshakeFailure, Peer};
pub use first_byte::Arrival;
pub use server::{Resumption, ServerSettings, ServerTls};
pub use upstream::{SystemRoots, UpstreamSettings, UpstreamTls};

/// The crypto provider of every TLS configuration the broker builds: aws-lc-rs, with the
/// post-quantum hybrid key exchange (X25519MLKEM768) preferred when a client offers it.
///
/// Chosen by measurement (docs/decisions/2026-11-30-tls-crypto-provider.md, made with
/// `benches/tls-providers`): a full handshake costs the server fewer instructions and less CPU
/// time than with ring, ECDSA and RSA alike, a resumed one the same; and ring has no
/// post-quantum key exchange. Passed explicitly to
/// every builder rather than installed as the process default, so nothing depends on the order
/// things start in.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// `SSL_METHOD`, as TOTVS writes it: which TLS versions a balancer speaks.
///
/// rustls speaks TLS 1.2 and 1.3 only. The older TOTVS values (`SSLv3`, `TLSv1`, `TLSv1.1`)
/// are accepted so a TOTVS file loads, and mean TLS 1.2 and 1.3, with a [`notice`](Self::notice)
/// saying so: every client of the last decade speaks TLS 1.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMethod {
    /// `SSL/TLS`: whatever both sides speak best (TLS 1.2 and 1.3). The default.
    #[default]
    Any,
    /// `TLSv1.2` only.
    Tls12,
    /// `TLSv1.3` only.
    Tls13,
    /// `SSLv3`: obsolete and unsafe; TLS 1.2 and 1.3 instead.
    Ssl3,
    /// `TLSv1` (TLS 1.0): obsolete; TLS 1.2 and 1.3 instead.
    Tls10,
    /// `TLSv1.1`: obsolete; TLS 1.2 and 1.3 instead.
    Tls11,
}

/// Every `SSL_METHOD` value, as written in a TOTVS file, with its meaning.
const METHODS: [(&str, SslMethod); 6] = [
    ("SSL/TLS", SslMethod::Any),
    ("TLSv1.2", SslMethod::Tls12),
    ("TLSv1.3", SslMethod::Tls13),
    ("SSLv3", SslMethod::Ssl3),
    ("TLSv1", SslMethod::Tls10),
    ("TLSv1.1", SslMethod::Tls11),
];

impl SslMethod {
    /// The value as a TOTVS file writes it.
    pub fn as_str(self) -> &'static str {
        METHODS
            .iter()
            .find(|(_, method)| *method == self)
            .map_or("SSL/TLS", |(name, _)| name)
    }

    /// The protocol versions spoken.
    pub fn versions(self) -> &'static [&'static SupportedProtocolVersion] {
        static BOTH: [&SupportedProtocolVersion; 2] =
            [&rustls::version::TLS13, &rustls::version::TLS12];
        static TLS12: [&SupportedProtocolVersion; 1] = [&rustls::version::TLS12];
        static TLS13: [&SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        match self {
            SslMethod::Tls12 => &TLS12,
            SslMethod::Tls13 => &TLS13,
            SslMethod::Any | SslMethod::Ssl3 | SslMethod::Tls10 | SslMethod::Tls11 => &BOTH,
        }
    }

    /// What to tell the operator when the value asks for a version appbroker does not speak.
    pub fn notice(self) -> Option<String> {
        let asked = match self {
            SslMethod::Ssl3 => "SSL 3.0",
            SslMethod::Tls10 => "TLS 1.0",
            SslMethod::Tls11 => "TLS 1.1",
            SslMethod::Any | SslMethod::Tls12 | SslMethod::Tls13 => return None,
        };
        Some(format!(
            "SSL_METHOD={} asks for {asked}, which is obsolete and unsafe and which appbroker \
             does not speak; TLS 1.2 and 1.3 are used instead (write SSL_METHOD=SSL/TLS to say \
             so)",
            self.as_str()
        ))
    }
}

impl fmt::Display for SslMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `SSL_METHOD` value that names no TLS method.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a TLS method; use SSL/TLS (TLS 1.2 and 1.3, the default), TLSv1.2 or TLSv1.3"
)]
pub struct MethodError(pub String);

impl FromStr for SslMethod {
    type Err = MethodError;

    /// Case does not matter (`tlsv1.2`, `ssl/tls`): TOTVS files are written by hand.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let value = value.trim();
        METHODS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(value))
            .map(|(_, method)| *method)
            .ok_or_else(|| MethodError(value.to_string()))
    }
}

/// The ALPN protocol of an HTTP balancer, towards clients and servers alike.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The ALPN protocol of HTTP/2 over TLS, offered to clients by an HTTP balancer with `HTTP2`.
pub const ALPN_H2: &[u8] = b"h2";
