//! The TLS module on certificates the tests make (rcgen): every key format, the doctor's
//! findings, and real handshakes between the broker's two sides and rustls peers over an
//! in-memory duplex or loopback sockets, with the failures each side reports.

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

// ---- key formats -------------------------------------------------------------------------

#[tokio::test]
async fn every_key_format_loads_and_serves_a_handshake() {
    let ca = Ca::new("Test Root CA");
    let rsa = ca.issue(&["broker.test"], &rcgen::PKCS_RSA_SHA256, |_| {});
    let ecdsa = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let p384 = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P384_SHA384, |_| {});
    let ed25519 = ca.issue(&["broker.test"], &rcgen::PKCS_ED25519, |_| {});
    let cases: Vec<(&str, &Leaf, String, Option<&str>)> = vec![
        ("RSA, PKCS#8", &rsa, rsa.key.serialize_pem(), None),
        ("RSA, PKCS#1", &rsa, traditional(&rsa.key), None),
        (
            "RSA, encrypted PKCS#8",
            &rsa,
            encrypted(&rsa.key, "s3cret"),
            Some("s3cret"),
        ),
        (
            "ECDSA P-256, PKCS#8",
            &ecdsa,
            ecdsa.key.serialize_pem(),
            None,
        ),
        ("ECDSA P-256, SEC1", &ecdsa, traditional(&ecdsa.key), None),
        (
            "ECDSA P-256, encrypted PKCS#8",
            &ecdsa,
            encrypted(&ecdsa.key, "s3cret"),
            Some("s3cret"),
        ),
        ("ECDSA P-384, PKCS#8", &p384, p384.key.serialize_pem(), None),
        (
            "Ed25519, PKCS#8",
            &ed25519,
            ed25519.key.serialize_pem(),
            None,
        ),
    ];
    for (what, leaf, key, passphrase) in cases {
        let files = Files::new();
        let mut settings = files.settings(&leaf.pem, &key);
        settings.passphrase = passphrase.map(Passphrase::new);
        let tls = load(&settings, &ca).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(tls.findings.is_empty(), "{what}: {:?}", tls.findings);
        let (server, client) = handshake(&tls, client(ca.roots()), "broker.test").await;
        let (server, client) = (server.unwrap(), client.unwrap());
        exchange(server, client).await;
    }
}

#[test]
fn an_encrypted_key_needs_its_passphrase() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let files = Files::new();
    let mut settings = files.settings(&leaf.pem, &encrypted(&leaf.key, "right"));
    let key = settings.key.display().to_string();

    let missing = load(&settings, &ca).unwrap_err();
    assert!(
        matches!(missing.0[..], [Finding::PassphraseMissing(_)]),
        "{missing:?}"
    );
    assert_eq!(missing.0[0].key(), "SSL_PASSPHRASE");
    assert_eq!(
        missing.to_string(),
        format!(
            "error: SSL_KEY {key}: is encrypted (ENCRYPTED PRIVATE KEY) and SSL_PASSPHRASE is \
             not set; set it to the key's passphrase"
        )
    );

    settings.passphrase = Some(Passphrase::new("wrong"));
    let wrong = load(&settings, &ca).unwrap_err();
    assert!(
        matches!(wrong.0[..], [Finding::WrongPassphrase(_)]),
        "{wrong:?}"
    );
    assert_eq!(
        wrong.to_string(),
        format!("error: SSL_KEY {key}: SSL_PASSPHRASE does not decrypt it (wrong passphrase)")
    );

    settings.passphrase = Some(Passphrase::new("right"));
    load(&settings, &ca).unwrap();
}

#[test]
fn a_passphrase_is_never_printed() {
    let settings = ServerSettings {
        certificate: "/etc/broker.pem".into(),
        key: "/etc/broker.key".into(),
        passphrase: Some(Passphrase::new("hunter2")),
        method: SslMethod::Any,
        alpn_http1: false,
    };
    let printed = format!("{settings:?} {}", Passphrase::new("hunter2"));
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(printed.contains("passphrase: Some((set))"), "{printed}");
}

#[test]
fn a_passphrase_for_a_plain_key_is_a_notice() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let files = Files::new();
    let mut settings = files.settings(&leaf.pem, &leaf.key.serialize_pem());
    settings.passphrase = Some(Passphrase::new("unused"));
    let tls = load(&settings, &ca).unwrap();
    assert!(
        matches!(tls.findings[..], [Finding::PassphraseUnused(_)]),
        "{:?}",
        tls.findings
    );
    assert_eq!(tls.findings[0].severity(), Severity::Notice);
}

/// An RSA key as `openssl rsa -aes256 -traditional` writes it: the header lines are what
/// matter, the base64 after them is never read.
const OLD_STYLE_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----
Proc-Type: 4,ENCRYPTED
DEK-Info: AES-256-CBC,0F3E1D1B6C8A4E2F9A7B5C3D1E0F2A4B

kZr1dY0m3Jv6QyJ7vU0uY2o0cZ8bq0l9P6O1w7s0uNw=
-----END RSA PRIVATE KEY-----
";

#[test]
fn an_old_openssl_encrypted_key_gets_the_command_that_converts_it() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_RSA_SHA256, |_| {});
    let files = Files::new();
    let mut settings = files.settings(&leaf.pem, OLD_STYLE_KEY);
    settings.passphrase = Some(Passphrase::new("old"));
    let err = load(&settings, &ca).unwrap_err();
    assert!(
        matches!(err.0[..], [Finding::OldStyleEncryptedKey(_)]),
        "{err:?}"
    );
    let dir = files.0.path().display();
    assert_eq!(
        err.to_string(),
        format!(
            "error: SSL_KEY {dir}/broker.key: is encrypted the old OpenSSL way (Proc-Type: \
             4,ENCRYPTED), which appbroker does not read; convert it to encrypted PKCS#8 with \
             `openssl pkcs8 -topk8 -v2 aes-256-cbc -in {dir}/broker.key -out \
             {dir}/broker.pk8.key` (it asks for the old passphrase, then the new one for \
             SSL_PASSPHRASE) and set SSL_KEY={dir}/broker.pk8.key"
        )
    );
}

#[test]
fn files_that_are_wrong_say_what_they_hold_and_what_to_do() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let files = Files::new();
    let dir = files.0.path().display().to_string();

    // Swapped: each file is told to hold the other's kind, both at once.
    let swapped = files.settings(&leaf.key.serialize_pem(), &leaf.pem);
    let err = load(&swapped, &ca).unwrap_err();
    let lines: Vec<String> = err.0.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            format!(
                "SSL_CERTIFICATE {dir}/broker.pem: holds no certificate (-----BEGIN \
                 CERTIFICATE-----); it holds PRIVATE KEY: are SSL_CERTIFICATE and SSL_KEY swapped?"
            ),
            format!(
                "SSL_KEY {dir}/broker.key: holds no private key (-----BEGIN PRIVATE KEY-----, RSA \
                 PRIVATE KEY or EC PRIVATE KEY); it holds CERTIFICATE: are SSL_CERTIFICATE and \
                 SSL_KEY swapped?"
            ),
        ]
    );

    // Missing and a directory.
    let settings = ServerSettings {
        certificate: files.0.path().join("missing.pem"),
        key: files.0.path().to_path_buf(),
        ..files.settings(&leaf.pem, &leaf.key.serialize_pem())
    };
    let err = load(&settings, &ca).unwrap_err();
    let lines: Vec<String> = err.0.iter().map(ToString::to_string).collect();
    assert!(
        lines[0].starts_with(&format!(
            "SSL_CERTIFICATE {dir}/missing.pem: cannot be read: "
        )) && lines[0].ends_with(
            "; check the path (a relative one is taken from the broker's working directory)"
        ),
        "{lines:?}"
    );
    assert_eq!(
        lines[1],
        format!("SSL_KEY {dir}: is a directory, not a file")
    );

    // DER where PEM belongs.
    let der = files.write("broker.der", leaf.der.as_ref());
    let settings = ServerSettings {
        certificate: der.clone(),
        ..files.settings(&leaf.pem, &leaf.key.serialize_pem())
    };
    let err = load(&settings, &ca).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "error: SSL_CERTIFICATE {0}: is binary (DER, or a PKCS#12 .pfx/.p12), not PEM: \
             convert it with `openssl x509 -inform der -in {0} -out cert.pem` (a DER \
             certificate) or `openssl pkcs12 -in {0} -nokeys -out cert.pem` (a .pfx)",
            der.display()
        )
    );

    // A corrupt certificate block.
    let corrupt = "-----BEGIN CERTIFICATE-----\nMIIBAAAA\n-----END CERTIFICATE-----\n";
    let err = load(&files.settings(corrupt, &leaf.key.serialize_pem()), &ca).unwrap_err();
    assert!(
        matches!(err.0[..], [Finding::BadCertificate { index: 0, .. }]),
        "{err:?}"
    );
}

#[test]
fn ssl_method_takes_the_totvs_values() {
    use rustls::ProtocolVersion::{TLSv1_2, TLSv1_3};
    let cases: [(&str, SslMethod, &[rustls::ProtocolVersion], bool); 7] = [
        ("SSL/TLS", SslMethod::Any, &[TLSv1_3, TLSv1_2], false),
        ("ssl/tls", SslMethod::Any, &[TLSv1_3, TLSv1_2], false),
        ("TLSv1.2", SslMethod::Tls12, &[TLSv1_2], false),
        ("TLSv1.3", SslMethod::Tls13, &[TLSv1_3], false),
        ("SSLv3", SslMethod::Ssl3, &[TLSv1_3, TLSv1_2], true),
        ("TLSv1", SslMethod::Tls10, &[TLSv1_3, TLSv1_2], true),
        (" TLSv1.1 ", SslMethod::Tls11, &[TLSv1_3, TLSv1_2], true),
    ];
    for (value, method, versions, notice) in cases {
        let parsed: SslMethod = value.parse().unwrap();
        assert_eq!(parsed, method, "{value}");
        let spoken: Vec<_> = parsed.versions().iter().map(|v| v.version).collect();
        assert_eq!(spoken, versions, "{value}");
        assert_eq!(parsed.notice().is_some(), notice, "{value}");
    }
    assert_eq!(
        SslMethod::Tls10.notice().unwrap(),
        "SSL_METHOD=TLSv1 asks for TLS 1.0, which is obsolete and unsafe and which appbroker \
         does not speak; TLS 1.2 and 1.3 are used instead (write SSL_METHOD=SSL/TLS to say so)"
    );
    assert_eq!(
        "TLSv2".parse::<SslMethod>().unwrap_err().to_string(),
        "`TLSv2` is not a TLS method; use SSL/TLS (TLS 1.2 and 1.3, the default), TLSv1.2 or \
         TLSv1.3"
    );
}

// ---- the doctor --------------------------------------------------------------------------

#[test]
fn a_key_that_is_not_the_certificates_refuses_the_balancer() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let other = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let files = Files::new();
    let settings = files.settings(&leaf.pem, &other.serialize_pem());
    let err = load(&settings, &ca).unwrap_err();
    assert!(err.has_errors());
    assert!(
        matches!(err.0[..], [Finding::KeyMismatch { .. }]),
        "{err:?}"
    );
    assert_eq!(
        err.0[0].to_string(),
        format!(
            "SSL_KEY {}: does not match the certificate in SSL_CERTIFICATE {}: nothing can be \
             served with them; give the key the certificate was issued for (their public keys \
             must be the same: compare `openssl x509 -noout -pubkey -in CERTIFICATE` with \
             `openssl pkey -pubout -in KEY`)",
            settings.key.display(),
            settings.certificate.display()
        )
    );
}

#[test]
fn a_client_certificate_as_the_brokers_identity_is_named_as_such() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |p| {
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    });
    let files = Files::new();
    let tls = load(&files.settings(&leaf.pem, &leaf.key.serialize_pem()), &ca).unwrap();
    assert!(matches!(
        tls.findings[..],
        [Finding::NotForServers {
            client_only: true,
            ..
        }]
    ));
    assert_eq!(tls.findings[0].severity(), Severity::Warning);
    assert_eq!(
        tls.findings[0].to_string(),
        format!(
            "SSL_CERTIFICATE {}/broker.pem: the certificate for CN=broker.test does not allow \
             TLS server authentication (extended key usage: TLS client authentication): it is a \
             client certificate used as the broker's identity; clients will refuse it: give the \
             server certificate issued for the broker's name",
            files.0.path().display()
        )
    );
    // And a real client does refuse it, as the warning says.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (server, client) = rt.block_on(handshake(&tls, client(ca.roots()), "broker.test"));
    assert!(client.is_err());
    assert_eq!(server.unwrap_err().cause, Cause::CertificateRefused);
}

#[test]
fn a_ca_certificate_as_the_brokers_identity_is_a_warning() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |p| {
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    });
    let found = diagnose(
        &identity(vec![leaf.der], &leaf.key),
        SystemTime::now(),
        &ca.roots(),
    );
    assert!(
        matches!(found[..], [Finding::CaAsIdentity { .. }]),
        "{found:?}"
    );
    assert_eq!(found[0].severity(), Severity::Warning);
}

#[test]
fn expiry_is_a_warning_never_a_refusal() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |p| {
        p.not_before = rcgen::date_time_ymd(2030, 1, 1);
        p.not_after = rcgen::date_time_ymd(2031, 1, 1);
    });
    let id = identity(vec![leaf.der.clone()], &leaf.key);
    let roots = ca.roots();
    let words = |now| {
        diagnose(&id, now, &roots)
            .iter()
            .map(|f| (f.severity(), f.to_string()))
            .collect::<Vec<_>>()
    };
    let path = "/etc/appbroker/broker.pem";
    assert_eq!(
        words(at(2031, 1, 11)),
        [(
            Severity::Warning,
            format!(
                "SSL_CERTIFICATE {path}: the certificate for CN=broker.test expired on 2031-01-01 \
                 00:00:00 UTC (10 days ago); clients will refuse it: renew it"
            )
        )]
    );
    assert_eq!(
        words(at(2030, 12, 22)),
        [(
            Severity::Warning,
            format!(
                "SSL_CERTIFICATE {path}: the certificate for CN=broker.test expires on 2031-01-01 \
                 00:00:00 UTC (in 10 days); renew it before then"
            )
        )]
    );
    assert_eq!(words(at(2030, 11, 1)), []);
    assert_eq!(
        words(at(2029, 12, 1)),
        [(
            Severity::Warning,
            format!(
                "SSL_CERTIFICATE {path}: the certificate for CN=broker.test is not valid before \
                 2030-01-01 00:00:00 UTC; clients will refuse it until then (or check this \
                 machine's clock)"
            )
        )]
    );

    // Through a load: an expired certificate still loads (one must not take every other
    // balancer down), with the warning, and METRICS gets a negative countdown.
    let files = Files::new();
    let settings = files.settings(&leaf.pem, &leaf.key.serialize_pem());
    let now = at(2031, 1, 11);
    let tls = ServerTls::load(&settings, &resumption(), &roots, now).unwrap();
    assert!(matches!(tls.findings[..], [Finding::Expired { .. }]));
    assert_eq!(tls.certificate.seconds_until_expiry(now), -10 * 86_400);
    // The daily check, on the identity in use.
    let daily = tls.diagnose(at(2030, 12, 22), &roots);
    assert!(
        matches!(daily[..], [Finding::ExpiresSoon { .. }]),
        "{daily:?}"
    );
    assert_eq!(
        tls.certificate.seconds_until_expiry(at(2030, 12, 31)),
        86_400
    );
}

/// DER of an authority-information-access extension naming where the issuer's certificate is.
fn ca_issuers(url: &str) -> rcgen::CustomExtension {
    let method = [0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x02];
    let mut location = vec![0x86, url.len() as u8];
    location.extend_from_slice(url.as_bytes());
    let mut description = vec![0x30, (method.len() + location.len()) as u8];
    description.extend_from_slice(&method);
    description.extend_from_slice(&location);
    let mut access = vec![0x30, description.len() as u8];
    access.extend_from_slice(&description);
    rcgen::CustomExtension::from_oid_content(&[1, 3, 6, 1, 5, 5, 7, 1, 1], access)
}

#[test]
fn the_chain_is_checked_for_order_and_missing_intermediates() {
    let root = Ca::new("Test Root CA");
    let intermediate = root.intermediate("Test Intermediate CA");
    let leaf = intermediate.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |p| {
        p.custom_extensions
            .push(ca_issuers("http://ca.test/intermediate.crt"));
    });
    let now = SystemTime::now();
    let kinds = |chain: Vec<CertificateDer<'static>>, trusted: &RootCertStore| {
        diagnose(&identity(chain, &leaf.key), now, trusted)
    };
    let trusted = root.roots();
    let untrusted = RootCertStore::empty();

    // Complete: leaf, intermediate, ending at a root this machine trusts.
    let full = vec![leaf.der.clone(), intermediate.der()];
    assert!(kinds(full.clone(), &trusted).is_empty());
    // The root in the file too: complete whatever is trusted.
    assert!(
        kinds(
            vec![leaf.der.clone(), intermediate.der(), root.der()],
            &untrusted
        )
        .is_empty()
    );

    // cert.pem for fullchain.pem: the intermediate is missing, and the leaf says where it is.
    let found = kinds(vec![leaf.der.clone()], &trusted);
    assert!(
        matches!(found[..], [Finding::MissingIntermediate { .. }]),
        "{found:?}"
    );
    assert_eq!(found[0].severity(), Severity::Warning);
    assert_eq!(
        found[0].to_string(),
        "SSL_CERTIFICATE /etc/appbroker/broker.pem: the chain stops at CN=broker.test, issued by \
         CN=Test Intermediate CA, which is not in the file: an intermediate certificate is \
         missing (published at http://ca.test/intermediate.crt); clients that do not have it \
         will refuse the chain: append it to the file after the certificate (a CA's \"full \
         chain\" file has it)"
    );

    // Out of order: the intermediate first, which the key is not for. An error: rustls would
    // present the intermediate as the broker's certificate.
    let found = kinds(vec![intermediate.der(), leaf.der.clone()], &trusted);
    assert!(
        matches!(found[..], [Finding::LeafNotFirst { index: 1, .. }]),
        "{found:?}"
    );
    assert_eq!(found[0].severity(), Severity::Error);
    assert_eq!(
        found[0].to_string(),
        "SSL_CERTIFICATE /etc/appbroker/broker.pem: the broker's own certificate (CN=broker.test, \
         the one SSL_KEY belongs to) is certificate 2 of the file, not the first: order the file \
         leaf first, each certificate followed by its issuer's"
    );
    // Leaf first, but then the root before the intermediate.
    let found = kinds(
        vec![leaf.der.clone(), root.der(), intermediate.der()],
        &trusted,
    );
    assert!(
        matches!(found[..], [Finding::OutOfOrder { index: 0, .. }]),
        "{found:?}"
    );
    assert_eq!(found[0].severity(), Severity::Warning);

    // A private root: complete as far as anyone here can tell; a notice, not a warning.
    let found = kinds(full, &untrusted);
    assert!(
        matches!(found[..], [Finding::PrivateIssuer { .. }]),
        "{found:?}"
    );
    assert_eq!(found[0].severity(), Severity::Notice);
    assert_eq!(
        found[0].to_string(),
        "SSL_CERTIFICATE /etc/appbroker/broker.pem: the chain stops at CN=Test Intermediate CA, \
         issued by CN=Test Root CA, which is neither in the file nor a root this machine trusts: \
         if CN=Test Root CA is an intermediate CA, append its certificate to the file; if it is \
         your own root CA, clients must trust it"
    );
}

#[test]
fn the_summary_names_the_certificate_for_the_status_page() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(
        &["broker.test", "10.1.2.3"],
        &rcgen::PKCS_ECDSA_P256_SHA256,
        |p| {
            p.not_after = rcgen::date_time_ymd(2031, 1, 1);
        },
    );
    let summary = doctor::summarize(Path::new("/etc/b.pem"), &[leaf.der]).unwrap();
    assert_eq!(summary.subject, "CN=broker.test");
    assert_eq!(summary.issuer, "CN=Test Root CA");
    assert_eq!(summary.names, ["broker.test", "10.1.2.3"]);
    assert_eq!(summary.not_after, at(2031, 1, 1));
}

// ---- handshakes towards servers -----------------------------------------------------------

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

fn connector(
    files: &Files,
    ca: Option<&Ca>,
    change: impl FnOnce(&mut UpstreamSettings),
) -> UpstreamTls {
    let mut settings = UpstreamSettings {
        ca: ca.map(|ca| files.write("upstream-ca.pem", ca.pem())),
        ..UpstreamSettings::default()
    };
    change(&mut settings);
    let no_system = SystemRoots {
        store: Arc::new(RootCertStore::empty()),
        problem: Some("none in this test".into()),
    };
    UpstreamTls::load(&settings, &no_system).unwrap()
}

#[tokio::test]
async fn upstream_verification_passes_or_says_why_not() {
    let ca = Ca::new("AppServer CA");
    let other_ca = Ca::new("Some Other CA");
    let good = ca.issue(
        &["app1.test", "127.0.0.1"],
        &rcgen::PKCS_ECDSA_P256_SHA256,
        |_| {},
    );
    let expired = ca.issue(&["app1.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |p| {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    });
    let (files, good_server) = server_with(&good);
    let (_expired_files, expired_server) = server_with(&expired);
    let trusting = connector(&files, Some(&ca), |_| {});

    // Trusted CA, by name and by IP address.
    for host in ["app1.test", "127.0.0.1"] {
        let (server, client) = upstream(&good_server, &trusting, host).await;
        exchange(server.unwrap(), client.unwrap()).await;
        assert!(trusting.warning().is_none());
    }

    let failure = |result: Result<_, HandshakeFailure>| result.expect_err("the handshake fails");

    // Wrong CA.
    let wrong_ca = connector(&files, Some(&other_ca), |_| {});
    let (server, client) = upstream(&good_server, &wrong_ca, "app1.test").await;
    let why = failure(client);
    assert_eq!(why.cause, Cause::UnknownIssuer);
    assert!(why.words.starts_with("unknown issuer"), "{why}");
    assert!(
        why.words
            .contains("(CN=app1.test, issued by CN=AppServer CA,")
            && why
                .words
                .contains("upstream-ca.pem holds CN=Some Other CA)"),
        "what the certificate is, and what was trusted: {why}"
    );
    assert_eq!(server.unwrap_err().cause, Cause::CertificateRefused);

    // Wrong name.
    let (_, client) = upstream(&good_server, &trusting, "app2.test").await;
    let why = failure(client);
    assert_eq!(why.cause, Cause::NameMismatch);
    assert_eq!(
        why.words,
        "name mismatch: certificate is for app1.test, 127.0.0.1, not app2.test (set \
         SSL_UPSTREAM_SERVER_NAME to a name it holds); the certificate is CN=app1.test, issued \
         by CN=AppServer CA"
    );
    // ... which SSL_UPSTREAM_SERVER_NAME mends for a server reached by an address.
    let named = connector(&files, Some(&ca), |s| {
        s.server_name = Some("app1.test".into())
    });
    let (server, client) = upstream(&good_server, &named, "10.9.9.9").await;
    exchange(server.unwrap(), client.unwrap()).await;

    // Expired.
    let (_, client) = upstream(&expired_server, &trusting, "app1.test").await;
    let why = failure(client);
    assert_eq!(why.cause, Cause::Expired);
    assert_eq!(
        why.words,
        "certificate expired on 2021-01-01 00:00:00 UTC: the server's certificate \
         (CN=app1.test, issued by CN=AppServer CA, for app1.test, valid until 2021-01-01 \
         00:00:00 UTC); renew it on the server"
    );

    // A server whose port does not speak TLS: it answers plain text, or just closes.
    let (mut plain, b) = tokio::io::duplex(4096);
    plain
        .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        .await
        .unwrap();
    let why = trusting.connect("app1.test", b, WITHIN).await.unwrap_err();
    assert_eq!(why.cause, Cause::NotTls, "{why}");
    assert_eq!(
        why.words,
        "not TLS: the server answered something else (does its port speak TLS? \
         SSL_ENCRYPT_UPSTREAM=1 needs it to)"
    );
    let (closing, b) = tokio::io::duplex(4096);
    drop(closing);
    let why = trusting.connect("app1.test", b, WITHIN).await.unwrap_err();
    assert_eq!(why.cause, Cause::Closed, "{why}");

    // Verification off: anything goes, and the warning says what that means.
    let blind = connector(&files, None, |s| s.verify = false);
    for server in [&good_server, &expired_server] {
        let (server, client) = upstream(server, &blind, "not-its-name.test").await;
        exchange(server.unwrap(), client.unwrap()).await;
    }
    assert!(
        blind
            .warning()
            .unwrap()
            .contains("encrypted but not authenticated")
    );
}

/// A server's own certificate as `openssl req -x509` makes it: self-signed, marked CA:TRUE,
/// no subject alternative name, `name` its CN; `tweak` has its say.
fn self_signed(name: &str, tweak: impl FnOnce(&mut CertificateParams)) -> Leaf {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = dn(name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    tweak(&mut params);
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = params.self_signed(&key).unwrap();
    Leaf {
        der: cert.der().clone(),
        pem: cert.pem(),
        key,
    }
}

/// The broker's connector trusting the PEM file `ca` (written as `name`).
fn pinning(files: &Files, name: &str, ca: &str) -> UpstreamTls {
    let path = files.write(name, ca);
    connector(files, None, |s| s.ca = Some(path))
}

/// Words a library wrote for itself, which no operator should be shown.
fn debug_strings(words: &str) -> bool {
    [
        "Other(",
        "OtherError",
        "CaUsedAsEndEntity",
        "UnknownIssuer",
        "Context {",
    ]
    .iter()
    .any(|s| words.contains(s))
}

#[tokio::test]
async fn a_servers_own_certificate_in_the_ca_file_is_pinned_dates_checked_names_not() {
    let own = self_signed("appserver", |_| {});
    let (files, own_server) = server_with(&own);
    let trusting = pinning(&files, "appserver.pem", &own.pem);

    // CA:TRUE and no name at all: trusted as it is, by whatever address the server is reached.
    for host in ["10.1.2.3", "appserver.example"] {
        let (server, client) = upstream(&own_server, &trusting, host).await;
        exchange(server.unwrap(), client.unwrap()).await;
    }
    // The doctor says so.
    let [Finding::Pinned { presented, .. }] = &trusting.findings[..] else {
        panic!("{:?}", trusting.findings);
    };
    let line = trusting.findings[0].to_string();
    assert_eq!(presented.subject, "CN=appserver");
    assert!(
        line.contains("CN=appserver, self-signed, marked CA:TRUE, no subject alternative name")
            && line.contains(
                "is pinned: a server that presents exactly this certificate is \
                              trusted as it is"
            ),
        "{line}"
    );
    assert_eq!(trusting.findings[0].severity(), Severity::Notice);
    assert_eq!(trusting.findings[0].key(), "SSL_UPSTREAM_CA");

    // Another self-signed certificate of the same name (the server's, made again): refused,
    // saying what it is and what is pinned.
    let again = self_signed("appserver", |_| {});
    let (_again_files, again_server) = server_with(&again);
    let (_, client) = upstream(&again_server, &trusting, "10.1.2.3").await;
    let why = client.expect_err("another certificate is refused");
    assert_eq!(why.cause, Cause::UnknownIssuer);
    assert!(
        why.words.starts_with(
            "not trusted: the server's certificate (CN=appserver, self-signed, marked CA:TRUE, \
             no subject alternative name, valid until"
        ) && why
            .words
            .contains("is not the certificate pinned in SSL_UPSTREAM_CA (")
            && why.words.contains("appserver.pem holds CN=appserver)")
            && why
                .words
                .ends_with("put this very certificate in SSL_UPSTREAM_CA"),
        "{why}"
    );
    assert!(!debug_strings(&why.words), "{why}");

    // A CA file that does not hold it: not trusted, in words, never webpki's
    // CaUsedAsEndEntity.
    let ca = Ca::new("AppServer CA");
    let (_, client) = upstream(&own_server, &connector(&files, Some(&ca), |_| {}), "x.test").await;
    let why = client.expect_err("not pinned there");
    assert!(why.words.starts_with("not trusted:"), "{why}");
    assert!(!debug_strings(&why.words), "{why}");
}

#[tokio::test]
async fn a_pinned_certificate_past_its_dates_is_refused_in_words() {
    let expired = self_signed("appserver", |p| {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    });
    let (files, server) = server_with(&expired);
    let trusting = pinning(&files, "appserver.pem", &expired.pem);
    let (_, client) = upstream(&server, &trusting, "10.1.2.3").await;
    let why = client.expect_err("an expired pin is refused");
    assert_eq!(why.cause, Cause::Expired);
    assert_eq!(
        why.words,
        "certificate expired on 2021-01-01 00:00:00 UTC: the certificate pinned in \
         SSL_UPSTREAM_CA (CN=appserver, self-signed, marked CA:TRUE, no subject alternative \
         name, valid until 2021-01-01 00:00:00 UTC); a pinned certificate is trusted only \
         while it is valid: make the server a new one and put it in SSL_UPSTREAM_CA in place \
         of the old"
    );
    // The doctor warns before any server is tried.
    let [Finding::PinnedExpired { .. }] = &trusting.findings[..] else {
        panic!("{:?}", trusting.findings);
    };
    assert_eq!(trusting.findings[0].severity(), Severity::Warning);
    assert!(
        trusting.findings[0]
            .to_string()
            .contains("the pinned certificate CN=appserver expired on 2021-01-01 00:00:00 UTC"),
        "{}",
        trusting.findings[0]
    );

    let future = self_signed("appserver", |p| {
        p.not_before = rcgen::date_time_ymd(4000, 1, 1);
        p.not_after = rcgen::date_time_ymd(4001, 1, 1);
    });
    let (files, server) = server_with(&future);
    let trusting = pinning(&files, "appserver.pem", &future.pem);
    let (_, client) = upstream(&server, &trusting, "10.1.2.3").await;
    let why = client.expect_err("a pin not valid yet is refused");
    assert_eq!(why.cause, Cause::NotYetValid);
    assert!(
        why.words
            .starts_with("certificate not valid before 4000-01-01 00:00:00 UTC"),
        "{why}"
    );
}

#[tokio::test]
async fn only_a_servers_own_certificate_is_said_pinned_and_a_pinned_leaf_ignores_its_names() {
    // A CA's certificate, made to sign certificates: used as a CA, no line about pinning.
    let ca = Ca::new("AppServer CA");
    let files = Files::new();
    let proper = {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = dn("Signing CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        params.self_signed(&key).unwrap().pem()
    };
    assert!(pinning(&files, "ca.pem", &proper).findings.is_empty());

    // A server certificate a CA issued, put in the file itself: pinned, whatever its names.
    let leaf = ca.issue(&["app1.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let (files, server) = server_with(&leaf);
    let trusting = pinning(&files, "app1.pem", &leaf.pem);
    assert!(
        matches!(&trusting.findings[..], [Finding::Pinned { presented, .. }] if !presented.ca),
        "{:?}",
        trusting.findings
    );
    let (server, client) = upstream(&server, &trusting, "app2.test").await;
    exchange(server.unwrap(), client.unwrap()).await;
}

#[test]
fn every_refusal_of_a_servers_certificate_is_told_in_words() {
    use rustls::{CertificateError as E, OtherError};
    let presented = Presented::read(&self_signed("appserver", |_| {}).der).unwrap();
    let trusted = Arc::new(verify::Trusted::CaFile {
        path: "/etc/appbroker/appservers.pem".into(),
        subjects: "CN=appserver2".into(),
    });
    let webpki = |e: webpki::Error| E::Other(OtherError(Arc::new(e)));
    let cases = [
        E::BadEncoding,
        E::Expired,
        E::NotValidYet,
        E::Revoked,
        E::UnknownIssuer,
        E::BadSignature,
        E::NotValidForName,
        E::InvalidPurpose,
        E::UnhandledCriticalExtension,
        E::ApplicationVerificationFailure,
        webpki(webpki::Error::CaUsedAsEndEntity),
        webpki(webpki::Error::EndEntityUsedAsCa),
        webpki(webpki::Error::PathLenConstraintViolated),
        webpki(webpki::Error::NameConstraintViolation),
        webpki(webpki::Error::UnsupportedCertVersion),
        webpki(webpki::Error::UnsupportedCriticalExtension),
    ];
    for error in cases {
        let shown = format!("{error:?}");
        let refused = verify::Refused {
            error,
            presented: Some(presented.clone()),
            pinned: false,
            trusted: Arc::clone(&trusted),
        };
        let wrapped = rustls::Error::InvalidCertificate(E::Other(OtherError(Arc::new(refused))));
        let why = HandshakeFailure::from_rustls(&wrapped, Peer::Server);
        assert!(
            why.words.contains("CN=appserver") && !debug_strings(&why.words),
            "{shown}: {why}"
        );
    }
}

#[test]
fn upstream_settings_that_cannot_work_are_refused() {
    let files = Files::new();
    let no_system = SystemRoots {
        store: Arc::new(RootCertStore::empty()),
        problem: Some("no certificates found in /etc/ssl/certs".into()),
    };
    let err = UpstreamTls::load(&UpstreamSettings::default(), &no_system).unwrap_err();
    assert!(matches!(err.0[..], [Finding::NoSystemRoots(_)]), "{err:?}");
    assert_eq!(err.0[0].key(), "SSL_UPSTREAM_VERIFY");

    let settings = UpstreamSettings {
        server_name: Some("not a name!".into()),
        ..UpstreamSettings::default()
    };
    let err = UpstreamTls::load(&settings, &no_system).unwrap_err();
    assert!(matches!(err.0[..], [Finding::BadServerName(_)]), "{err:?}");

    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let settings = UpstreamSettings {
        ca: Some(files.write("ca.pem", key.serialize_pem())),
        ..UpstreamSettings::default()
    };
    let err = UpstreamTls::load(&settings, &no_system).unwrap_err();
    assert!(
        matches!(
            err.0[..],
            [Finding::NoCertificate {
                key: "SSL_UPSTREAM_CA",
                ..
            }]
        ),
        "{err:?}"
    );
}

// ---- handshakes from clients --------------------------------------------------------------

#[tokio::test]
async fn client_failures_are_told_apart_and_blame_no_server() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let (_files, tls) = server_with(&leaf);

    // Plain text to a TLS port.
    let (mut a, b) = tokio::io::duplex(4096);
    a.write_all(b"GET /TOTVS_BROKER_QUERY/STATUS HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let why = tls.accept(b, WITHIN).await.unwrap_err();
    assert_eq!(why.cause, Cause::NotTls);
    assert!(
        why.words
            .starts_with("not TLS: the client sent something else"),
        "{why}"
    );

    // A client that does not trust the broker's certificate.
    let stranger = Ca::new("Client's Own CA");
    let (server, client) = handshake(&tls, client(stranger.roots()), "broker.test").await;
    assert!(client.is_err());
    let why = server.unwrap_err();
    assert_eq!(why.cause, Cause::CertificateRefused);
    assert!(
        why.words
            .starts_with("the client refused the broker's certificate"),
        "{why}"
    );

    // A client that closes during the handshake.
    let (a, b) = tokio::io::duplex(4096);
    drop(a);
    let why = tls.accept(b, WITHIN).await.unwrap_err();
    assert_eq!(why.cause, Cause::Closed);

    // No version in common: a TLS 1.3-only balancer, a TLS 1.2-only client.
    let files = Files::new();
    let mut settings = files.settings(&leaf.pem, &leaf.key.serialize_pem());
    settings.method = SslMethod::Tls13;
    let tls13 = load(&settings, &ca).unwrap();
    let old_client = client_speaking(ca.roots(), &rustls::version::TLS12);
    let (server, client) = handshake(&tls13, old_client, "broker.test").await;
    assert!(client.is_err());
    let why = server.unwrap_err();
    assert_eq!(why.cause, Cause::Incompatible, "{why}");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_never_finishes_the_handshake_is_timed_out() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let (_files, tls) = server_with(&leaf);
    let (_silent, b) = tokio::io::duplex(4096);
    let why = tls.accept(b, Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(why.cause, Cause::TimedOut);
    assert_eq!(
        why.words,
        "the TLS handshake with the client did not finish within 10000 ms"
    );
}

#[tokio::test]
async fn sessions_resume_and_survive_a_certificate_reload() {
    let ca = Ca::new("Test Root CA");
    let first = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    // Renewed with a key of the same type: a TLS 1.2 session is bound to its cipher suite,
    // which names the key type, so an RSA certificate after an ECDSA one starts afresh.
    let second = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let resumption = resumption();
        let files = Files::new();
        let load_with = |leaf: &Leaf, resumption: &Resumption| {
            let settings = files.settings(&leaf.pem, &leaf.key.serialize_pem());
            ServerTls::load(
                &settings,
                resumption,
                &RootCertStore::empty(),
                SystemTime::now(),
            )
            .unwrap()
        };
        let tls = load_with(&first, &resumption);
        let client = client_speaking(ca.roots(), version);
        let exchange_once = |tls: ServerTls| {
            let client = client.clone();
            async move {
                let (server, client) = handshake(&tls, client, "broker.test").await;
                let (mut server, mut client) = (server.unwrap(), client.unwrap());
                // TLS 1.3 sends its tickets after the handshake: the client takes them with
                // the first bytes it reads.
                server.write_all(b"x").await.unwrap();
                server.flush().await.unwrap();
                client.read_exact(&mut [0u8; 1]).await.unwrap();
                server.get_ref().1.handshake_kind().unwrap()
            }
        };
        assert_eq!(
            exchange_once(tls.clone()).await,
            HandshakeKind::Full,
            "{version:?}"
        );
        assert_eq!(
            exchange_once(tls.clone()).await,
            HandshakeKind::Resumed,
            "{version:?}"
        );
        // A reload with a new certificate and key, the same resumption state: still resumed.
        let reloaded = load_with(&second, &resumption);
        assert_eq!(
            exchange_once(reloaded).await,
            HandshakeKind::Resumed,
            "{version:?}"
        );
        // A balancer with resumption state of its own does not take another's sessions.
        let stranger = load_with(&first, &self::resumption());
        assert_eq!(
            exchange_once(stranger).await,
            HandshakeKind::Full,
            "{version:?}"
        );
    }
}

#[tokio::test]
async fn alpn_http1_only_where_asked() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let files = Files::new();
    let browser = client_with(ca.roots(), |c| {
        c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    });
    for (http, expected) in [(true, Some(&b"http/1.1"[..])), (false, None)] {
        let mut settings = files.settings(&leaf.pem, &leaf.key.serialize_pem());
        settings.alpn_http1 = http;
        let tls = load(&settings, &ca).unwrap();
        let (server, client) = handshake(&tls, browser.clone(), "broker.test").await;
        let (server, _client) = (server.unwrap(), client.unwrap());
        assert_eq!(
            server.get_ref().1.alpn_protocol(),
            expected,
            "alpn_http1={http}"
        );
    }
}

#[tokio::test]
async fn the_server_orders_the_cipher_suites_not_the_client() {
    use rustls::crypto::aws_lc_rs::cipher_suite::{
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    };
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let tls = load(
        &Files::new().settings(&leaf.pem, &leaf.key.serialize_pem()),
        &ca,
    )
    .unwrap();
    // A TLS 1.2 client that prefers AES-128 gets the server's first choice, AES-256.
    let mut weak_first = rustls::crypto::aws_lc_rs::default_provider();
    weak_first.cipher_suites = vec![
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ];
    let client = Arc::new(
        ClientConfig::builder_with_provider(Arc::new(weak_first))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(ca.roots())
            .with_no_client_auth(),
    );
    let (server, client) = handshake(&tls, client, "broker.test").await;
    let (server, _client) = (server.unwrap(), client.unwrap());
    assert_eq!(
        server.get_ref().1.negotiated_cipher_suite(),
        Some(TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384)
    );
}

// ---- TLS and plain on one port -------------------------------------------------------------

#[test]
fn the_first_byte_tells_tls_from_plain() {
    assert_eq!(first_byte::classify(0x16), Arrival::Tls);
    for plain in [b'G', b'P', b'H', 0x00, 0x15, 0x17, 0x80, 0xff] {
        assert_eq!(first_byte::classify(plain), Arrival::Plain, "{plain:#x}");
    }
}

#[tokio::test]
async fn peeking_leaves_the_bytes_for_whoever_takes_the_connection() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let (_files, tls) = server_with(&leaf);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let wait = Duration::from_secs(30);

    // A TLS client: peeked as TLS, then the whole handshake still works on the same socket.
    let connector = tokio_rustls::TlsConnector::from(client(ca.roots()));
    let dialing = tokio::spawn(async move {
        let tcp = TcpStream::connect(address).await.unwrap();
        let name = ServerName::try_from("broker.test").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        tls.write_all(b"over tls").await.unwrap();
        tls.shutdown().await.unwrap();
    });
    let (tcp, _) = listener.accept().await.unwrap();
    assert_eq!(first_byte::peek(&tcp, wait).await.unwrap(), Arrival::Tls);
    let mut stream = tls.accept(tcp, WITHIN).await.unwrap();
    let mut got = Vec::new();
    stream.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"over tls");
    dialing.await.unwrap();

    // A plain client: peeked as plain, its bytes all there to read.
    let mut plain = TcpStream::connect(address).await.unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let (mut tcp, _) = listener.accept().await.unwrap();
    assert_eq!(first_byte::peek(&tcp, wait).await.unwrap(), Arrival::Plain);
    let mut got = [0u8; 18];
    tcp.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"GET / HTTP/1.1\r\n\r\n");

    // A client that closes without a word.
    drop(TcpStream::connect(address).await.unwrap());
    let (tcp, _) = listener.accept().await.unwrap();
    assert_eq!(first_byte::peek(&tcp, wait).await.unwrap(), Arrival::Closed);

    // A silent client (server-first protocol): plain, after the wait.
    let _silent = TcpStream::connect(address).await.unwrap();
    let (tcp, _) = listener.accept().await.unwrap();
    assert_eq!(
        first_byte::peek(&tcp, Duration::from_millis(50))
            .await
            .unwrap(),
        Arrival::Silent
    );
}

// ---- what OpenSSL writes and how OpenSSL connects ------------------------------------------

/// Runs `openssl` with `args` in `dir`; panics with its error output when it fails.
fn openssl(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command a finding tells the operator to run, as written between backquotes.
fn command_in(finding: &Finding) -> Vec<String> {
    let text = finding.to_string();
    let start = text.find('`').expect("a command in backquotes") + 1;
    let end = start + text[start..].find('`').expect("its closing backquote");
    text[start..end].split(' ').map(str::to_string).collect()
}

#[test]
#[ignore = "needs openssl (apt-get install openssl)"]
fn keys_as_openssl_writes_them_load_and_the_advised_commands_work() {
    let ca = Ca::new("Test Root CA");
    let rsa = ca.issue(&["broker.test"], &rcgen::PKCS_RSA_SHA256, |_| {});
    let ecdsa = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let files = Files::new();
    let dir = files.0.path();
    files.write("rsa.pk8", rsa.key.serialize_pem());
    files.write("ec.pk8", ecdsa.key.serialize_pem());
    openssl(
        dir,
        &[
            "pkey",
            "-in",
            "rsa.pk8",
            "-traditional",
            "-out",
            "rsa.pkcs1",
        ],
    );
    openssl(dir, &["ec", "-in", "ec.pk8", "-out", "ec.sec1"]);
    for (input, output, scheme) in [
        ("rsa.pk8", "rsa.aes", &["-v2", "aes-256-cbc"][..]),
        ("rsa.pk8", "rsa.scrypt", &["-scrypt"][..]),
        ("ec.pk8", "ec.aes", &["-v2", "aes-128-cbc"][..]),
    ] {
        let mut args = vec!["pkcs8", "-topk8", "-in", input, "-out", output];
        args.extend_from_slice(scheme);
        args.extend_from_slice(&["-passout", "pass:s3cret"]);
        openssl(dir, &args);
    }
    for (leaf, key, passphrase) in [
        (&rsa, "rsa.pkcs1", None),
        (&rsa, "rsa.aes", Some("s3cret")),
        (&rsa, "rsa.scrypt", Some("s3cret")),
        (&ecdsa, "ec.sec1", None),
        (&ecdsa, "ec.aes", Some("s3cret")),
    ] {
        let text = std::fs::read_to_string(dir.join(key)).unwrap();
        let mut settings = files.settings(&leaf.pem, &text);
        settings.passphrase = passphrase.map(Passphrase::new);
        let tls = load(&settings, &ca).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(tls.findings.is_empty(), "{key}: {:?}", tls.findings);
    }

    // The old OpenSSL encryption: the command in the message converts it, and the result loads.
    openssl(
        dir,
        &[
            "rsa",
            "-in",
            "rsa.pk8",
            "-aes256",
            "-traditional",
            "-passout",
            "pass:old",
            "-out",
            "old.key",
        ],
    );
    let settings = ServerSettings {
        passphrase: Some(Passphrase::new("old")),
        ..files.settings(
            &rsa.pem,
            &std::fs::read_to_string(dir.join("old.key")).unwrap(),
        )
    };
    let err = load(&settings, &ca).unwrap_err();
    let command = command_in(&err.0[0]);
    assert_eq!(command[..3], ["openssl", "pkcs8", "-topk8"]);
    let mut args: Vec<&str> = command[1..].iter().map(String::as_str).collect();
    args.extend_from_slice(&["-passin", "pass:old", "-passout", "pass:new"]);
    openssl(dir, &args);
    let converted = settings.key.with_file_name("broker.pk8.key");
    let settings = ServerSettings {
        key: converted,
        passphrase: Some(Passphrase::new("new")),
        ..settings
    };
    load(&settings, &ca).unwrap();

    // A DER certificate: the command in the message makes the PEM that loads.
    let der = files.write("broker.der", rsa.der.as_ref());
    let settings = ServerSettings {
        certificate: der,
        ..files.settings(&rsa.pem, &rsa.key.serialize_pem())
    };
    let err = load(&settings, &ca).unwrap_err();
    let command = command_in(&err.0[0]);
    let args: Vec<&str> = command[1..].iter().map(String::as_str).collect();
    openssl(dir, &args);
    let settings = ServerSettings {
        certificate: dir.join("cert.pem"),
        ..settings
    };
    load(&settings, &ca).unwrap();
}

#[test]
#[ignore = "needs openssl (apt-get install openssl)"]
fn openssl_s_client_verifies_the_chain_and_resumes_its_session() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let root = Ca::new("Test Root CA");
    let intermediate = root.intermediate("Test Intermediate CA");
    let leaf = intermediate.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let files = Files::new();
    let settings = files.settings(
        &format!("{}{}", leaf.pem, intermediate.pem()),
        &leaf.key.serialize_pem(),
    );
    let tls = load(&settings, &root).unwrap();
    assert!(tls.findings.is_empty(), "{:?}", tls.findings);
    files.write("root.pem", root.pem());

    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    // Each connection: handshake, a line, close; what the handshake was comes back.
    let (kinds, mut seen) = tokio::sync::mpsc::unbounded_channel();
    rt.spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut stream = tls.accept(tcp, WITHIN).await.unwrap();
            stream.write_all(b"hello from appbroker\n").await.unwrap();
            stream.shutdown().await.unwrap();
            let kind = stream.get_ref().1.handshake_kind().unwrap();
            let _ = kinds.send(kind);
        }
    });
    let connect = |session: &str| {
        openssl(
            files.0.path(),
            &[
                "s_client",
                "-connect",
                &format!("127.0.0.1:{port}"),
                "-servername",
                "broker.test",
                "-verify_hostname",
                "broker.test",
                "-CAfile",
                "root.pem",
                "-verify_return_error",
                "-ign_eof",
                session,
                "sess.pem",
            ],
        )
    };
    let first = connect("-sess_out");
    assert!(first.contains("Verify return code: 0 (ok)"), "{first}");
    assert!(first.contains("hello from appbroker"), "{first}");
    assert_eq!(rt.block_on(seen.recv()), Some(HandshakeKind::Full));
    let second = connect("-sess_in");
    assert!(second.contains("Reused, TLSv1.3"), "{second}");
    assert_eq!(rt.block_on(seen.recv()), Some(HandshakeKind::Resumed));
}

#[test]
fn the_system_roots_are_read_where_debian_keeps_them() {
    let roots = upstream::system_roots();
    if Path::new("/etc/ssl/certs/ca-certificates.crt").exists() {
        assert!(
            roots.store.len() > 10,
            "{} roots, {:?}",
            roots.store.len(),
            roots.problem
        );
        assert_eq!(roots.problem, None);
    } else {
        assert!(
            roots.store.is_empty() && roots.problem.is_some(),
            "{roots:?}"
        );
    }
}
