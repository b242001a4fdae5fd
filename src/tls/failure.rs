//! A failed TLS handshake in an operator's words: `certificate expired on 2026-03-01 12:00:00
//! UTC`, `unknown issuer`, `name mismatch: certificate is for app1.example`, `not TLS: ...`.
//! The [`Cause`] is what METRICS counts and what makes a log episode (one line when a cause
//! starts, not one per client); the words are the line.
//!
//! Towards a server, every failure quarantines it (the reason is these words); from a client,
//! none blames any server.

use std::fmt;
use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::{AlertDescription, CertificateError, Error, PeerIncompatible};

use super::doctor::utc;

/// Who is on the other end of the failed handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A client of a TLS listener.
    Client,
    /// A server, with `SSL_ENCRYPT_UPSTREAM=1`.
    Server,
}

impl Peer {
    fn as_str(self) -> &'static str {
        match self {
            Peer::Client => "the client",
            Peer::Server => "the server",
        }
    }
}

/// Why a handshake failed, as a small set METRICS can count and a log can group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The server's certificate has expired.
    Expired,
    /// The server's certificate is not valid yet (or a clock is wrong).
    NotYetValid,
    /// The server's certificate is not signed by a trusted CA.
    UnknownIssuer,
    /// The server's certificate is not for the name it was reached by.
    NameMismatch,
    /// The server's certificate is not for TLS servers.
    WrongPurpose,
    /// Another fault of the server's certificate (bad signature, revoked, bad encoding).
    BadCertificate,
    /// The peer refused our certificate (a client that does not trust the broker's).
    CertificateRefused,
    /// No protocol version, cipher suite, group or signature scheme in common.
    Incompatible,
    /// The peer did not speak TLS (plain text on a TLS port, or a server without TLS).
    NotTls,
    /// The peer closed or reset the connection during the handshake.
    Closed,
    /// The handshake did not finish in time.
    TimedOut,
    /// The peer sent an alert or broke the protocol in another way.
    Protocol,
    /// A socket error other than a close or reset.
    Io,
}

impl Cause {
    /// The label METRICS uses (`appbroker_tls_handshake_failures_total{cause="..."}`).
    pub fn label(self) -> &'static str {
        match self {
            Cause::Expired => "expired",
            Cause::NotYetValid => "not_yet_valid",
            Cause::UnknownIssuer => "unknown_issuer",
            Cause::NameMismatch => "name_mismatch",
            Cause::WrongPurpose => "wrong_purpose",
            Cause::BadCertificate => "bad_certificate",
            Cause::CertificateRefused => "certificate_refused",
            Cause::Incompatible => "incompatible",
            Cause::NotTls => "not_tls",
            Cause::Closed => "closed",
            Cause::TimedOut => "timed_out",
            Cause::Protocol => "protocol",
            Cause::Io => "io",
        }
    }
}

/// A failed handshake: what METRICS counts, and the words a log line and a quarantine reason
/// carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeFailure {
    /// Why, as a category.
    pub cause: Cause,
    /// Why, in words.
    pub words: String,
}

impl fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.words)
    }
}

impl std::error::Error for HandshakeFailure {}

impl HandshakeFailure {
    fn new(cause: Cause, words: impl Into<String>) -> Self {
        HandshakeFailure {
            cause,
            words: words.into(),
        }
    }

    /// A client that sent plain HTTP to a TLS-only HTTP port (answered 400: use https).
    pub fn plain_http() -> Self {
        HandshakeFailure::new(
            Cause::NotTls,
            "the client sent plain HTTP to this TLS port; it was answered 400 (use https)",
        )
    }

    /// A handshake that did not finish within `limit`.
    pub fn timed_out(limit: Duration, peer: Peer) -> Self {
        HandshakeFailure::new(
            Cause::TimedOut,
            format!(
                "the TLS handshake with {} did not finish within {} ms",
                peer.as_str(),
                limit.as_millis()
            ),
        )
    }

    /// Classifies what tokio-rustls returned: a rustls error inside an I/O error, or the
    /// socket's own error.
    pub fn from_io(error: &io::Error, peer: Peer) -> Self {
        if let Some(tls) = error.get_ref().and_then(|e| e.downcast_ref::<Error>()) {
            return HandshakeFailure::from_rustls(tls, peer);
        }
        let who = peer.as_str();
        match error.kind() {
            io::ErrorKind::UnexpectedEof => HandshakeFailure::new(
                Cause::Closed,
                match peer {
                    Peer::Client => format!("{who} closed the connection during the TLS handshake"),
                    Peer::Server => format!(
                        "{who} closed the connection during the TLS handshake (does its port \
                         speak TLS? SSL_ENCRYPT_UPSTREAM=1 needs it to)"
                    ),
                },
            ),
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => HandshakeFailure::new(
                Cause::Closed,
                format!("{who} reset the connection during the TLS handshake"),
            ),
            io::ErrorKind::TimedOut => HandshakeFailure::new(
                Cause::TimedOut,
                format!("the TLS handshake with {who} timed out"),
            ),
            _ => HandshakeFailure::new(
                Cause::Io,
                format!("the TLS handshake with {who} failed: {error}"),
            ),
        }
    }

    /// Classifies a rustls error.
    pub fn from_rustls(error: &Error, peer: Peer) -> Self {
        let who = peer.as_str();
        match error {
            Error::InvalidCertificate(cert) => certificate(cert),
            Error::AlertReceived(alert) => alert_received(*alert, peer),
            Error::PeerIncompatible(why) => incompatible(why, peer),
            Error::InvalidMessage(_) | Error::InappropriateMessage { .. } => HandshakeFailure::new(
                Cause::NotTls,
                match peer {
                    Peer::Client => format!(
                        "not TLS: {who} sent something else (plain text to a TLS port? it should \
                         connect with TLS, https:// for a browser)"
                    ),
                    Peer::Server => format!(
                        "not TLS: {who} answered something else (does its port speak TLS? \
                         SSL_ENCRYPT_UPSTREAM=1 needs it to)"
                    ),
                },
            ),
            Error::NoCertificatesPresented => HandshakeFailure::new(
                Cause::BadCertificate,
                format!("{who} presented no certificate"),
            ),
            Error::NoApplicationProtocol => HandshakeFailure::new(
                Cause::Incompatible,
                format!("no application protocol (ALPN) in common with {who}"),
            ),
            other => HandshakeFailure::new(
                Cause::Protocol,
                format!("the TLS handshake with {who} failed: {other}"),
            ),
        }
    }
}

/// The server's certificate, refused by our verification.
fn certificate(error: &CertificateError) -> HandshakeFailure {
    use CertificateError::*;
    let (cause, words) = match error {
        ExpiredContext { not_after, .. } => (
            Cause::Expired,
            format!("certificate expired on {}", utc(unix(not_after.as_secs()))),
        ),
        Expired => (Cause::Expired, "certificate expired".to_string()),
        NotValidYetContext { not_before, .. } => (
            Cause::NotYetValid,
            format!(
                "certificate not valid before {} (or a clock is wrong)",
                utc(unix(not_before.as_secs()))
            ),
        ),
        NotValidYet => (
            Cause::NotYetValid,
            "certificate not valid yet (or a clock is wrong)".to_string(),
        ),
        UnknownIssuer => (
            Cause::UnknownIssuer,
            "unknown issuer: the certificate is not signed by a CA in SSL_UPSTREAM_CA (or the \
             system's roots when it is not set)"
                .to_string(),
        ),
        NotValidForNameContext {
            expected,
            presented,
        } => (
            Cause::NameMismatch,
            format!(
                "name mismatch: certificate is for {}, not {} (set SSL_UPSTREAM_SERVER_NAME to \
                 a name it holds)",
                if presented.is_empty() {
                    "no name (it has no subject alternative names)".to_string()
                } else {
                    presented
                        .iter()
                        .map(|p| presented_name(p))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                expected.to_str()
            ),
        ),
        NotValidForName => (Cause::NameMismatch, "name mismatch".to_string()),
        InvalidPurpose | InvalidPurposeContext { .. } => (
            Cause::WrongPurpose,
            "the certificate does not allow TLS server authentication (extended key usage)"
                .to_string(),
        ),
        other => (
            Cause::BadCertificate,
            format!("invalid certificate: {other:?}"),
        ),
    };
    HandshakeFailure::new(cause, words)
}

/// `DnsName("app1.example")` or `IpAddress(10.0.0.1)`, as webpki lists a certificate's
/// names, to the bare name.
fn presented_name(name: &str) -> String {
    let inner = name
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .unwrap_or(name);
    inner.trim_matches('"').to_string()
}

/// An alert from the peer.
fn alert_received(alert: AlertDescription, peer: Peer) -> HandshakeFailure {
    let who = peer.as_str();
    match alert {
        AlertDescription::UnknownCA
        | AlertDescription::BadCertificate
        | AlertDescription::CertificateUnknown
        | AlertDescription::CertificateExpired
        | AlertDescription::UnsupportedCertificate
        | AlertDescription::CertificateRevoked => HandshakeFailure::new(
            Cause::CertificateRefused,
            format!(
                "{who} refused the broker's certificate (TLS alert {alert:?}): it does not trust \
                 the CA that issued it, or finds it expired or not for this name; check \
                 SSL_CERTIFICATE and what the clients trust"
            ),
        ),
        AlertDescription::ProtocolVersion
        | AlertDescription::HandshakeFailure
        | AlertDescription::InsufficientSecurity => HandshakeFailure::new(
            Cause::Incompatible,
            format!(
                "{who} refused the handshake (TLS alert {alert:?}): no TLS version or cipher in \
                 common; appbroker speaks TLS 1.2 and 1.3 (SSL_METHOD)"
            ),
        ),
        _ => HandshakeFailure::new(
            Cause::Protocol,
            format!("{who} ended the TLS handshake (TLS alert {alert:?})"),
        ),
    }
}

/// Nothing in common.
fn incompatible(why: &PeerIncompatible, peer: Peer) -> HandshakeFailure {
    use PeerIncompatible::*;
    let who = peer.as_str();
    let words = match why {
        ServerDoesNotSupportTls12Or13
        | SupportedVersionsExtensionRequired
        | Tls12NotOffered
        | Tls12NotOfferedOrEnabled
        | ServerTlsVersionIsDisabledByOurConfig => format!(
            "no TLS version in common with {who}: appbroker speaks TLS 1.2 and 1.3 (as \
             SSL_METHOD allows); {who} offers only others"
        ),
        NoCipherSuitesInCommon => format!("no cipher suite in common with {who}"),
        NoKxGroupsInCommon | KeyShareExtensionRequired | NamedGroupsExtensionRequired => {
            format!("no key exchange group in common with {who}")
        }
        NoSignatureSchemesInCommon | SignatureAlgorithmsExtensionRequired => {
            format!("no signature scheme in common with {who} for the certificate's key")
        }
        other => format!("{who} is not compatible: {other:?}"),
    };
    HandshakeFailure::new(Cause::Incompatible, words)
}

fn unix(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}
