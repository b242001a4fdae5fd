//! How the servers' certificates are verified (`SSL_UPSTREAM_VERIFY=1`): a certificate
//! byte-identical to one in `SSL_UPSTREAM_CA` is trusted as it is (pinned); any other must
//! chain to a CA there (or to the system's roots) for the name the server is reached by
//! (webpki).
//!
//! Why pinning: AppServers often carry a certificate made with `openssl req -x509`,
//! self-signed and marked CA:TRUE, often without a subjectAltName. webpki rightly refuses a
//! CA's certificate as a server's own (`CaUsedAsEndEntity`), while OpenSSL-based proxies
//! accept a server certificate that is itself in their trusted file, and operators name that
//! very file. A pinned certificate is the identity itself: its CA flag, key usages and names
//! are not checked, its validity dates are. Either way the handshake's signatures are
//! verified with the provider's algorithms, so the server proves it holds the certificate's
//! key.
//!
//! A refusal carries what the certificate is ([`Presented`]) and what was trusted instead
//! ([`Refused`]), so [`super::failure`] can say it in words.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};

use super::doctor::Presented;

/// The servers' certificates verified: pinned ones by their bytes and dates, the others by
/// webpki.
#[derive(Debug)]
pub struct PinnedOrIssued {
    /// `SSL_UPSTREAM_CA`'s certificates, each trusted as it is when a server presents it
    /// (none with the system's roots: a public root is no server's certificate).
    pinned: Vec<CertificateDer<'static>>,
    /// Chains to the trusted roots, for the name the server is reached by.
    webpki: Arc<WebPkiServerVerifier>,
    /// What is trusted, for the words of a refusal.
    trusted: Arc<Trusted>,
}

/// What the broker trusts for its servers, as a refusal names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trusted {
    /// `SSL_UPSTREAM_CA`: the file and the subjects of its certificates (at most
    /// [`SUBJECTS_NAMED`], then a count).
    CaFile {
        /// The file.
        path: String,
        /// Its certificates' subjects, in words.
        subjects: String,
    },
    /// `SSL_UPSTREAM_CA` not set: the roots this system trusts.
    System,
}

/// How many of `SSL_UPSTREAM_CA`'s certificates a refusal names: enough for the one or two an
/// AppServer fleet has, short for a bundle.
const SUBJECTS_NAMED: usize = 3;

impl PinnedOrIssued {
    /// A verifier over `webpki` (built on `SSL_UPSTREAM_CA`'s roots, or the system's), with
    /// `ca_file`'s certificates pinned when it is set.
    pub fn new(
        webpki: Arc<WebPkiServerVerifier>,
        ca_file: Option<(&Path, Vec<CertificateDer<'static>>)>,
    ) -> PinnedOrIssued {
        let (pinned, trusted) = match ca_file {
            Some((path, certificates)) => {
                let mut subjects: Vec<String> = certificates
                    .iter()
                    .take(SUBJECTS_NAMED)
                    .map(|c| Presented::read(c).map_or_else(|| "?".into(), |p| p.subject))
                    .collect();
                if certificates.len() > SUBJECTS_NAMED {
                    subjects.push(format!("{} more", certificates.len() - SUBJECTS_NAMED));
                }
                let trusted = Trusted::CaFile {
                    path: path.display().to_string(),
                    subjects: subjects.join(", "),
                };
                (certificates, trusted)
            }
            None => (Vec::new(), Trusted::System),
        };
        PinnedOrIssued {
            pinned,
            webpki,
            trusted: Arc::new(trusted),
        }
    }

    /// The refusal of `presented` for `error`, as rustls carries it to the handshake's end.
    fn refuse(
        &self,
        presented: &CertificateDer<'_>,
        error: CertificateError,
        pinned: bool,
    ) -> rustls::Error {
        let refused = Refused {
            error,
            presented: Presented::read(presented),
            pinned,
            trusted: Arc::clone(&self.trusted),
        };
        CertificateError::Other(OtherError(Arc::new(refused))).into()
    }
}

impl ServerCertVerifier for PinnedOrIssued {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self
            .pinned
            .iter()
            .any(|p| p.as_ref() == end_entity.as_ref())
        {
            return match dates(end_entity, now) {
                Ok(()) => Ok(ServerCertVerified::assertion()),
                Err(error) => Err(self.refuse(end_entity, error, true)),
            };
        }
        self.webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map_err(|e| match e {
                rustls::Error::InvalidCertificate(error) => self.refuse(end_entity, error, false),
                other => other,
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A pinned certificate's validity dates at `now`: the one check pinning keeps.
fn dates(der: &CertificateDer<'_>, now: UnixTime) -> Result<(), CertificateError> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Err(CertificateError::BadEncoding);
    };
    let (not_before, not_after) = (
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    );
    let at = |seconds: i64| UnixTime::since_unix_epoch(since_epoch(seconds));
    let seconds = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    if seconds < not_before {
        return Err(CertificateError::NotValidYetContext {
            time: now,
            not_before: at(not_before),
        });
    }
    if seconds > not_after {
        return Err(CertificateError::ExpiredContext {
            time: now,
            not_after: at(not_after),
        });
    }
    Ok(())
}

/// A certificate's time (seconds since the epoch, negative before it) as a duration since
/// the epoch; a date before 1970 is taken as 1970.
fn since_epoch(seconds: i64) -> Duration {
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// A server's certificate refused, with what it is and what was trusted instead: carried in
/// rustls's `CertificateError::Other` to the end of the handshake, where
/// [`super::failure`] puts it in words.
#[derive(Debug)]
pub struct Refused {
    /// Why, as webpki (or the pin's dates) said.
    pub error: CertificateError,
    /// The certificate the server presented; `None` when it cannot be read.
    pub presented: Option<Presented>,
    /// It is the very certificate pinned in `SSL_UPSTREAM_CA`, refused for its dates.
    pub pinned: bool,
    /// What the broker trusts.
    pub trusted: Arc<Trusted>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.presented {
            Some(presented) => write!(f, "the server's certificate ({presented}) was refused"),
            None => f.write_str("the server's certificate was refused"),
        }
    }
}

impl std::error::Error for Refused {}
