//! Upstream trust: what the certificates of `SSL_UPSTREAM_CA` mean. A server's own
//! certificate in the file is pinned (a notice, so the operator knows its names and CA flag
//! are not checked) and, past its end of validity, a warning: servers presenting it are
//! refused.

use std::path::Path;
use std::time::SystemTime;

use rustls::pki_types::CertificateDer;

use super::certificate::Presented;
use super::finding::Finding;

/// What `SSL_UPSTREAM_CA`'s certificates mean at `now`: each one that is a server's own rather
/// than a CA's (no CA at all, or self-signed without the key usage of signing certificates,
/// as `openssl req -x509` makes it) is said to be pinned, and an expired one is a warning:
/// pinning trusts it only while it is valid. A CA's certificate gets no line: it is used as
/// any CA bundle's.
pub fn pinned(path: &Path, certificates: &[CertificateDer<'_>], now: SystemTime) -> Vec<Finding> {
    let mut findings = Vec::new();
    for der in certificates {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            continue;
        };
        let signs_certificates = cert
            .key_usage()
            .ok()
            .flatten()
            .is_some_and(|usage| usage.value.key_cert_sign());
        let presented = Presented::of(&cert);
        if presented.ca && (!presented.self_signed || signs_certificates) {
            continue;
        }
        if let Ok(ago) = now.duration_since(presented.not_after) {
            findings.push(Finding::PinnedExpired {
                path: path.to_path_buf(),
                presented: Box::new(presented),
                ago,
            });
        } else {
            findings.push(Finding::Pinned {
                path: path.to_path_buf(),
                presented: Box::new(presented),
            });
        }
    }
    findings
}
