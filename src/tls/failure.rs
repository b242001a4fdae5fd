//! A failed TLS handshake in an operator's words: `certificate expired on 2026-03-01 12:00:00
//! UTC`, `unknown issuer`, `name mismatch: certificate is for app1.example`, `not TLS: ...`.
//! The [`Cause`] is what METRICS counts and what makes a log episode (one line when a cause
//! starts, not one per client); the words are the line. A server's certificate refused by the
//! broker's verifier is told with what it is (subject, issuer, names, dates), what was trusted
//! instead (`SSL_UPSTREAM_CA` and what it holds) and what to change; never with a library's
//! debug string.
//!
//! Towards a server, every failure quarantines it (the reason is these words); from a client,
//! none blames any server.

use std::fmt;
use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::{AlertDescription, CertificateError, Error, PeerIncompatible};

use super::doctor::{Presented, utc};
use super::verify::{Refused, Trusted};

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

/// A certificate refused by our verification, in words. The broker's own verifier
/// ([`PinnedOrIssued`](super::verify::PinnedOrIssued)) says what the certificate is and what
/// was trusted instead ([`Refused`]); a bare error (none from the broker's verifiers) is told
/// with what it says alone.
fn certificate(error: &CertificateError) -> HandshakeFailure {
    if let CertificateError::Other(other) = error
        && let Some(refused) = other.0.downcast_ref::<Refused>()
    {
        return refused_words(&refused.error, &Seen::from(refused));
    }
    refused_words(error, &Seen::default())
}

/// What a refusal knows besides its error.
#[derive(Default)]
struct Seen<'a> {
    /// The certificate presented.
    presented: Option<&'a Presented>,
    /// It is the one pinned in `SSL_UPSTREAM_CA`.
    pinned: bool,
    /// What the broker trusts.
    trusted: Option<&'a Trusted>,
}

impl<'a> From<&'a Refused> for Seen<'a> {
    fn from(refused: &'a Refused) -> Self {
        Seen {
            presented: refused.presented.as_ref(),
            pinned: refused.pinned,
            trusted: Some(&refused.trusted),
        }
    }
}

impl Seen<'_> {
    /// `the server's certificate (CN=app1, issued by CN=AppServer CA, ...)`, or the pinned one.
    fn what(&self) -> String {
        let whose = if self.pinned {
            "the certificate pinned in SSL_UPSTREAM_CA"
        } else {
            "the server's certificate"
        };
        match self.presented {
            Some(p) => format!("{whose} ({p})"),
            None => whose.to_string(),
        }
    }

    /// `; the certificate is CN=app1, issued by CN=AppServer CA`, when known: which
    /// certificate, its names told already.
    fn whose(&self) -> String {
        self.presented.map_or_else(String::new, |p| {
            let by = if p.self_signed {
                "self-signed".to_string()
            } else {
                format!("issued by {}", p.issuer)
            };
            format!("; the certificate is {}, {by}", p.subject)
        })
    }

    fn self_signed(&self) -> bool {
        self.presented.is_some_and(|p| p.self_signed)
    }
}

/// The words for `error` about the certificate `seen` describes.
fn refused_words(error: &CertificateError, seen: &Seen<'_>) -> HandshakeFailure {
    let (cause, words) = validity_words(error, seen)
        .or_else(|| name_words(error, seen))
        .unwrap_or_else(|| fault_words(error, seen));
    HandshakeFailure::new(cause, words)
}

/// A certificate used outside its dates: expired, or not valid yet.
fn validity_words(error: &CertificateError, seen: &Seen<'_>) -> Option<(Cause, String)> {
    use CertificateError::*;
    let what = seen.what();
    Some(match error {
        ExpiredContext { not_after, .. } => (
            Cause::Expired,
            format!(
                "certificate expired on {}: {what}; {}",
                utc(unix(not_after.as_secs())),
                renew(seen)
            ),
        ),
        Expired => (
            Cause::Expired,
            format!("certificate expired: {what}; {}", renew(seen)),
        ),
        NotValidYetContext { not_before, .. } => (
            Cause::NotYetValid,
            format!(
                "certificate not valid before {} (or a clock is wrong): {what}; check the \
                 clocks of the server and of this machine",
                utc(unix(not_before.as_secs()))
            ),
        ),
        NotValidYet => (
            Cause::NotYetValid,
            format!("certificate not valid yet (or a clock is wrong): {what}"),
        ),
        _ => return None,
    })
}

/// A certificate not for the name the server was reached by.
fn name_words(error: &CertificateError, seen: &Seen<'_>) -> Option<(Cause, String)> {
    use CertificateError::*;
    Some(match error {
        NotValidForNameContext {
            expected,
            presented,
        } => (
            Cause::NameMismatch,
            format!(
                "name mismatch: certificate is for {}, not {} (set SSL_UPSTREAM_SERVER_NAME to \
                 a name it holds){}",
                if presented.is_empty() {
                    "no name (it has no subject alternative names)".to_string()
                } else {
                    presented
                        .iter()
                        .map(|p| presented_name(p))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                expected.to_str(),
                seen.whose()
            ),
        ),
        NotValidForName => (
            Cause::NameMismatch,
            format!("name mismatch: {}", seen.what()),
        ),
        _ => return None,
    })
}

/// Any other refusal: an issuer not trusted, a certificate not for servers, or one that is
/// broken (signature, algorithm, encoding) or revoked.
fn fault_words(error: &CertificateError, seen: &Seen<'_>) -> (Cause, String) {
    use CertificateError::*;
    let what = seen.what();
    match error {
        UnknownIssuer => not_trusted(seen),
        InvalidPurpose | InvalidPurposeContext { .. } => (
            Cause::WrongPurpose,
            format!(
                "{what} does not allow TLS server authentication (its extended key usage): \
                 issue the server one that does"
            ),
        ),
        BadSignature => (
            Cause::BadCertificate,
            format!(
                "{what} does not verify: its signature does not match its issuer's key (a CA \
                 of the same name but another key in SSL_UPSTREAM_CA?)"
            ),
        ),
        UnsupportedSignatureAlgorithmContext { .. }
        | UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => (
            Cause::BadCertificate,
            format!(
                "{what} is signed with an algorithm appbroker does not accept (it takes RSA \
                 with SHA-256 or better, ECDSA and Ed25519): issue the server a new one"
            ),
        ),
        BadEncoding => (
            Cause::BadCertificate,
            format!("{what} is not a valid X.509 certificate (its encoding is broken)"),
        ),
        Revoked => (Cause::BadCertificate, format!("{what} is revoked")),
        Other(other) => match other.0.downcast_ref::<webpki::Error>() {
            Some(webpki::Error::CaUsedAsEndEntity) => not_trusted(seen),
            Some(e) => (Cause::BadCertificate, webpki_words(e, &what)),
            None => (
                Cause::BadCertificate,
                format!("{what} was refused: {other}"),
            ),
        },
        _ => (
            Cause::BadCertificate,
            format!("{what} was refused by the certificate checks"),
        ),
    }
}

/// What to do about an expired (or not yet valid) certificate.
fn renew(seen: &Seen<'_>) -> &'static str {
    if seen.pinned {
        "a pinned certificate is trusted only while it is valid: make the server a new one and \
         put it in SSL_UPSTREAM_CA in place of the old"
    } else {
        "renew it on the server"
    }
}

/// A certificate no trusted CA issued and that is not pinned: a self-signed one (the server's
/// own, `openssl req -x509`) is to be pinned, another's CA added.
fn not_trusted(seen: &Seen<'_>) -> (Cause, String) {
    let what = seen.what();
    let file = match seen.trusted {
        Some(Trusted::CaFile { path, subjects }) => Some(format!("{path} holds {subjects}")),
        Some(Trusted::System) => None,
        None => {
            return (
                Cause::UnknownIssuer,
                "unknown issuer: the certificate is not signed by a CA in SSL_UPSTREAM_CA (or \
                 the system's roots when it is not set)"
                    .to_string(),
            );
        }
    };
    let words = match (
        file,
        seen.self_signed(),
        seen.presented.is_some_and(|p| p.ca),
    ) {
        (Some(file), true, _) => format!(
            "not trusted: {what} is not the certificate pinned in SSL_UPSTREAM_CA ({file}): if \
             it is the server's own (made again since?), put this very certificate in \
             SSL_UPSTREAM_CA"
        ),
        (None, true, _) => format!(
            "not trusted: {what} is self-signed and SSL_UPSTREAM_CA is not set: put this very \
             certificate in SSL_UPSTREAM_CA to pin it"
        ),
        (file, false, true) => format!(
            "not trusted: {what} is a CA's certificate, which a server cannot use as its own, \
             and is not pinned in SSL_UPSTREAM_CA{}: give the server a certificate that CA \
             issued, or put this very certificate in SSL_UPSTREAM_CA",
            file.map_or_else(String::new, |f| format!(" ({f})"))
        ),
        (Some(file), false, false) => format!(
            "unknown issuer: {what} is not signed by a CA in SSL_UPSTREAM_CA, nor pinned there \
             ({file}): add the CA that issued it, or the certificate itself, to SSL_UPSTREAM_CA"
        ),
        (None, false, false) => format!(
            "unknown issuer: {what} is not signed by a CA this system trusts (SSL_UPSTREAM_CA is \
             not set): set SSL_UPSTREAM_CA to the CA that issued it, or to the certificate itself"
        ),
    };
    (Cause::UnknownIssuer, words)
}

/// webpki's other reasons, in words.
fn webpki_words(error: &webpki::Error, what: &str) -> String {
    use webpki::Error::*;
    match error {
        EndEntityUsedAsCa => format!(
            "{what} comes with a chain in which a server's certificate stands for a CA: fix the \
             chain the server sends"
        ),
        PathLenConstraintViolated | MaximumPathDepthExceeded => format!(
            "{what} comes with a chain longer than its CAs allow: send the server's certificate \
             and its intermediates only"
        ),
        NameConstraintViolation => format!(
            "{what} holds a name its CA may not issue for (name constraints): issue it from a CA \
             allowed that name"
        ),
        UnsupportedCertVersion => format!(
            "{what} is an X.509 version 1 certificate, which carries no extensions and cannot be \
             checked: make a version 3 one (openssl req -x509 does)"
        ),
        UnsupportedCriticalExtension => format!(
            "{what} has an extension marked critical that appbroker does not know: issue one \
             without it"
        ),
        CertNotValidForName(_) => format!("name mismatch: {what}"),
        _ => format!(
            "{what} breaks a rule of certificate path validation (webpki: {error}): issue it \
             from a CA in SSL_UPSTREAM_CA, or pin it there"
        ),
    }
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
        // The broker presents no certificate to its servers: one that wants a certificate
        // (or refuses the empty one) asks for client-certificate authentication.
        AlertDescription::CertificateRequired
        | AlertDescription::UnknownCA
        | AlertDescription::BadCertificate
        | AlertDescription::CertificateUnknown
        | AlertDescription::UnsupportedCertificate
            if peer == Peer::Server =>
        {
            HandshakeFailure::new(
                Cause::CertificateRefused,
                format!(
                    "{who} refused the handshake (TLS alert {alert:?}): it asks for a client \
                     certificate, which appbroker does not present to servers"
                ),
            )
        }
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
        _ => format!(
            "{who} is not compatible: no TLS version, cipher suite or extension in common that \
             appbroker accepts (TLS 1.2 and 1.3, SSL_METHOD)"
        ),
    };
    HandshakeFailure::new(Cause::Incompatible, words)
}

fn unix(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}
