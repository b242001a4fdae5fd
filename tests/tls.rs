//! TLS through the broker on real loopback sockets, with certificates the tests make (rcgen):
//! a TLS listener relaying to plain servers, the query interface over TLS, plain bytes on a TLS
//! port, the same-port mode, TLS towards servers with verification (trusted CA, wrong CA,
//! wrong name, expired, verification off), a certificate swapped by a reload under load with
//! no failed exchange, a certificate that does not load rejecting the reload, the doctor
//! through the binary's `--check`, and clients no one here wrote: `openssl s_client`, `curl`,
//! headless Chromium; a PROXY protocol header read before the handshake; and the page of
//! actions offered over TLS to a peer off loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use harness::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// A certificate authority the tests issue from.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate (PEM) and its key (PEM).
struct Leaf {
    der: CertificateDer<'static>,
    pem: String,
    key: String,
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

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        roots
    }

    /// A server certificate for `names`, after `tweak` has had its say.
    fn issue(&self, names: &[&str], tweak: impl FnOnce(&mut CertificateParams)) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = dn(names[0]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        tweak(&mut params);
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            der: cert.der().clone(),
            pem: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// The broker's certificate: for `localhost` and 127.0.0.1.
    fn broker_leaf(&self) -> Leaf {
        self.issue(&["localhost", "127.0.0.1"], |_| {})
    }
}

fn dn(common_name: &str) -> rcgen::DistinguishedName {
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Files for one test, in a directory of its own.
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

    /// `leaf` as `broker.pem` and `broker.key`; the section lines that serve it.
    fn serve(&self, leaf: &Leaf) -> String {
        let cert = self.write("broker.pem", &leaf.pem);
        let key = self.write("broker.key", &leaf.key);
        format!(
            "SSL_CERTIFICATE={}\nSSL_KEY={}\nQUERY_ALLOW=127.0.0.1\n",
            cert.display(),
            key.display()
        )
    }
}

/// A rustls client trusting `roots`.
fn client_config(roots: RootCertStore) -> Arc<ClientConfig> {
    Arc::new(
        ClientConfig::builder_with_provider(appbroker::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS connection to the broker at `addr`, verified as `localhost`.
async fn tls_connect(
    config: &Arc<ClientConfig>,
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    within(
        "a TLS handshake",
        TlsConnector::from(Arc::clone(config)).connect(name, tcp),
    )
    .await
}

/// Sends `line` and returns the server name of the echo (`<name>: <line>`).
async fn echo<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, line: &str) -> String {
    stream
        .write_all(format!("{line}\n").as_bytes())
        .await
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut reply = String::new();
    within("an echo", reader.read_line(&mut reply))
        .await
        .unwrap();
    let reply = reply.trim_end();
    let tail = format!(": {line}");
    assert!(reply.ends_with(&tail), "{reply:?} does not echo {line:?}");
    reply[..reply.len() - tail.len()].to_string()
}

/// An HTTP/1.0 GET of `path` over `stream`; the whole response.
async fn get<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, path: &str) -> String {
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = Vec::new();
    within(
        "the response",
        tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut response),
    )
    .await
    .ok();
    String::from_utf8_lossy(&response).into_owned()
}

/// Sends `bytes` in plain text to `addr` and reads until the broker closes; what came back
/// (`None`: the connection was reset, our bytes still unread).
async fn plain_until_closed(addr: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut plain = TcpStream::connect(addr).await.unwrap();
    let _ = plain.write_all(bytes).await;
    let mut got = Vec::new();
    within(
        "the broker to close",
        tokio::io::AsyncReadExt::read_to_end(&mut plain, &mut got),
    )
    .await
    .ok()
    .map(|_| got)
}

/// A configuration of one balancer over one server at `port`, with `extra` lines (its
/// `SSL_*` keys among them).
fn tls_ini(port: u16, extra: &str) -> String {
    format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\n{extra}REMOTE_SERVER_01=127.0.0.1 {port}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_balancer_relays_and_answers_queries_over_tls() {
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let server = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&server], &files.serve(&ca.broker_leaf()))).await;
    let config = client_config(ca.roots());

    let mut stream = tls_connect(&config, broker.addr()).await.unwrap();
    assert_eq!(echo(&mut stream, "hello over tls").await, "a");
    assert_eq!(echo(&mut stream, "and again").await, "a");
    drop(stream);

    let status = get(
        tls_connect(&config, broker.addr()).await.unwrap(),
        "/TOTVS_BROKER_QUERY/STATUS",
    )
    .await;
    assert!(
        status.lines().next().unwrap_or("").contains(" 200 "),
        "{status}"
    );
    assert!(status.contains("TLS certificate"), "{status}");
    assert!(status.contains("CN=localhost"), "{status}");
    assert!(status.contains("CN=Test CA"), "{status}");
    let metrics = get(
        tls_connect(&config, broker.addr()).await.unwrap(),
        "/TOTVS_BROKER_QUERY/METRICS",
    )
    .await;
    let expiry = metrics
        .lines()
        .find(|l| l.starts_with("appbroker_tls_certificate_expiry_seconds{"))
        .unwrap_or_else(|| panic!("no expiry gauge:\n{metrics}"));
    let seconds: f64 = expiry.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(seconds > 0.0, "{expiry}");
    let state = broker.state();
    assert!(state.certificate.is_some());
    assert!(
        state.handshake_failures.is_empty(),
        "{:?}",
        state.handshake_failures
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_protocol_header_comes_before_the_tls_handshake() {
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let server = TestServer::start("a").await;
    let extra = format!("PROXY_PROTOCOL=1\n{}", files.serve(&ca.broker_leaf()));
    let broker = InProcess::start(&ini_for(&[&server], &extra)).await;
    let config = client_config(ca.roots());
    // As a front balancer in TCP mode does: the header in clear, then the client's TLS.
    let mut tcp = TcpStream::connect(broker.addr()).await.unwrap();
    tcp.write_all(b"PROXY TCP4 192.0.2.7 127.0.0.1 56324 5000\r\n")
        .await
        .unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let connect = TlsConnector::from(Arc::clone(&config)).connect(name, tcp);
    let mut stream = within("a TLS handshake after the header", connect)
        .await
        .unwrap();
    assert_eq!(echo(&mut stream, "hello over tls").await, "a");
    drop(stream);
    let client: SocketAddr = "192.0.2.7:56324".parse().unwrap();
    broker
        .events
        .wait_for(
            "the end of the header's client",
            |e| matches!(e, appbroker::Event::ConnectionEnded { client: c, .. } if *c == client),
        )
        .await;
    // Without the header, the TLS client is refused: its ClientHello is no header.
    assert!(tls_connect(&config, broker.addr()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_bytes_on_a_tls_port_are_closed_counted_and_blame_no_server() {
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let server = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&server], &files.serve(&ca.broker_leaf()))).await;

    for _ in 0..3 {
        let got = plain_until_closed(
            broker.addr(),
            b"GET /TOTVS_BROKER_QUERY/STATUS HTTP/1.0\r\n\r\n",
        )
        .await
        .unwrap_or_default();
        // Closed: nothing but, at most, a TLS alert.
        assert!(!String::from_utf8_lossy(&got).contains("HTTP"));
    }
    eventually("three not_tls failures counted", || {
        broker
            .state()
            .handshake_failures
            .iter()
            .any(|(cause, n)| *cause == "not_tls" && *n == 3)
    })
    .await;
    assert_eq!(server.accepted(), 0, "no client reached a server");
    let state = broker.state();
    assert_eq!(state.servers[0].failed_connects, 0);
    assert!(state.servers[0].quarantine.is_none());
    // Still serving TLS clients.
    let mut stream = tls_connect(&client_config(ca.roots()), broker.addr())
        .await
        .unwrap();
    assert_eq!(echo(&mut stream, "after").await, "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_port_mode_serves_tls_and_plain_clients() {
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let server = TestServer::start("a").await;
    let extra = format!(
        "{}SSL_PLAIN_ON_SAME_PORT=1\n",
        files.serve(&ca.broker_leaf())
    );
    let broker = InProcess::start(&ini_for(&[&server], &extra)).await;

    let mut tls = tls_connect(&client_config(ca.roots()), broker.addr())
        .await
        .unwrap();
    assert_eq!(echo(&mut tls, "tls client").await, "a");
    let mut plain = TcpStream::connect(broker.addr()).await.unwrap();
    assert_eq!(echo(&mut plain, "plain client").await, "a");
    let ping = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/PING", &[]).await;
    assert_eq!(ping.status, 200);
    assert!(broker.state().handshake_failures.is_empty());
}

/// A client that sends nothing speaks a server-first protocol, which is plain (a TLS client
/// speaks first): on a same-port listener it is forwarded as plain, and the server's greeting
/// reaches it through the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_port_mode_forwards_a_silent_client_as_plain() {
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let server = TestServer::with_banner("a", "220 appserver ready\r\n").await;
    let extra = format!(
        "{}SSL_PLAIN_ON_SAME_PORT=1\n",
        files.serve(&ca.broker_leaf())
    );
    let broker = InProcess::start(&ini_for(&[&server], &extra)).await;

    let mut plain = TcpStream::connect(broker.addr()).await.unwrap();
    let mut greeting = vec![0u8; "220 appserver ready\r\n".len()];
    within("the greeting", plain.read_exact(&mut greeting))
        .await
        .unwrap();
    assert_eq!(greeting, b"220 appserver ready\r\n");
    assert_eq!(echo(&mut plain, "then a line").await, "a");
    assert!(broker.state().handshake_failures.is_empty());
}

/// A TLS server's configuration with `leaf` (its key PKCS#8, as rcgen and OpenSSL write it),
/// speaking `alpn` when given.
fn server_config(leaf: &Leaf, alpn: Option<&[u8]>) -> ServerConfig {
    let key = rustls::pki_types::PrivateKeyDer::try_from(
        rustls::pki_types::pem::PemObject::from_pem_slice(leaf.key.as_bytes())
            .map(|k: rustls::pki_types::PrivatePkcs8KeyDer<'static>| k.secret_pkcs8_der().to_vec())
            .unwrap(),
    )
    .unwrap();
    let mut config = ServerConfig::builder_with_provider(appbroker::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der.clone()], key)
        .unwrap();
    config.alpn_protocols = alpn.into_iter().map(<[u8]>::to_vec).collect();
    config
}

/// A TLS server's acceptor with `leaf`, speaking `alpn` when given.
fn acceptor_of(leaf: &Leaf, alpn: Option<&[u8]>) -> TlsAcceptor {
    TlsAcceptor::from(Arc::new(server_config(leaf, alpn)))
}

/// A TLS echo server (`<name>: <line>`) with `leaf`, on loopback.
async fn tls_echo_server(name: &'static str, leaf: &Leaf) -> SocketAddr {
    let acceptor = acceptor_of(leaf, None);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let (read, mut write) = tokio::io::split(stream);
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let reply = format!("{name}: {line}\n");
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A broker with `SSL_ENCRYPT_UPSTREAM=1` and `extra` in front of one TLS server with `leaf`;
/// whether a client is served, and the server's last error when it is not.
async fn through_upstream_tls(leaf: &Leaf, extra: &str) -> (Option<String>, Option<String>) {
    let addr = tls_echo_server("tls-a", leaf).await;
    let ini = tls_ini(
        addr.port(),
        &format!(
            "MONITORING_TYPE=DISABLED\nQUERY_ENABLED=0\nMAX_ATTEMPTS=1\nSSL_ENCRYPT_UPSTREAM=1\n{extra}"
        ),
    );
    let broker = InProcess::start(&ini).await;
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream.write_all(b"through\n").await.unwrap();
    let mut reply = String::new();
    let _ = within(
        "a reply or a close",
        BufReader::new(&mut stream).read_line(&mut reply),
    )
    .await;
    let served = (!reply.is_empty()).then(|| reply.trim_end().to_string());
    let state = broker.state();
    (served, state.servers[0].last_error.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tls_verifies_the_servers_and_says_why_one_fails() {
    let ca = Ca::new("Upstream CA");
    let files = Files::new();
    let ca_file = files.write("upstream-ca.pem", ca.pem());
    let trusted = format!("SSL_UPSTREAM_CA={}\n", ca_file.display());

    // Trusted CA, the right name (the server's address is in its certificate).
    let good = ca.issue(&["appserver.example", "127.0.0.1"], |_| {});
    let (served, _) = through_upstream_tls(&good, &trusted).await;
    assert_eq!(served.as_deref(), Some("tls-a: through"));

    // Servers by address, certificates by name: SSL_UPSTREAM_SERVER_NAME.
    let by_name = ca.issue(&["appserver.example"], |_| {});
    let named = format!("{trusted}SSL_UPSTREAM_SERVER_NAME=appserver.example\n");
    let (served, _) = through_upstream_tls(&by_name, &named).await;
    assert_eq!(served.as_deref(), Some("tls-a: through"));

    // Wrong name.
    let (served, error) = through_upstream_tls(&by_name, &trusted).await;
    assert_eq!(served, None);
    let error = error.expect("a reason");
    assert!(
        error.contains("name mismatch: certificate is for appserver.example"),
        "{error}"
    );

    // Wrong CA.
    let other = Ca::new("Someone else").issue(&["127.0.0.1"], |_| {});
    let (served, error) = through_upstream_tls(&other, &trusted).await;
    assert_eq!(served, None);
    let error = error.expect("a reason");
    assert!(error.contains("unknown issuer"), "{error}");

    // Expired.
    let expired = ca.issue(&["127.0.0.1"], |p| {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    });
    let (served, error) = through_upstream_tls(&expired, &trusted).await;
    assert_eq!(served, None);
    let error = error.expect("a reason");
    assert!(
        error.contains("certificate expired on 2021-01-01"),
        "{error}"
    );

    // Verification off, said explicitly: served, and the page says it is not authenticated.
    let (served, _) = through_upstream_tls(&other, "SSL_UPSTREAM_VERIFY=0\n").await;
    assert_eq!(served.as_deref(), Some("tls-a: through"));
}

/// What a server's certificate says to forge a log line, as the attack wrote it: a line
/// break, a line of its own, and escape sequences for the terminal that shows the log.
const FORGING_SUBJECT: &str = "evil\nERROR FAKE LOG LINE level=ERROR\x1b[31m\u{9b}2J";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_certificate_cannot_forge_a_log_line_nor_a_commands_variable() {
    let trusted = Ca::new("Upstream CA");
    let files = Files::new();
    let ca_file = files.write("upstream-ca.pem", trusted.pem());
    // Untrusted, its subject holding the forgery: the refusal tells what it is.
    let forged = Ca::new("Someone else").issue(&["127.0.0.1"], |p| {
        p.distinguished_name = dn(FORGING_SUBJECT);
    });
    let addr = tls_echo_server("tls-a", &forged).await;
    let extra = format!(
        "MONITORING_TYPE=DISABLED\nQUERY_ENABLED=0\nMAX_ATTEMPTS=1\nSSL_ENCRYPT_UPSTREAM=1\n\
         SSL_UPSTREAM_CA={}\n",
        ca_file.display()
    );
    let general = "ConsoleFile=@DIR@/console.log\nALERT_EVENTS=quarantine_entered\n\
                   ALERT_COMMAND=printf '%s' \"$APPBROKER_REASON\" > @DIR@/reason\n";
    let ini = tls_ini(addr.port(), &extra).replace("[General]\n", &format!("[General]\n{general}"));
    let broker = Broker::start(&ini).await;
    let mut stream = TcpStream::connect(broker.addr()).await.unwrap();
    stream.write_all(b"through\n").await.unwrap();
    let mut reply = String::new();
    let _ = within("a close", BufReader::new(&mut stream).read_line(&mut reply)).await;
    assert_eq!(reply, "", "an untrusted server serves no one");
    let line = broker.wait_for_log("FAKE LOG LINE").await;
    assert!(
        line.contains(r"evil\nERROR FAKE LOG LINE level=ERROR\x1b[31m\u{9b}2J"),
        "{line}"
    );
    let reason_file = broker.dir.path().join("reason");
    eventually("the alert command ran", || reason_file.exists()).await;
    let log_file = broker.dir.path().join("console.log");
    for text in [
        broker.log_text(),
        std::fs::read_to_string(&log_file).unwrap(),
        std::fs::read_to_string(&reason_file).unwrap(),
    ] {
        assert!(
            text.contains(r"FAKE LOG LINE level=ERROR\x1b[31m"),
            "{text}"
        );
        assert!(!text.contains('\x1b') && !text.contains('\u{9b}'), "{text}");
        assert!(
            !text.lines().any(|l| l.starts_with("ERROR FAKE LOG LINE")),
            "{text}"
        );
    }
    let reason = std::fs::read_to_string(&reason_file).unwrap();
    assert!(
        !reason.contains('\n') && reason.len() <= 512 + 32,
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unverified_upstream_is_a_warning_on_the_status_page() {
    let leaf = Ca::new("Self").issue(&["127.0.0.1"], |_| {});
    let addr = tls_echo_server("tls-a", &leaf).await;
    let ini = tls_ini(
        addr.port(),
        "MONITORING_TYPE=SEND_EXPECT\nMONITOR_SEND=ping\\n\nMONITOR_EXPECT=tls-a: ping\n\
         MONITOR_INTERVAL=100ms\nQUERY_ALLOW=127.0.0.1\nSSL_ENCRYPT_UPSTREAM=1\n\
         SSL_UPSTREAM_VERIFY=0\n",
    );
    let broker = InProcess::start(&ini).await;
    assert!(broker.state().upstream_warning.is_some());
    let page = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[]).await;
    assert!(page.text().contains("not authenticated"), "{}", page.text());
    // The SEND_EXPECT check speaks TLS to the server: it passes.
    eventually("a passed check over TLS", || {
        broker.state().servers[0]
            .last_check
            .as_ref()
            .is_some_and(|c| c.error.is_none())
    })
    .await;
}

/// The certificate the broker at `addr` presents to a client that does not resume (a resumed
/// session reports the certificate of the session it resumes).
async fn presented(config: &Arc<ClientConfig>, addr: SocketAddr) -> CertificateDer<'static> {
    let mut fresh = ClientConfig::clone(config);
    fresh.resumption = rustls::client::Resumption::disabled();
    let stream = tls_connect(&Arc::new(fresh), addr).await.unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_the_certificate_under_load_without_a_failed_exchange() {
    let (old_ca, new_ca) = (Ca::new("Old CA"), Ca::new("New CA"));
    let (old, new) = (old_ca.broker_leaf(), new_ca.broker_leaf());
    let files = Files::new();
    let server = TestServer::start("a").await;
    let ini = ini_for(&[&server], &files.serve(&old));
    let broker = InProcess::start(&ini).await;
    let mut roots = old_ca.roots();
    roots.add(new_ca.issuer.der().clone()).unwrap();
    let config = client_config(roots);
    assert_eq!(presented(&config, broker.addr()).await, old.der);

    // Clients that each hold a connection and exchange lines on it, and clients that connect
    // anew for each exchange, all through the swap.
    let stop = Arc::new(AtomicBool::new(false));
    let exchanges = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for i in 0..6 {
        let (stop, exchanges, config, addr) = (
            Arc::clone(&stop),
            Arc::clone(&exchanges),
            Arc::clone(&config),
            broker.addr(),
        );
        load.push(tokio::spawn(async move {
            // Odd clients connect anew for every exchange, even ones keep their connection.
            let reconnect = i % 2 == 1;
            let mut stream = tls_connect(&config, addr).await?;
            let mut n = 0;
            while !stop.load(Relaxed) && n < 20_000 {
                if reconnect && n > 0 {
                    stream = tls_connect(&config, addr).await?;
                }
                let line = format!("client {i} line {n}");
                assert_eq!(echo(&mut stream, &line).await, "a");
                exchanges.fetch_add(1, Relaxed);
                n += 1;
            }
            std::io::Result::Ok(n)
        }));
    }
    let before = exchanges.load(Relaxed);
    eventually("exchanges under way", || {
        exchanges.load(Relaxed) > before + 50
    })
    .await;
    files.serve(&new);
    let reloaded = broker
        .broker
        .reload_file()
        .await
        .expect("the reload applied");
    assert!(
        reloaded.changes.iter().any(|c| c.contains("certificate")),
        "{:?}",
        reloaded.changes
    );
    let at_swap = exchanges.load(Relaxed);
    eventually("exchanges after the swap", || {
        exchanges.load(Relaxed) > at_swap + 50
    })
    .await;
    assert_eq!(presented(&config, broker.addr()).await, new.der);
    stop.store(true, Relaxed);
    for client in load {
        let done = within("a load client to finish", client)
            .await
            .expect("no panic");
        done.expect("every connect and exchange succeeded");
    }
    assert!(broker.state().handshake_failures.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_does_not_load_rejects_the_reload_and_the_old_one_stays() {
    let ca = Ca::new("Test CA");
    let leaf = ca.broker_leaf();
    let files = Files::new();
    let server = TestServer::start("a").await;
    let ini = ini_for(&[&server], &files.serve(&leaf));
    let broker = InProcess::start(&ini).await;

    // A key that is not the certificate's: nothing could be served with it.
    let other = ca.broker_leaf();
    files.write("broker.key", &other.key);
    let error = broker.broker.reload_file().await.expect_err("rejected");
    let lines = error.lines().join("\n");
    assert!(lines.contains("SSL_KEY"), "{lines}");
    assert!(lines.contains("broker.key"), "{lines}");
    let config = client_config(ca.roots());
    assert_eq!(presented(&config, broker.addr()).await, leaf.der);
    let mut stream = tls_connect(&config, broker.addr()).await.unwrap();
    assert_eq!(echo(&mut stream, "still").await, "a");
}

/// `appbroker --check` on a file with one TLS balancer serving `leaf` (its key `key`).
fn check_with(files: &Files, leaf: &Leaf, key: &str) -> (i32, String, String) {
    let cert = files.write("broker.pem", &leaf.pem);
    let key = files.write("broker.key", key);
    let ini = format!(
        "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\nQUERY_ALLOW=127.0.0.1\n\
         SSL_CERTIFICATE={}\nSSL_KEY={}\nSSL_PASSPHRASE=do-not-print-me\n\
         REMOTE_SERVER_01=127.0.0.1 6000\n",
        cert.display(),
        key.display()
    );
    let path = files.write("appserver.ini", ini);
    run_cli(&["--check", "--config", path.to_str().unwrap()])
}

#[test]
fn check_reports_the_doctors_findings_naming_key_and_file() {
    let ca = Ca::new("Test CA");
    let files = Files::new();

    let good = ca.broker_leaf();
    let (code, stdout, stderr) = check_with(&files, &good, &good.key);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("SSL_PASSPHRASE=(set)"), "{stdout}");
    assert!(!stdout.contains("do-not-print-me") && !stderr.contains("do-not-print-me"));

    // Expired: a warning, never a refusal.
    let expired = ca.issue(&["localhost"], |p| {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    });
    let (code, _, stderr) = check_with(&files, &expired, &expired.key);
    assert_eq!(code, 0, "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("warning:") && l.contains("expired"))
        .unwrap_or_else(|| panic!("no expiry warning:\n{stderr}"));
    assert!(
        line.contains("SSL_CERTIFICATE") && line.contains("broker.pem"),
        "{line}"
    );
    assert!(line.contains("appserver.ini:"), "{line}");

    // A client certificate as the broker's identity: a warning in those words.
    let client_only = ca.issue(&["localhost"], |p| {
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    });
    let (code, _, stderr) = check_with(&files, &client_only, &client_only.key);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("warning:")
            && l.contains("SSL_CERTIFICATE")
            && l.contains("client certificate")),
        "{stderr}"
    );

    // A key that is not the certificate's: an error, exit 2.
    let (code, _, stderr) = check_with(&files, &good, &ca.broker_leaf().key);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("SSL_KEY") && stderr.contains("broker.key"),
        "{stderr}"
    );
}

/// Whether `program` is installed here; under `CI` its absence fails the test rather than
/// skipping it ([`find_program`]).
fn have(program: &str) -> bool {
    find_program(program).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs openssl and curl"]
async fn openssl_s_client_and_curl_verify_the_broker_and_are_served() {
    if !have("openssl") || !have("curl") {
        return;
    }
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let ca_file = files.write("ca.pem", ca.pem());
    let server = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&server], &files.serve(&ca.broker_leaf()))).await;
    let port = broker.addr().port().to_string();

    // s_client prints the verification, then relays standard input: a line goes out, the
    // echo comes back, and closing its input ends it.
    let mut s_client = tokio::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            "localhost",
            "-verify_return_error",
            "-CAfile",
            ca_file.to_str().unwrap(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = s_client.stdin.take().unwrap();
    input.write_all(b"hello from s_client\n").await.unwrap();
    let mut lines = BufReader::new(s_client.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    within("s_client's echo", async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("a: hello from s_client") {
                return;
            }
        }
        panic!("s_client ended without the echo:\n{seen}");
    })
    .await;
    assert!(seen.contains("Verify return code: 0 (ok)"), "{seen}");
    drop(input);
    within("s_client to end", s_client.wait()).await.unwrap();

    let mut curl = Command::new("curl");
    curl.args([
        "--silent",
        "--show-error",
        "--max-time",
        "20",
        "--cacert",
        ca_file.to_str().unwrap(),
        &format!("https://localhost:{port}/TOTVS_BROKER_QUERY/PING"),
    ]);
    let (code, stdout, stderr) = run_bounded(curl);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.is_empty(), "{stderr}");
}

/// `openssl`'s base64 SHA-256 of the certificate's public key, as Chromium's
/// `--ignore-certificate-errors-spki-list` takes it: trusting exactly that key.
fn spki_hash(cert: &Path) -> String {
    let mut command = Command::new("sh");
    command.arg("-c").arg(format!(
        "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der | \
         openssl dgst -sha256 -binary | openssl enc -base64",
        cert.display()
    ));
    let (code, stdout, stderr) = run_bounded(command);
    assert_eq!(code, 0, "{stderr}");
    stdout.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and openssl"]
async fn the_status_page_over_https_in_chromium() {
    if !have("openssl") {
        return;
    }
    let Some(binary) = find_chromium() else {
        return; // skipped, or failed under CI (find_program)
    };
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let server = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&server], &files.serve(&ca.broker_leaf()))).await;
    let spki = spki_hash(&files.0.path().join("broker.pem"));
    let profile = tempfile::tempdir().unwrap();
    let url = format!(
        "https://localhost:{}/TOTVS_BROKER_QUERY/STATUS",
        broker.addr().port()
    );
    let trust = format!("--ignore-certificate-errors-spki-list={spki}");
    let dom = chromium(&binary, profile.path(), &url, &["--dump-dom", &trust]).await;
    let dom = String::from_utf8_lossy(&dom);
    assert!(dom.contains("TLS certificate"), "{dom}");
    assert!(dom.contains("CN=localhost"), "{dom}");
    assert!(
        dom.contains("BALANCE_SMART_CLIENT_DESKTOP"),
        "the status page itself:\n{dom}"
    );
    // It reached the page through a verified handshake: no failure counted.
    assert!(broker.state().handshake_failures.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_broken_after_the_check_never_make_a_balancer_speak_plain() {
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let server = TestServer::start("a").await;
    let upstream = TestServer::start("b").await;
    let leaf = ca.broker_leaf();
    let ini = ini_for(&[&server], &files.serve(&leaf)).replace("@PORT@", &free_port().to_string());
    let config = appbroker::config::Config::from_text(&ini, Path::new("t.ini"))
        .expect("valid while the files are good")
        .config;
    // The key changes between the check and the start: the balancer closes every client
    // rather than relaying it without TLS.
    files.write("broker.key", "not a key");
    let broker = appbroker::Broker::start(config.clone()).expect("started");
    let addr = broker.addrs()[0].1;
    let got = plain_until_closed(addr, b"hello\n")
        .await
        .unwrap_or_default();
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert_eq!(server.accepted(), 0);

    // And a reload given by a program, whose files do not load, is rejected whole.
    let running = InProcess::start(&ini_for(&[&server], &files.serve(&leaf))).await;
    let mut next = (*running.broker.config()).clone();
    next.balancers[0].servers[0].port = upstream.addr.port();
    files.write("broker.pem", "not a certificate");
    let error = running.broker.reload(next).await.expect_err("rejected");
    assert!(matches!(error, appbroker::ReloadError::Tls(_)), "{error:?}");
    assert!(
        error.lines().iter().any(|l| l.contains("SSL_CERTIFICATE")),
        "{error:?}"
    );
    // The old server and certificate still serve.
    let mut stream = tls_connect(&client_config(ca.roots()), running.addr())
        .await
        .unwrap();
    assert_eq!(echo(&mut stream, "still a").await, "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_bytes_cross_a_tls_listener_both_ways_with_half_close() {
    use tokio::io::AsyncReadExt;
    const LEN: usize = 16 << 20;
    // A server that sends LEN bytes when asked (and keeps the connection open), then counts
    // what it reads to the client's end and answers the count before closing.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut ask = [0u8; 1];
        stream.read_exact(&mut ask).await.unwrap();
        let chunk = vec![7u8; 256 << 10];
        for _ in 0..LEN / chunk.len() {
            stream.write_all(&chunk).await.unwrap();
        }
        let mut sink = vec![0u8; 256 << 10];
        let mut got = 0u64;
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
        stream.write_all(&got.to_be_bytes()).await.unwrap();
    });
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let ini = tls_ini(
        port,
        &format!(
            "MONITORING_TYPE=DISABLED\nQUERY_ENABLED=0\n{}",
            files.serve(&ca.broker_leaf())
        ),
    );
    let broker = InProcess::start(&ini).await;
    let mut stream = tls_connect(&client_config(ca.roots()), broker.addr())
        .await
        .unwrap();
    // Down: every byte of the server's answer arrives while the connection stays open (the
    // last TLS records must not wait in the broker for more bytes from the server).
    stream.write_all(b"d").await.unwrap();
    let mut down = vec![0u8; LEN];
    within("16 MiB down", stream.read_exact(&mut down))
        .await
        .unwrap();
    assert!(down.iter().all(|&b| b == 7));
    // Up, then the client's end: the server counts every byte, and its answer ends with a
    // TLS close_notify (an end, not a cut).
    let chunk = vec![1u8; 256 << 10];
    within("16 MiB up", async {
        for _ in 0..LEN / chunk.len() {
            stream.write_all(&chunk).await.unwrap();
        }
        stream.shutdown().await.unwrap();
    })
    .await;
    let mut answer = Vec::new();
    within("the count and a clean end", stream.read_to_end(&mut answer))
        .await
        .expect("a close_notify before the end");
    assert_eq!(answer, (LEN as u64).to_be_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_failed_handshakes_once_per_episode_and_swaps_certificates_on_sighup() {
    let (old_ca, new_ca) = (Ca::new("Old CA"), Ca::new("New CA"));
    let files = Files::new();
    let server = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&server], &files.serve(&old_ca.broker_leaf()))).await;
    broker
        .wait_for_log("speaks TLS with the certificate of CN=localhost")
        .await;

    // Three clients that speak plain text to the TLS port: one line, with the cause.
    for _ in 0..3 {
        plain_until_closed(broker.addr(), b"hello\n").await;
    }
    let line = broker
        .wait_for_log("TLS handshake with a client failed")
        .await;
    assert!(line.contains("not TLS"), "{line}");
    // The episode ends with a good handshake once failures have been quiet for a second.
    let mut roots = old_ca.roots();
    roots.add(new_ca.issuer.der().clone()).unwrap();
    let config = client_config(roots);
    let ended = "the episode's end logged";
    poll(ended, std::time::Duration::ZERO, DEADLINE, async || {
        if broker.has_log("TLS handshakes with clients succeed again; 3 failed before") {
            return Ok(());
        }
        let mut stream = tls_connect(&config, broker.addr()).await.unwrap();
        assert_eq!(echo(&mut stream, "good").await, "a");
        Err(broker.log_text())
    })
    .await;
    assert_eq!(broker.count_logs("TLS handshake with a client failed"), 1);

    // SIGHUP with renewed files: new handshakes get the new certificate.
    let new = new_ca.broker_leaf();
    files.serve(&new);
    broker.signal(nix::sys::signal::Signal::SIGHUP);
    broker.wait_for_log("certificate CN=localhost").await;
    assert_eq!(presented(&config, broker.addr()).await, new.der);
}

#[test]
fn the_tdn_example_is_told_what_to_change_and_then_passes() {
    let files = Files::new();
    let tdn = "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\nQUERY_ALLOW=127.0.0.1\n\
               SSL_METHOD=TLSv1\nSSL_CERTIFICATE=C:\\totvs\\certs\\totvs.pem\n\
               SSL_KEY=C:\\totvs\\certs\\totvs.key\nSSL_PASSPHRASE=\nSSL_ENCRYPT_UPSTREAM=1\n\
               REMOTE_SERVER_01=127.0.0.1 6000\n";
    let path = files.write("appserver.ini", tdn);
    let (code, _, stderr) = run_cli(&["--check", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    for key in ["SSL_CERTIFICATE", "SSL_KEY"] {
        assert!(
            stderr.lines().any(|l| l.contains(key)
                && l.contains("is a Windows path")
                && l.contains("appserver.ini:")),
            "{stderr}"
        );
    }
    // The files copied here, the servers' CA given: it passes, with a notice for TLSv1.
    let ca = Ca::new("Test CA");
    let leaf = ca.broker_leaf();
    let cert = files.write("totvs.pem", &leaf.pem);
    let key = files.write("totvs.key", &leaf.key);
    let upstream_ca = files.write("appservers-ca.pem", ca.pem());
    let fixed = tdn
        .replace("C:\\totvs\\certs\\totvs.pem", cert.to_str().unwrap())
        .replace("C:\\totvs\\certs\\totvs.key", key.to_str().unwrap())
        + &format!("SSL_UPSTREAM_CA={}\n", upstream_ca.display());
    let path = files.write("appserver.ini", fixed);
    let (code, stdout, stderr) = run_cli(&["--check", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("notice:")
            && l.contains("SSL_METHOD")
            && l.contains("TLS 1.2 and 1.3 are used instead")),
        "{stderr}"
    );
    assert!(stdout.contains("SSL_ENCRYPT_UPSTREAM=1"), "{stdout}");
}

/// An HTTP origin on loopback that answers every request with its own head as the body, so a
/// test can read what the broker forwarded.
async fn head_echo_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let end = line == "\r\n";
                    head.push_str(&line);
                    if end {
                        break;
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{head}",
                    head.len()
                );
                let _ = reader.get_mut().write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_balancer_speaks_https_and_tells_plain_http_to_use_it() {
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let origin = head_echo_origin().await;
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\n{}REMOTE_SERVER_01=127.0.0.1 {}\n",
        files.serve(&ca.broker_leaf()),
        origin.port()
    );
    let broker = InProcess::start(&ini).await;
    let mut config = (*client_config(ca.roots())).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let config = Arc::new(config);

    let stream = tls_connect(&config, broker.addr()).await.unwrap();
    assert_eq!(
        stream.get_ref().1.alpn_protocol(),
        Some(&b"http/1.1"[..]),
        "ALPN"
    );
    let answer = get(stream, "/page").await;
    assert!(
        answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
        "{answer}"
    );
    let lower = answer.to_ascii_lowercase();
    assert!(lower.contains("x-forwarded-proto: https"), "{answer}");
    assert!(lower.contains("get /page http/1."), "{answer}");

    // Plain HTTP to the TLS port: 400, saying to use https; counted, no server blamed.
    let got = plain_until_closed(
        broker.addr(),
        b"GET /page HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await
    .unwrap_or_default();
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
    assert!(got.contains("https://"), "{got}");
    eventually("the plain client counted as not_tls", || {
        broker
            .state()
            .handshake_failures
            .iter()
            .any(|(cause, n)| *cause == "not_tls" && *n == 1)
    })
    .await;
    assert!(broker.state().servers[0].quarantine.is_none());
}

/// What a TLS-only HTTP server saw on one connection it accepted.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// The first bytes, when they were not a TLS handshake (clear text).
    clear: Option<String>,
    /// The application protocol agreed (ALPN).
    alpn: Option<Vec<u8>>,
    /// The paths asked on it, in order.
    paths: Vec<String>,
}

/// A TLS-only HTTP/1.1 server with `leaf` (keep-alive, ALPN `http/1.1`) answering every
/// request `served <path>`, and what each connection it accepted carried. A connection whose
/// first byte is no TLS handshake record (0x16) is recorded as clear text and closed.
async fn tls_http_server(leaf: &Leaf) -> (SocketAddr, Arc<std::sync::Mutex<Vec<Seen>>>) {
    let acceptor = acceptor_of(leaf, Some(b"http/1.1"));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<std::sync::Mutex<Vec<Seen>>> = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let index = {
                let mut seen = record.lock().unwrap();
                seen.push(Seen::default());
                seen.len() - 1
            };
            let (acceptor, record) = (acceptor.clone(), Arc::clone(&record));
            tokio::spawn(async move {
                let mut first = [0u8; 64];
                let Ok(n) = tcp.peek(&mut first).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                if first[0] != 0x16 {
                    let mut clear = vec![0u8; 256];
                    let n = tokio::io::AsyncReadExt::read(&mut tcp, &mut clear)
                        .await
                        .unwrap_or(0);
                    record.lock().unwrap()[index].clear =
                        Some(String::from_utf8_lossy(&clear[..n]).into_owned());
                    return;
                }
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                record.lock().unwrap()[index].alpn =
                    tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let path = request.uri().path().to_string();
                        record.lock().unwrap()[index].paths.push(path.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(bytes::Bytes::from(format!(
                                    "served {path}"
                                ))),
                            ))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// [`tls_ini`] for an HTTP balancer.
fn http_tls_ini(port: u16, extra: &str) -> String {
    tls_ini(port, extra).replace("[BALANCE_SMART_CLIENT_DESKTOP]", "[BALANCE_HTTP]")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_balancer_speaks_tls_to_its_servers_and_reuses_one_pooled_connection() {
    let ca = Ca::new("Upstream CA");
    let files = Files::new();
    let ca_file = files.write("upstream-ca.pem", ca.pem());
    let (addr, seen) = tls_http_server(&ca.issue(&["127.0.0.1"], |_| {})).await;
    let ini = http_tls_ini(
        addr.port(),
        &format!(
            "SSL_ENCRYPT_UPSTREAM=1\nSSL_UPSTREAM_CA={}\nMONITORING_TYPE=HTTP\n\
             MONITOR_PATH=/health\nMONITOR_INTERVAL=100ms\n",
            ca_file.display()
        ),
    );
    let broker = InProcess::start(&ini).await;

    // Five requests on one kept-alive client connection (one worker, so one pool).
    let mut client = HttpConnection::connect(broker.addr()).await;
    for i in 0..5 {
        let answer = client.request("GET", &format!("/r{i}"), &[]).await.unwrap();
        assert_eq!(
            (answer.status, answer.text()),
            (200, format!("served /r{i}")),
            "{:?}",
            seen.lock().unwrap()
        );
    }
    // The monitor's HTTP check goes over TLS too, on the same dialer.
    eventually("a passed HTTP check over TLS", || {
        broker.state().servers[0]
            .last_check
            .as_ref()
            .is_some_and(|c| c.error.is_none())
    })
    .await;

    let seen = seen.lock().unwrap().clone();
    let clear: Vec<_> = seen.iter().filter_map(|c| c.clear.as_ref()).collect();
    assert!(clear.is_empty(), "clear text reached the server: {clear:?}");
    let carrying: Vec<&Seen> = seen
        .iter()
        .filter(|c| c.paths.iter().any(|p| p.starts_with("/r")))
        .collect();
    assert_eq!(
        carrying.len(),
        1,
        "five requests, one pooled TLS connection: {seen:?}"
    );
    assert_eq!(carrying[0].paths, ["/r0", "/r1", "/r2", "/r3", "/r4"]);
    assert_eq!(carrying[0].alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert!(seen.iter().any(|c| c.paths == ["/health"]), "{seen:?}");
    assert_eq!(broker.state().servers[0].failed_connects, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_balancer_sends_nothing_to_a_server_it_cannot_verify_and_says_why() {
    let trusted = Ca::new("Upstream CA");
    let files = Files::new();
    let ca_file = files.write("upstream-ca.pem", trusted.pem());
    let stranger = Ca::new("Someone else").issue(&["127.0.0.1"], |_| {});
    let (addr, seen) = tls_http_server(&stranger).await;
    let ini = http_tls_ini(
        addr.port(),
        &format!(
            "SSL_ENCRYPT_UPSTREAM=1\nSSL_UPSTREAM_CA={}\nMONITORING_TYPE=DISABLED\n\
             MAX_ATTEMPTS=1\n",
            ca_file.display()
        ),
    );
    let broker = InProcess::start(&ini).await;
    let answer = http_get(broker.addr(), "/secret", &[]).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the broker tried the server");
    assert!(
        seen.iter().all(|c| c.clear.is_none() && c.paths.is_empty()),
        "{seen:?}"
    );
    let error = broker.state().servers[0]
        .last_error
        .clone()
        .expect("a reason");
    assert!(
        error.starts_with(
            "TLS handshake failed: unknown issuer: the server's certificate \
                           (CN=127.0.0.1, issued by CN=Someone else,"
        ),
        "{error}"
    );
    assert!(broker.state().servers[0].quarantine.is_some());
}

/// A server's own certificate as `openssl req -x509` makes it, made here with rcgen:
/// self-signed, marked CA:TRUE, no subject alternative name, `name` its CN.
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
        key: key.serialize_pem(),
    }
}

/// `appbroker --check` on one TCP balancer encrypting upstream with `extra` (its
/// `SSL_UPSTREAM_CA`).
fn check_upstream(files: &Files, extra: &str) -> (i32, String, String) {
    let ini = files.write(
        "appserver.ini",
        format!(
            "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\nSSL_ENCRYPT_UPSTREAM=1\n\
             {extra}REMOTE_SERVER_01=127.0.0.1 6000\n"
        ),
    );
    run_cli(&["--check", "--config", ini.to_str().unwrap()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_own_certificate_in_ssl_upstream_ca_is_pinned_until_it_expires() {
    let files = Files::new();
    let own = self_signed("appserver", |_| {});
    let pinned = format!(
        "SSL_UPSTREAM_CA={}\n",
        files.write("appserver.crt", &own.pem).display()
    );
    let (served, error) = through_upstream_tls(&own, &pinned).await;
    assert_eq!(served.as_deref(), Some("tls-a: through"), "{error:?}");
    let (code, _, stderr) = check_upstream(&files, &pinned);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("notice:")
            && l.contains("SSL_UPSTREAM_CA")
            && l.contains(
                "appserver.crt: CN=appserver, self-signed, marked CA:TRUE, no subject \
                           alternative name"
            )
            && l.contains("is pinned")),
        "{stderr}"
    );

    let expired = self_signed("appserver", |p| {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    });
    let pinned = format!(
        "SSL_UPSTREAM_CA={}\n",
        files.write("expired.crt", &expired.pem).display()
    );
    let (served, error) = through_upstream_tls(&expired, &pinned).await;
    assert_eq!(served, None);
    let error = error.expect("a reason");
    assert!(
        error.starts_with(
            "TLS handshake failed: certificate expired on 2021-01-01 00:00:00 UTC: the \
             certificate pinned in SSL_UPSTREAM_CA (CN=appserver, self-signed,"
        ) && error.ends_with(
            "make the server a new one and put it in SSL_UPSTREAM_CA in place of the old"
        ),
        "{error}"
    );
    let (code, _, stderr) = check_upstream(&files, &pinned);
    assert_eq!(
        code, 0,
        "an expired pin is a warning, not a refusal: {stderr}"
    );
    assert!(
        stderr.lines().any(|l| l.starts_with("warning:")
            && l.contains(
                "expired.crt: the pinned certificate CN=appserver expired on 2021-01-01"
            )),
        "{stderr}"
    );
}

/// A server's own certificate made by the real `openssl req -x509` (RSA 2048, a year, as
/// AppServer guides write the command), saved as `<file>.crt` and `<file>.key`.
fn openssl_req_x509(files: &Files, name: &str, file: &str) -> Leaf {
    let (cert, key) = (
        files.0.path().join(format!("{file}.crt")),
        files.0.path().join(format!("{file}.key")),
    );
    let mut command = Command::new("openssl");
    command.args([
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365",
    ]);
    command.args(["-subj", &format!("/CN={name}")]);
    command.arg("-keyout").arg(&key).arg("-out").arg(&cert);
    let (code, _, stderr) = run_bounded(command);
    assert_eq!(code, 0, "{stderr}");
    let pem = std::fs::read_to_string(&cert).unwrap();
    let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
    Leaf {
        der,
        pem,
        key: std::fs::read_to_string(&key).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs openssl"]
async fn a_certificate_made_by_openssl_req_x509_is_pinned_by_naming_it_and_another_is_not() {
    if !have("openssl") {
        return;
    }
    let files = Files::new();
    let own = openssl_req_x509(&files, "appserver", "own");
    // What such AppServer certificates are: CA:TRUE, no subjectAltName.
    let mut text = Command::new("openssl");
    text.args(["x509", "-noout", "-text", "-in"])
        .arg(files.0.path().join("own.crt"));
    let (code, text, stderr) = run_bounded(text);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        text.contains("CA:TRUE") && !text.contains("Subject Alternative Name"),
        "{text}"
    );
    let pinned = format!(
        "SSL_UPSTREAM_CA={}\n",
        files.0.path().join("own.crt").display()
    );

    // A TCP balancer and an HTTP one: the same dial path, the same verifier.
    let (served, error) = through_upstream_tls(&own, &pinned).await;
    assert_eq!(served.as_deref(), Some("tls-a: through"), "{error:?}");
    let (addr, seen) = tls_http_server(&own).await;
    let ini = http_tls_ini(
        addr.port(),
        &format!("SSL_ENCRYPT_UPSTREAM=1\n{pinned}MONITORING_TYPE=DISABLED\n"),
    );
    let broker = InProcess::start(&ini).await;
    let answer = http_get(broker.addr(), "/pinned", &[]).await;
    assert_eq!(
        (answer.status, answer.text()),
        (200, "served /pinned".to_string()),
        "{:?}",
        broker.state().servers[0].last_error
    );
    assert!(seen.lock().unwrap().iter().all(|c| c.clear.is_none()));

    // Another `openssl req -x509` certificate of the same name (the server's, made again):
    // refused, saying what it is and what is pinned, never webpki's CaUsedAsEndEntity.
    let again = openssl_req_x509(&files, "appserver", "again");
    let (served, error) = through_upstream_tls(&again, &pinned).await;
    assert_eq!(served, None);
    let error = error.expect("a reason");
    assert!(
        error.starts_with(
            "TLS handshake failed: not trusted: the server's certificate (CN=appserver, \
             self-signed, marked CA:TRUE, no subject alternative name, valid until"
        ) && error.contains("is not the certificate pinned in SSL_UPSTREAM_CA (")
            && error.contains("own.crt holds CN=appserver)"),
        "{error}"
    );
    assert!(
        !error.contains("Other(") && !error.contains("CaUsedAsEndEntity"),
        "{error}"
    );

    // --check's doctor says it is pinned.
    let (code, _, stderr) = check_upstream(&files, &pinned);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("notice:")
            && l.contains(
                "own.crt: CN=appserver, self-signed, marked CA:TRUE, no subject \
                           alternative name"
            )
            && l.contains("is pinned")),
        "{stderr}"
    );
}

/// A TLS web server with `leaf` on loopback, answering each request `200` and recording the
/// name each client sent (SNI) and each request's `Host`.
async fn tls_web_server(leaf: &Leaf) -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    let config = Arc::new(server_config(leaf, None));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (config, record) = (Arc::clone(&config), Arc::clone(&record));
            tokio::spawn(async move {
                // The name is read from the client's hello, before the certificate is sent:
                // recorded even when the client then refuses it.
                let hello = tokio_rustls::LazyConfigAcceptor::new(Default::default(), tcp);
                let Ok(start) = hello.await else {
                    return;
                };
                let sni = start.client_hello().server_name().unwrap_or("").to_string();
                record.lock().unwrap().push(format!("SNI {sni}"));
                let Ok(mut stream) = start.into_stream(config).await else {
                    return;
                };
                let mut lines = BufReader::new(&mut stream);
                let mut line = String::new();
                while lines.read_line(&mut line).await.unwrap_or(0) > 2 {
                    if let Some(host) = line.strip_prefix("host: ").or(line.strip_prefix("Host: "))
                    {
                        record
                            .lock()
                            .unwrap()
                            .push(format!("Host {}", host.trim_end()));
                    }
                    line.clear();
                }
                let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                let _ = stream.write_all(answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_named_with_a_final_dot_is_verified_and_checked_by_its_name() {
    // `app.test.` is an absolute name (no search domain appended): accepted as a server's
    // host. Towards it, TLS sends and verifies `app.test` (RFC 6066 leaves the dot out), and
    // the HTTP check asks for `Host: app.test:<port>`, the names the server knows itself by.
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let ca_file = files.write("ca.pem", ca.pem());
    let lookup: appbroker::net::resolve::Lookup = Arc::new(|name: &str| match name {
        "app.test." => Ok(vec![std::net::Ipv4Addr::LOCALHOST.into()]),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            name.to_string(),
        )),
    });
    let resolver = Arc::new(appbroker::net::resolve::Resolver::with_lookup(4, lookup));
    for (certified, verified) in [("app.test", true), ("other.test", false)] {
        let (addr, seen) = tls_web_server(&ca.issue(&[certified], |_| {})).await;
        let text = format!(
            "[BALANCE_HTTP]\nLOCAL_SERVER_PORT=1\nMONITORING_TYPE=HTTP\nSSL_ENCRYPT_UPSTREAM=1\n\
             SSL_UPSTREAM_CA={}\nREMOTE_SERVER_01=app.test. {}\n",
            ca_file.display(),
            addr.port()
        );
        let loaded = appbroker::config::Config::from_text(&text, Path::new("t.ini"))
            .unwrap_or_else(|e| panic!("{}", e.report()));
        let balancer = &loaded.config.balancers[0];
        let server = &balancer.servers[0];
        assert_eq!(server.address(), format!("app.test.:{}", addr.port()));
        let settings = balancer.tls.upstream(true).unwrap();
        // SSL_UPSTREAM_CA is the one trusted: no system roots needed.
        let roots = appbroker::tls::SystemRoots {
            store: Arc::new(RootCertStore::empty()),
            problem: None,
        };
        let tls = appbroker::tls::UpstreamTls::load(&settings, &roots).unwrap();
        let checked = appbroker::broker::monitor::check(
            &resolver,
            &server.host,
            server.port,
            balancer,
            Some(&tls),
        )
        .await;
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen.first().map(String::as_str),
            Some("SNI app.test"),
            "{seen:?}"
        );
        if verified {
            assert!(checked.is_ok(), "{checked:?}");
            assert_eq!(seen[1..], [format!("Host app.test:{}", addr.port())]);
        } else {
            let error = checked.unwrap_err().words();
            assert!(error.contains("TLS handshake failed"), "{error}");
            assert_eq!(
                seen.len(),
                1,
                "no request without a verified server: {seen:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_of_actions_is_offered_over_tls_to_a_peer_off_loopback() {
    let Some(ip) = off_loopback_address() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "no address off loopback under CI"
        );
        eprintln!("skipped: this host has no address off loopback");
        return;
    };
    let ca = Ca::new("Test CA");
    let files = Files::new();
    let users = files.0.path().join("users");
    let mut htpasswd = Command::new("htpasswd");
    htpasswd
        .args(["-B", "-b", "-c"])
        .arg(&users)
        .args(["ana", "right horse"]);
    assert_eq!(run_bounded(htpasswd).0, 0, "htpasswd (apache2-utils)");
    let server = TestServer::start("a").await;
    let lines = files
        .serve(&ca.broker_leaf())
        .replace("QUERY_ALLOW=127.0.0.1", "QUERY_ALLOW=0.0.0.0/0");
    let ini = ini_for(&[&server], &lines)
        .replace(
            "[General]\n",
            &format!("[General]\nADMIN_USERS={}\n", users.display()),
        )
        .replace(
            "LOCAL_SERVER_ADDRESS=127.0.0.1",
            "LOCAL_SERVER_ADDRESS=0.0.0.0",
        );
    let broker = InProcess::start(&ini).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(ip, 0)).unwrap();
    let tcp = socket
        .connect(SocketAddr::new(ip, broker.addr().port()))
        .await
        .unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut stream = TlsConnector::from(client_config(ca.roots()))
        .connect(name, tcp)
        .await
        .unwrap();
    // `ana:right horse`.
    let request = "GET /TOTVS_BROKER_QUERY/ADMIN HTTP/1.0\r\nHost: localhost\r\n\
                   Authorization: Basic YW5hOnJpZ2h0IGhvcnNl\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    within(
        "the response",
        tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut response),
    )
    .await
    .ok();
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("Signed in as <b>ana</b>"), "{response}");
}
