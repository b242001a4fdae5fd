//! The acceptor side: a balancer's identity towards its clients. [`ServerTls::load`] reads the
//! certificate and key, runs the doctor, and builds the rustls configuration that every new
//! handshake uses; a reload builds a new one and swaps it in, and connections already
//! established keep theirs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::RootCertStore;
use rustls::server::{
    ProducesTickets, ServerConfig, ServerSessionMemoryCache, StoresServerSessions,
};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::doctor::{self, CertificateSummary, Finding, Findings, Identity};
use super::failure::{HandshakeFailure, Peer};
use super::files::{self, Passphrase};
use super::{ALPN_H2, ALPN_HTTP1, SslMethod, provider};

/// Sessions remembered for TLS 1.2 clients that resume by session id rather than by ticket:
/// HAProxy's default (`tune.ssl.cachesize`). An entry is a few hundred bytes.
pub const SESSION_CACHE_ENTRIES: usize = 20_000;

/// What a balancer's TLS listener is built from: its `SSL_*` keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    /// `SSL_CERTIFICATE`: the chain, leaf first.
    pub certificate: PathBuf,
    /// `SSL_KEY`.
    pub key: PathBuf,
    /// `SSL_PASSPHRASE`, for an encrypted PKCS#8 key (`None` when unset or empty).
    pub passphrase: Option<Passphrase>,
    /// `SSL_METHOD`.
    pub method: SslMethod,
    /// Offer ALPN `http/1.1` (an HTTP balancer). A TCP balancer offers no protocol, so a
    /// client asking for one (a browser on the query interface) falls back to none.
    pub alpn_http1: bool,
    /// Offer ALPN `h2` first, before `http/1.1` (an HTTP balancer with `HTTP2`): a client
    /// that speaks both is served HTTP/2.
    pub alpn_h2: bool,
}

/// Session resumption state for one balancer: the key that encrypts its session tickets and
/// its session cache. Made once and handed to every [`ServerTls::load`] of the balancer, so
/// clients resume across reloads and certificate swaps instead of all paying a full handshake
/// at once.
#[derive(Clone)]
pub struct Resumption {
    ticketer: Arc<dyn ProducesTickets>,
    cache: Arc<dyn StoresServerSessions>,
}

impl Resumption {
    /// A fresh ticket key (rotated by rustls every six hours, the previous one still accepted)
    /// and an empty cache of [`SESSION_CACHE_ENTRIES`].
    pub fn new() -> Result<Self, rustls::Error> {
        Ok(Resumption {
            ticketer: rustls::crypto::aws_lc_rs::Ticketer::new()?,
            cache: ServerSessionMemoryCache::new(SESSION_CACHE_ENTRIES),
        })
    }
}

impl std::fmt::Debug for Resumption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resumption")
    }
}

/// A balancer's TLS towards its clients, ready to accept.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// Shared by every handshake made with this generation of the configuration.
    pub config: Arc<ServerConfig>,
    /// The certificate, for the status page and METRICS.
    pub certificate: CertificateSummary,
    /// What the doctor found that did not stop the load (warnings, notices): logged at start
    /// and on reload, printed by `--check`.
    pub findings: Vec<Finding>,
    /// The chain and key in use, for [`ServerTls::diagnose`].
    identity: Identity,
}

impl ServerTls {
    /// Reads the certificate and key, diagnoses them at `now` (against `trusted`, the roots
    /// this machine trusts: [`super::upstream::system_roots`]), and builds the configuration.
    ///
    /// Fails with every finding (errors first) when any is an error: a file that does not
    /// load, a key that is not the certificate's. The caller refuses the balancer at start, or
    /// the whole reload, and keeps what it had.
    pub fn load(
        settings: &ServerSettings,
        resumption: &Resumption,
        trusted: &RootCertStore,
        now: SystemTime,
    ) -> Result<ServerTls, Findings> {
        let identity = load_identity(settings)?;
        let mut findings = identity.notices;
        findings.extend(doctor::diagnose(&identity.identity, now, trusted));
        findings.sort_by_key(|f| std::cmp::Reverse(f.severity()));
        let findings = Findings(findings);
        if findings.has_errors() {
            return Err(findings);
        }
        let Findings(findings) = findings;
        let identity = identity.identity;
        // Neither can fail: the chain's certificates were parsed when read, and the provider
        // has cipher suites for every version an SslMethod names.
        let certificate = doctor::summarize(&settings.certificate, &identity.certified.cert)
            .ok_or_else(|| Finding::Unexpected {
                key: "SSL_CERTIFICATE",
                detail: "the leaf certificate cannot be parsed".into(),
            })?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(settings.method.versions())
            .map_err(|e| Finding::Unexpected {
                key: "SSL_METHOD",
                detail: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(SingleCertAndKey::from(identity.certified.clone())));
        config.ticketer = resumption.ticketer.clone();
        config.session_storage = resumption.cache.clone();
        // The server's order of cipher suites, not the client's: the strongest suite both
        // speak, whatever a client lists first (testssl.sh rates a server without its own
        // order HIGH).
        config.ignore_client_order = true;
        if settings.alpn_http1 {
            config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
            if settings.alpn_h2 {
                config.alpn_protocols.insert(0, ALPN_H2.to_vec());
            }
        }
        Ok(ServerTls {
            config: Arc::new(config),
            certificate,
            findings,
            identity,
        })
    }

    /// The doctor again, at `now`, on the certificate and key in use: for the daily line in
    /// the log about a certificate that expires soon or has expired (told every day, not only
    /// at start and reload).
    pub fn diagnose(&self, now: SystemTime, trusted: &RootCertStore) -> Vec<Finding> {
        doctor::diagnose(&self.identity, now, trusted)
    }

    /// The TLS handshake with a client, bounded by `within` (a client that connects and sends
    /// nothing must not hold its descriptor for ever). The failure says why in words and
    /// never blames a server.
    pub async fn accept<S>(
        &self,
        stream: S,
        within: Duration,
    ) -> Result<TlsStream<S>, HandshakeFailure>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let handshake = TlsAcceptor::from(self.config.clone()).accept(stream);
        match tokio::time::timeout(within, handshake).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(HandshakeFailure::from_io(&e, Peer::Client)),
            Err(_) => Err(HandshakeFailure::timed_out(within, Peer::Client)),
        }
    }
}

/// A loaded identity and the notices its loading raised.
struct LoadedIdentity {
    identity: Identity,
    notices: Vec<Finding>,
}

/// Reads certificate and key; both files' errors are reported together.
fn load_identity(settings: &ServerSettings) -> Result<LoadedIdentity, Findings> {
    let chain = files::read("SSL_CERTIFICATE", &settings.certificate)
        .and_then(|pem| files::certificates("SSL_CERTIFICATE", &settings.certificate, &pem));
    let key = files::read("SSL_KEY", &settings.key)
        .and_then(|pem| files::private_key(&settings.key, &pem, settings.passphrase.as_ref()))
        .and_then(|key| {
            let encrypted = key.encrypted;
            provider()
                .key_provider
                .load_private_key(key.der)
                .map(|signer| (signer, encrypted))
                .map_err(|e| Finding::UnusableKey {
                    path: settings.key.clone(),
                    detail: e.to_string(),
                })
        });
    let ((signer, encrypted), chain) = match (key, chain) {
        (Ok(key), Ok(chain)) => (key, chain),
        (key, chain) => {
            return Err(Findings(
                [chain.err(), key.err()].into_iter().flatten().collect(),
            ));
        }
    };
    let mut notices = Vec::new();
    if settings.passphrase.is_some() && !encrypted {
        notices.push(Finding::PassphraseUnused(settings.key.clone()));
    }
    Ok(LoadedIdentity {
        identity: Identity {
            certificate_path: settings.certificate.clone(),
            key_path: settings.key.clone(),
            certified: Arc::new(CertifiedKey::new(chain, signer)),
        },
        notices,
    })
}
