//! The TLS module on certificates the tests make (rcgen): every key format, the doctor's
//! findings, and real handshakes between the broker's two sides and rustls peers over an
//! in-memory duplex or loopback sockets, with the failures each side reports. This file holds
//! what they share (a CA that issues, files in a temporary directory, clients, handshakes);
//! the tests are grouped by what they test:
//!
//! - `loading`: a certificate and key loaded, in every format, and files that are wrong.
//! - `findings`: the doctor's findings on a loaded identity.
//! - `towards_servers`: handshakes towards servers, verification and its refusals in words.
//! - `from_clients`: handshakes from clients, their failures, resumption, ALPN, cipher order.
//! - `same_port`: TLS and plain on one port, told apart by the first byte.
//! - `openssl`: what the `openssl` command writes and how it connects (ignored by default).

mod findings;
mod from_clients;
mod loading;
mod openssl;
mod same_port;
mod towards_servers;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SignatureAlgorithm,
};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpListener, TcpStream};

use super::doctor::{Identity, diagnose};
use super::files::Passphrase;
use super::upstream::SystemRoots;
use super::*;

/// Generous: only a broken handshake ever waits this long, and then the test fails anyway.
const WITHIN: Duration = Duration::from_secs(30);

/// A certificate authority the tests issue from.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    /// An intermediate CA issued by this one.
    fn intermediate(&self, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        Ca {
            issuer: CertifiedIssuer::signed_by(params, key, &self.issuer).unwrap(),
        }
    }

    fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.der()).unwrap();
        roots
    }

    /// A server certificate for `names` (DNS names or IP addresses), with the key of
    /// `algorithm`, after `tweak` has had its say on the parameters.
    fn issue(
        &self,
        names: &[&str],
        algorithm: &'static SignatureAlgorithm,
        tweak: impl FnOnce(&mut CertificateParams),
    ) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = dn(names.first().copied().unwrap_or("leaf"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        tweak(&mut params);
        let key = KeyPair::generate_for(algorithm).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            der: cert.der().clone(),
            pem: cert.pem(),
            key,
        }
    }
}

/// A leaf certificate and its key.
struct Leaf {
    der: CertificateDer<'static>,
    pem: String,
    key: KeyPair,
}

fn dn(common_name: &str) -> rcgen::DistinguishedName {
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// A directory of files for one test.
struct Files(tempfile::TempDir);

impl Files {
    fn new() -> Files {
        Files(tempfile::tempdir().unwrap())
    }

    fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// Settings for a balancer serving `chain` (PEM) with `key` (PEM).
    fn settings(&self, chain: &str, key: &str) -> ServerSettings {
        ServerSettings {
            certificate: self.write("broker.pem", chain),
            key: self.write("broker.key", key),
            passphrase: None,
            method: SslMethod::Any,
            alpn_http1: false,
            alpn_h2: false,
        }
    }
}

fn pem(label: &'static str, der: &[u8]) -> String {
    pkcs8::der::pem::encode_string(label, pkcs8::der::pem::LineEnding::LF, der).unwrap()
}

/// The PKCS#1 (RSA) or SEC1 (EC) key inside a PKCS#8 one, as `openssl pkey -traditional`
/// writes it (SEC1 with its curve named, as OpenSSL does).
fn traditional(key: &KeyPair) -> String {
    let der = key.serialize_der();
    let info = pkcs8::PrivateKeyInfo::try_from(der.as_slice()).unwrap();
    if key.algorithm() == &rcgen::PKCS_RSA_SHA256 {
        return pem("RSA PRIVATE KEY", info.private_key);
    }
    // ECPrivateKey ::= SEQUENCE { version, privateKey, [0] parameters OPTIONAL, [1] publicKey }
    // rcgen (like ring) leaves out the parameters: put prime256v1's in after the private key.
    let inner = info.private_key;
    let (body_start, body_len) = match inner[1] {
        n if n < 0x80 => (2, usize::from(n)),
        0x81 => (3, usize::from(inner[2])),
        other => panic!("unexpected SEC1 length byte {other:#x}"),
    };
    let body = &inner[body_start..body_start + body_len];
    // version (3 bytes: 02 01 01), then privateKey (04 20 + 32 bytes)
    let split = 3 + 2 + 32;
    let curve = [
        0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ];
    let mut new_body = body[..split].to_vec();
    new_body.extend_from_slice(&curve);
    new_body.extend_from_slice(&body[split..]);
    let mut sec1 = vec![0x30];
    if new_body.len() < 0x80 {
        sec1.push(new_body.len() as u8);
    } else {
        sec1.extend_from_slice(&[0x81, new_body.len() as u8]);
    }
    sec1.extend_from_slice(&new_body);
    pem("EC PRIVATE KEY", &sec1)
}

/// The key as encrypted PKCS#8 (PBES2: PBKDF2-SHA256 and AES-256-CBC, what `openssl pkcs8
/// -topk8` writes).
fn encrypted(key: &KeyPair, passphrase: &str) -> String {
    let der = key.serialize_der();
    let info = pkcs8::PrivateKeyInfo::try_from(der.as_slice()).unwrap();
    let params =
        pkcs8::pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(2048, b"salt5678", &[7; 16])
            .unwrap();
    let doc = info.encrypt_with_params(params, passphrase).unwrap();
    pem("ENCRYPTED PRIVATE KEY", doc.as_bytes())
}

fn resumption() -> Resumption {
    Resumption::new().unwrap()
}

/// Loads a balancer's TLS, on a machine that trusts `ca`.
fn load(settings: &ServerSettings, ca: &Ca) -> Result<ServerTls, Findings> {
    ServerTls::load(settings, &resumption(), &ca.roots(), SystemTime::now())
}

/// A rustls client trusting `roots`, resuming sessions.
fn client(roots: RootCertStore) -> Arc<ClientConfig> {
    Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A rustls client speaking only `version`.
fn client_speaking(
    roots: RootCertStore,
    version: &'static rustls::SupportedProtocolVersion,
) -> Arc<ClientConfig> {
    Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn client_with(roots: RootCertStore, change: impl FnOnce(&mut ClientConfig)) -> Arc<ClientConfig> {
    let mut config = Arc::unwrap_or_clone(client(roots));
    change(&mut config);
    Arc::new(config)
}

type ServerSide = Result<tokio_rustls::server::TlsStream<DuplexStream>, HandshakeFailure>;
type ClientSide = std::io::Result<tokio_rustls::client::TlsStream<DuplexStream>>;

/// A handshake between the broker's acceptor and a rustls client connecting to `name`.
async fn handshake(
    server: &ServerTls,
    client: Arc<ClientConfig>,
    name: &str,
) -> (ServerSide, ClientSide) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let name = ServerName::try_from(name.to_string()).unwrap();
    let connector = tokio_rustls::TlsConnector::from(client);
    tokio::join!(server.accept(a, WITHIN), connector.connect(name, b))
}

/// A handshake between the broker's connector, reaching a server as `host`, and the
/// broker's acceptor standing in for the server.
async fn upstream(
    server: &ServerTls,
    upstream: &UpstreamTls,
    host: &str,
) -> (
    ServerSide,
    Result<tokio_rustls::client::TlsStream<DuplexStream>, HandshakeFailure>,
) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    tokio::join!(server.accept(a, WITHIN), upstream.connect(host, b, WITHIN))
}

/// Bytes both ways over an established pair, and a close seen at the other end.
async fn exchange<A, B>(mut server: A, mut client: B)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    client.write_all(b"ping").await.unwrap();
    client.flush().await.unwrap();
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    server.write_all(b"pong").await.unwrap();
    server.flush().await.unwrap();
    client.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"pong");
    client.shutdown().await.unwrap();
    assert_eq!(
        server.read(&mut buf).await.unwrap(),
        0,
        "the close reaches the server"
    );
}

fn at(year: i32, month: u8, day: u8) -> SystemTime {
    let t = rcgen::date_time_ymd(year, month, day);
    UNIX_EPOCH + Duration::from_secs(t.unix_timestamp() as u64)
}

fn identity(chain: Vec<CertificateDer<'static>>, key: &KeyPair) -> Identity {
    let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    let signer = provider().key_provider.load_private_key(der).unwrap();
    Identity {
        certificate_path: PathBuf::from("/etc/appbroker/broker.pem"),
        key_path: PathBuf::from("/etc/appbroker/broker.key"),
        certified: Arc::new(rustls::sign::CertifiedKey::new(chain, signer)),
    }
}

/// The broker's acceptor as a stand-in server with `leaf`.
fn server_with(leaf: &Leaf) -> (Files, ServerTls) {
    let files = Files::new();
    let tls = ServerTls::load(
        &files.settings(&leaf.pem, &leaf.key.serialize_pem()),
        &resumption(),
        &RootCertStore::empty(),
        SystemTime::now(),
    )
    .unwrap();
    (files, tls)
}
