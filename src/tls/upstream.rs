//! The connector side, `SSL_ENCRYPT_UPSTREAM=1`: TLS towards the servers, for clients' traffic
//! (TCP and HTTP balancers alike) and the monitor's checks. The servers' certificates are
//! verified ([`PinnedOrIssued`]): one of `SSL_UPSTREAM_CA`'s own certificates is trusted as
//! it is (pinned), any other must chain to a CA there, or to the system's roots, for the name
//! it is reached by or `SSL_UPSTREAM_SERVER_NAME`; with `SSL_UPSTREAM_VERIFY=0` they are not
//! verified at all ([`AcceptAnyServerCertificate`]), and [`UpstreamTls::warning`] says so.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::doctor::{self, Finding, Findings};
use super::failure::{Cause, HandshakeFailure, Peer};
use super::verify::PinnedOrIssued;
use super::{ALPN_HTTP1, SslMethod, files, provider};

/// What a balancer's TLS towards its servers is built from: its `SSL_*UPSTREAM*` keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSettings {
    /// `SSL_UPSTREAM_VERIFY` (default on).
    pub verify: bool,
    /// `SSL_UPSTREAM_CA`: the CAs trusted for the servers, and servers' own certificates,
    /// pinned (default: the system's roots).
    pub ca: Option<PathBuf>,
    /// `SSL_UPSTREAM_SERVER_NAME`: the name to verify (and send as SNI) instead of each
    /// server's address, for servers addressed by IP.
    pub server_name: Option<String>,
    /// `SSL_METHOD`.
    pub method: SslMethod,
    /// Offer ALPN `http/1.1` (an HTTP balancer).
    pub alpn_http1: bool,
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        UpstreamSettings {
            verify: true,
            ca: None,
            server_name: None,
            method: SslMethod::default(),
            alpn_http1: false,
        }
    }
}

/// The roots this machine trusts (Debian: /etc/ssl/certs, from ca-certificates), read once per
/// load: for verifying servers when `SSL_UPSTREAM_CA` is not set, and for the doctor's chain
/// check.
#[derive(Debug, Clone)]
pub struct SystemRoots {
    /// The roots found (possibly none).
    pub store: Arc<RootCertStore>,
    /// Why none could be read, when none could.
    pub problem: Option<String>,
}

/// Reads the system's trusted roots.
pub fn system_roots() -> SystemRoots {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (added, _ignored) = store.add_parsable_certificates(found.certs);
    let problem = (added == 0).then(|| match found.errors.first() {
        Some(e) => e.to_string(),
        None => "no certificate found in the system's store".to_string(),
    });
    SystemRoots {
        store: Arc::new(store),
        problem,
    }
}

/// A balancer's TLS towards its servers, ready to connect.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    /// What the doctor found in `SSL_UPSTREAM_CA` that did not stop the load (certificates
    /// pinned, a pinned one expired): logged at start and on reload, printed by `--check`.
    pub findings: Vec<Finding>,
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
    verified: bool,
}

impl UpstreamTls {
    /// Builds the connector: reads `SSL_UPSTREAM_CA` when set, else uses `system`.
    pub fn load(
        settings: &UpstreamSettings,
        system: &SystemRoots,
    ) -> Result<UpstreamTls, Findings> {
        let server_name = match &settings.server_name {
            Some(name) => Some(
                ServerName::try_from(name.trim().to_string())
                    .map_err(|_| Finding::BadServerName(name.clone()))?,
            ),
            None => None,
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(settings.method.versions())
            .map_err(|e| Finding::Unexpected {
                key: "SSL_METHOD",
                detail: e.to_string(),
            })?;
        let mut findings = Vec::new();
        let mut config = if settings.verify {
            let (roots, pinned) = match &settings.ca {
                Some(path) => {
                    let (roots, certificates) = ca_bundle(path)?;
                    findings = doctor::pinned(path, &certificates, SystemTime::now());
                    (Arc::new(roots), Some((path.as_path(), certificates)))
                }
                None if system.store.is_empty() => {
                    return Err(
                        Finding::NoSystemRoots(system.problem.clone().unwrap_or_default()).into(),
                    );
                }
                None => (system.store.clone(), None),
            };
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| Finding::Unexpected {
                    key: "SSL_UPSTREAM_CA",
                    detail: e.to_string(),
                })?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedOrIssued::new(webpki, pinned)))
                .with_no_client_auth()
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCertificate(provider())))
                .with_no_client_auth()
        };
        if settings.alpn_http1 {
            config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        }
        Ok(UpstreamTls {
            findings,
            config: Arc::new(config),
            server_name,
            verified: settings.verify,
        })
    }

    /// What the start-up log and the status page say when the servers are not authenticated
    /// (`SSL_UPSTREAM_VERIFY=0`); `None` when they are.
    pub fn warning(&self) -> Option<&'static str> {
        (!self.verified).then_some(
            "SSL_UPSTREAM_VERIFY=0: the servers' certificates are not verified; the connections \
             to them are encrypted but not authenticated, so anyone on the network path can pose \
             as a server",
        )
    }

    /// The name a server's certificate must hold: `SSL_UPSTREAM_SERVER_NAME`, or the host it
    /// is reached by (a DNS name, or an IP address matched against the certificate's IP
    /// addresses).
    pub fn server_name(&self, host: &str) -> Result<ServerName<'static>, HandshakeFailure> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        ServerName::try_from(host.to_string()).map_err(|_| HandshakeFailure {
            cause: Cause::NameMismatch,
            words: format!(
                "`{host}` cannot be checked against a certificate (neither a DNS name nor an IP \
                 address); set SSL_UPSTREAM_SERVER_NAME"
            ),
        })
    }

    /// The TLS handshake with the server reached as `host` over `stream`, bounded by `within`.
    /// A failure quarantines the server, its words the reason.
    pub async fn connect<S>(
        &self,
        host: &str,
        stream: S,
        within: Duration,
    ) -> Result<TlsStream<S>, HandshakeFailure>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let name = self.server_name(host)?;
        let handshake = TlsConnector::from(self.config.clone()).connect(name, stream);
        match tokio::time::timeout(within, handshake).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(HandshakeFailure::from_io(&e, Peer::Server)),
            Err(_) => Err(HandshakeFailure::timed_out(within, Peer::Server)),
        }
    }
}

/// The roots of an `SSL_UPSTREAM_CA` bundle, and its certificates (each pinned too).
fn ca_bundle(
    path: &std::path::Path,
) -> Result<(RootCertStore, Vec<CertificateDer<'static>>), Finding> {
    const KEY: &str = "SSL_UPSTREAM_CA";
    let certs = files::read(KEY, path).and_then(|pem| files::certificates(KEY, path, &pem))?;
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(certs.iter().cloned());
    if added == 0 {
        return Err(Finding::UnusableCa {
            path: path.to_path_buf(),
            detail: format!("{ignored} certificate(s) refused"),
        });
    }
    Ok((roots, certs))
}

/// `SSL_UPSTREAM_VERIFY=0`: accepts any certificate for any name. The handshake's signatures
/// are still checked against the certificate presented, which proves only that the server holds
/// that certificate's key, not who it is.
#[derive(Debug)]
pub struct AcceptAnyServerCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
