//! The broker's own certificate and key (`SSL_CERTIFICATE`, `SSL_KEY`) diagnosed: [`diagnose`]
//! is a pure function of the loaded chain and key, the time and the roots this machine
//! trusts. It finds a key that is not the certificate's (or is a later certificate's), a
//! certificate not for TLS servers or a CA's, one expired, expiring soon or not valid yet, and
//! a chain out of order or stopping short of a root.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::RootCertStore;
use rustls::sign::CertifiedKey;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};

use super::dates::time;
use super::finding::Finding;

/// A certificate expiring within this many days gets a warning: the 30 days of the renewal
/// window that public CAs and tools such as certbot use, so the warning starts when renewal
/// should have happened.
pub const EXPIRY_WARNING_DAYS: u64 = 30;

/// The certificate and key of a balancer, loaded, with the files they came from.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `SSL_CERTIFICATE`.
    pub certificate_path: PathBuf,
    /// `SSL_KEY`.
    pub key_path: PathBuf,
    /// The chain, leaf first, and the key ready to sign.
    pub certified: Arc<CertifiedKey>,
}

/// What the doctor finds in a loaded identity at `now`, given the roots this machine trusts
/// (to tell a missing intermediate from a chain that reaches a known root).
pub fn diagnose(identity: &Identity, now: SystemTime, trusted: &RootCertStore) -> Vec<Finding> {
    let path = &identity.certificate_path;
    let parsed: Vec<X509Certificate<'_>> = identity
        .certified
        .cert
        .iter()
        .map_while(|der| {
            x509_parser::parse_x509_certificate(der)
                .ok()
                .map(|(_, c)| c)
        })
        .collect();
    if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
        identity.certified.keys_match()
    {
        // The key of a later certificate of the file: the chain is out of order, and the
        // checks below would only describe the wrong certificate.
        let spki = identity.certified.key.public_key();
        let owner = spki.and_then(|spki| {
            parsed
                .iter()
                .position(|c| c.public_key().raw == spki.as_ref())
                .filter(|&index| index > 0)
        });
        return vec![match owner {
            Some(index) => Finding::LeafNotFirst {
                path: path.clone(),
                index,
                subject: parsed[index].subject().to_string(),
            },
            None => Finding::KeyMismatch {
                key_path: identity.key_path.clone(),
                certificate_path: path.clone(),
            },
        }];
    }
    let Some(leaf) = parsed.first() else {
        return Vec::new();
    };
    let mut findings = Vec::new();
    let subject = leaf.subject().to_string();
    purpose(path, leaf, &subject, &mut findings);
    validity(path, leaf, &subject, now, &mut findings);
    chain(path, &parsed, trusted, &mut findings);
    findings
}

/// Whether the leaf may identify a TLS server.
fn purpose(path: &Path, leaf: &X509Certificate<'_>, subject: &str, out: &mut Vec<Finding>) {
    if let Ok(Some(eku)) = leaf.extended_key_usage() {
        let eku = eku.value;
        if !eku.server_auth && !eku.any {
            let mut usages = Vec::new();
            for (allowed, words) in [
                (eku.client_auth, "TLS client authentication"),
                (eku.code_signing, "code signing"),
                (eku.email_protection, "e-mail protection"),
                (eku.time_stamping, "time stamping"),
                (eku.ocsp_signing, "OCSP signing"),
            ] {
                if allowed {
                    usages.push(words.to_string());
                }
            }
            usages.extend(eku.other.iter().map(|oid| oid.to_id_string()));
            out.push(Finding::NotForServers {
                path: path.to_path_buf(),
                subject: subject.to_string(),
                usages: usages.join(", "),
                client_only: eku.client_auth,
            });
        }
    }
    if leaf.is_ca() {
        out.push(Finding::CaAsIdentity {
            path: path.to_path_buf(),
            subject: subject.to_string(),
        });
    }
}

/// Expired, expiring soon, or not valid yet.
fn validity(
    path: &Path,
    leaf: &X509Certificate<'_>,
    subject: &str,
    now: SystemTime,
    out: &mut Vec<Finding>,
) {
    let not_before = time(leaf.validity().not_before.timestamp());
    let not_after = time(leaf.validity().not_after.timestamp());
    let path = path.to_path_buf();
    let subject = subject.to_string();
    if let Ok(ago) = now.duration_since(not_after) {
        out.push(Finding::Expired {
            path,
            subject,
            not_after,
            ago,
        });
    } else if not_before > now {
        out.push(Finding::NotYetValid {
            path,
            subject,
            not_before,
        });
    } else if let Ok(left) = not_after.duration_since(now)
        && left < Duration::from_secs(EXPIRY_WARNING_DAYS * 86_400)
    {
        out.push(Finding::ExpiresSoon {
            path,
            subject,
            not_after,
            left,
        });
    }
}

/// Order, and whether the chain reaches a root (in the file, or one this machine trusts).
fn chain(
    path: &Path,
    parsed: &[X509Certificate<'_>],
    trusted: &RootCertStore,
    out: &mut Vec<Finding>,
) {
    for (index, pair) in parsed.windows(2).enumerate() {
        let (cert, next) = (&pair[0], &pair[1]);
        if cert.issuer().as_raw() != next.subject().as_raw() {
            out.push(Finding::OutOfOrder {
                path: path.to_path_buf(),
                index,
                subject: cert.subject().to_string(),
                next: next.subject().to_string(),
            });
            return; // the rest of the chain says nothing more once its order is broken
        }
    }
    let Some(last) = parsed.last() else {
        return;
    };
    let issuer = last.issuer().as_raw();
    if issuer == last.subject().as_raw() {
        return; // self-issued: a root (or a self-signed certificate) ends the chain
    }
    let issuer_contents = der_contents(issuer);
    if trusted
        .roots
        .iter()
        .any(|anchor| Some(anchor.subject.as_ref()) == issuer_contents)
    {
        return;
    }
    let (subject, issuer) = (last.subject().to_string(), last.issuer().to_string());
    let path = path.to_path_buf();
    out.push(match ca_issuers_url(last) {
        Some(url) => Finding::MissingIntermediate {
            path,
            subject,
            issuer,
            url,
        },
        None => Finding::PrivateIssuer {
            path,
            subject,
            issuer,
        },
    });
}

/// Where the certificate's issuer's certificate is published, if it says.
fn ca_issuers_url(cert: &X509Certificate<'_>) -> Option<String> {
    cert.extensions()
        .iter()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::AuthorityInfoAccess(aia) => aia.accessdescs.iter().find_map(|desc| {
                match (&desc.access_method, &desc.access_location) {
                    (method, GeneralName::URI(url))
                        if *method
                            == x509_parser::oid_registry::OID_PKIX_ACCESS_DESCRIPTOR_CA_ISSUERS =>
                    {
                        Some(url.to_string())
                    }
                    _ => None,
                }
            }),
            _ => None,
        })
}

/// The contents of a DER SEQUENCE (a Name) without its tag and length, as rustls keeps a trust
/// anchor's subject.
fn der_contents(der: &[u8]) -> Option<&[u8]> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    if tag != 0x30 {
        return None;
    }
    if first < 0x80 {
        return rest.get(..usize::from(first));
    }
    let octets = usize::from(first & 0x7f);
    let (length, contents) = (rest.get(..octets)?, rest.get(octets..)?);
    let length = length
        .iter()
        .fold(0usize, |n, b| (n << 8) | usize::from(*b));
    contents.get(..length)
}
