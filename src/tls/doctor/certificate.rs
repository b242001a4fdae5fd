//! Certificates described for people: the broker's own as the status page and METRICS show it
//! ([`CertificateSummary`]), and any certificate as an operator tells one from another in a
//! log line ([`Presented`]: whose, by whom, for which names, until when).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustls::pki_types::CertificateDer;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use super::dates::{time, utc};

/// The broker's certificate as the status page and METRICS show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateSummary {
    /// The file it came from.
    pub path: PathBuf,
    /// The leaf's subject (`CN=broker.example.com, O=...`).
    pub subject: String,
    /// Its issuer.
    pub issuer: String,
    /// The names it is valid for (DNS names and IP addresses).
    pub names: Vec<String>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

impl CertificateSummary {
    /// Seconds from `now` until the certificate expires, negative once it has (METRICS:
    /// an alert fires on a threshold of this).
    pub fn seconds_until_expiry(&self, now: SystemTime) -> i64 {
        match self.not_after.duration_since(now) {
            Ok(left) => i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            Err(past) => -i64::try_from(past.duration().as_secs()).unwrap_or(i64::MAX),
        }
    }
}

/// Reads the leaf of a chain for the status page and METRICS. `None` when the chain is empty
/// or its first certificate cannot be parsed (loading refuses both before this is asked).
pub fn summarize(path: &Path, chain: &[CertificateDer<'_>]) -> Option<CertificateSummary> {
    let (_, leaf) = x509_parser::parse_x509_certificate(chain.first()?).ok()?;
    Some(CertificateSummary {
        path: path.to_path_buf(),
        subject: leaf.subject().to_string(),
        issuer: leaf.issuer().to_string(),
        names: names(&leaf),
        not_before: time(leaf.validity().not_before.timestamp()),
        not_after: time(leaf.validity().not_after.timestamp()),
    })
}

/// A certificate as an operator tells one from another: whose, by whom, for which names,
/// until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presented {
    /// `CN=appserver`.
    pub subject: String,
    /// Its issuer (the subject again when self-signed).
    pub issuer: String,
    /// Issued by itself (`openssl req -x509`).
    pub self_signed: bool,
    /// Marked CA:TRUE.
    pub ca: bool,
    /// Its subject alternative names (DNS names and IP addresses).
    pub names: Vec<String>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

impl Presented {
    /// Reads `der`; `None` when it is no X.509 certificate.
    pub fn read(der: &[u8]) -> Option<Presented> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        Some(Presented::of(&cert))
    }

    /// Describes a parsed certificate.
    pub fn of(cert: &X509Certificate<'_>) -> Presented {
        Presented {
            subject: cert.subject().to_string(),
            issuer: cert.issuer().to_string(),
            self_signed: cert.subject().as_raw() == cert.issuer().as_raw(),
            ca: cert.is_ca(),
            names: names(cert),
            not_before: time(cert.validity().not_before.timestamp()),
            not_after: time(cert.validity().not_after.timestamp()),
        }
    }
}

impl fmt::Display for Presented {
    /// `CN=appserver, self-signed, marked CA:TRUE, no subject alternative name, valid until
    /// 2027-01-01 00:00:00 UTC`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.subject)?;
        if self.self_signed {
            f.write_str(", self-signed")?;
        } else {
            write!(f, ", issued by {}", self.issuer)?;
        }
        if self.ca {
            f.write_str(", marked CA:TRUE")?;
        }
        if self.names.is_empty() {
            f.write_str(", no subject alternative name")?;
        } else {
            write!(f, ", for {}", self.names.join(", "))?;
        }
        write!(f, ", valid until {}", utc(self.not_after))
    }
}

/// The DNS names and IP addresses of a certificate's subject alternative names.
fn names(cert: &X509Certificate<'_>) -> Vec<String> {
    cert.subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| san.value.general_names.iter().filter_map(name).collect())
        .unwrap_or_default()
}

/// A DNS name or IP address of a subject alternative name, as text.
fn name(general: &GeneralName<'_>) -> Option<String> {
    match general {
        GeneralName::DNSName(dns) => Some(dns.to_string()),
        GeneralName::IPAddress(bytes) => match bytes.len() {
            4 => <[u8; 4]>::try_from(*bytes)
                .ok()
                .map(|b| std::net::IpAddr::from(b).to_string()),
            16 => <[u8; 16]>::try_from(*bytes)
                .ok()
                .map(|b| std::net::IpAddr::from(b).to_string()),
            _ => None,
        },
        _ => None,
    }
}
