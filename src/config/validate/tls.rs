//! A balancer's `SSL_*` keys: the rules that tie them together (a certificate needs its key,
//! the upstream keys need `SSL_ENCRYPT_UPSTREAM=1`, an obsolete `SSL_METHOD` is replaced with a
//! notice, a Windows path that cannot exist here is named as such), and the configuration doctor: the files are loaded
//! as the balancer will load them, and what [`crate::tls`] finds becomes an error (nothing can
//! be served with it) or a warning, on the line of the key to fix.

use std::path::Path;
use std::time::SystemTime;

use super::super::{BalancerConfig, ConfigError, TlsKeys};
use super::{SectionLookup, Validator};
use crate::tls::{Finding, Resumption, ServerTls, Severity, UpstreamTls};

/// The keys that only mean something with `SSL_ENCRYPT_UPSTREAM=1`.
const UPSTREAM_KEYS: [&str; 3] = [
    "SSL_UPSTREAM_VERIFY",
    "SSL_UPSTREAM_CA",
    "SSL_UPSTREAM_SERVER_NAME",
];

impl Validator {
    /// The `SSL_*` rules and the doctor for balancer `b` of `lookup`'s section.
    pub(super) fn tls(&mut self, lookup: &SectionLookup<'_>, b: &BalancerConfig) {
        self.tls_keys(lookup, &b.tls);
        let windows = self.windows_paths(lookup, &b.tls);
        // A Windows path said so already; that the file cannot be read says nothing more.
        let said =
            |f: &Finding| matches!(f, Finding::Unreadable { key, .. } if windows.contains(key));
        for finding in self.doctor(b).into_iter().filter(|f| !said(f)) {
            let error = ConfigError {
                key: None,
                ..at(lookup, finding.key(), finding.to_string())
            };
            match finding.severity() {
                Severity::Error => self.errors.push(error),
                Severity::Warning => self.warnings.push(error),
                Severity::Notice => self.notices.push(error),
            }
        }
    }

    /// The rules that tie the keys together: a certificate needs its key (and the other way
    /// round), an obsolete `SSL_METHOD` is replaced, and keys that mean nothing without
    /// another are noticed as ignored.
    fn tls_keys(&mut self, lookup: &SectionLookup<'_>, keys: &TlsKeys) {
        match (&keys.certificate, &keys.key) {
            (Some(_), None) => self.errors.push(at(
                lookup,
                "SSL_CERTIFICATE",
                "is set without SSL_KEY: set both (the certificate's private key in SSL_KEY) \
                 for TLS towards clients, or neither"
                    .into(),
            )),
            (None, Some(_)) => self.errors.push(at(
                lookup,
                "SSL_KEY",
                "is set without SSL_CERTIFICATE: set both for TLS towards clients, or neither"
                    .into(),
            )),
            _ => {}
        }
        if let Some(notice) = keys.method.notice() {
            self.notices.push(at(lookup, "SSL_METHOD", notice));
        }
        if keys.certificate.is_none() && keys.plain_on_same_port {
            self.notices.push(at(
                lookup,
                "SSL_PLAIN_ON_SAME_PORT",
                "is ignored: the port speaks TLS only with SSL_CERTIFICATE and SSL_KEY".into(),
            ));
        }
        if !keys.encrypt_upstream {
            for key in UPSTREAM_KEYS {
                if lookup.find(key).is_some() {
                    self.notices.push(at(
                        lookup,
                        key,
                        "is ignored: it is used with SSL_ENCRYPT_UPSTREAM=1 only".into(),
                    ));
                }
            }
        }
    }

    /// An error for each file key that holds a Windows path, and those keys. A TOTVS file's
    /// Windows path is read as written; it cannot exist here, so say that rather than only
    /// that the file cannot be read.
    fn windows_paths(&mut self, lookup: &SectionLookup<'_>, keys: &TlsKeys) -> Vec<&'static str> {
        let mut windows = Vec::new();
        for (key, path) in [
            ("SSL_CERTIFICATE", &keys.certificate),
            ("SSL_KEY", &keys.key),
            ("SSL_UPSTREAM_CA", &keys.upstream_ca),
        ] {
            if let Some(path) = path.as_deref().filter(|p| windows_only(p)) {
                windows.push(key);
                self.errors.push(at(
                    lookup,
                    key,
                    format!(
                        "`{}` is a Windows path (read as written), which cannot exist on this \
                         system: copy the file here and give its path on this machine \
                         (/etc/appbroker/...)",
                        path.display()
                    ),
                ));
            }
        }
        windows
    }

    /// Loads the balancer's TLS as it will be loaded when it starts, and returns everything
    /// found: errors, warnings and notices. The system's roots are read once per validation,
    /// on first need.
    fn doctor(&mut self, b: &BalancerConfig) -> Vec<Finding> {
        let server = b.tls.server(b.kind.is_http(), b.http.http2);
        let upstream = b.tls.upstream(b.kind.is_http());
        if server.is_none() && upstream.is_none() {
            return Vec::new();
        }
        let roots = self
            .roots
            .get_or_insert_with(crate::tls::upstream::system_roots);
        let mut findings = Vec::new();
        if let Some(settings) = server {
            let loaded = Resumption::new()
                .map_err(|e| Finding::Unexpected {
                    key: "SSL_CERTIFICATE",
                    detail: e.to_string(),
                })
                .map_err(Into::into)
                .and_then(|resumption| {
                    ServerTls::load(&settings, &resumption, &roots.store, SystemTime::now())
                });
            match loaded {
                Ok(tls) => findings.extend(tls.findings),
                Err(found) => findings.extend(found.0),
            }
        }
        if let Some(settings) = upstream {
            match UpstreamTls::load(&settings, roots) {
                Ok(tls) => findings.extend(tls.findings),
                Err(found) => findings.extend(found.0),
            }
        }
        findings
    }
}

/// An error (or notice) about `key` of `lookup`'s section, on the key's line, else the
/// section's.
fn at(lookup: &SectionLookup<'_>, key: &str, message: String) -> ConfigError {
    let line = lookup
        .find(key)
        .map_or(lookup.section.line, |(e, _)| e.line);
    ConfigError::new(line, &lookup.section.written, Some(key), message)
}

/// A path only Windows can have (`C:\...`, `\\server\share`), which cannot exist here.
fn windows_only(path: &Path) -> bool {
    let text = path.to_string_lossy();
    let drive =
        text.len() > 2 && text.as_bytes()[1] == b':' && text.as_bytes()[0].is_ascii_alphabetic();
    (drive || text.starts_with("\\\\") || text.contains('\\')) && !path.exists()
}
