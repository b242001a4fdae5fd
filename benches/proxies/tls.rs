//! The TLS rows: the certificates every TLS listener serves (made by the runner at start, one
//! CA and a leaf per key kind), the runner's own TLS servers (the direct path), the bulk
//! origin behind the proxies, and the load generator's two TLS loops:
//!
//! - handshakes: WORKERS loops of connect, handshake (full, or resumed from a session store
//!   the loops share), one 1-byte exchange, close_notify and close;
//! - bulk: one stream through the TLS listener, 16 MiB at a time in one direction, each chunk
//!   acknowledged (upload) or counted (download) so that every byte is accounted for.
//!
//! The client offers the key exchange groups X25519 (first: its TLS 1.3 key share) and P-256
//! (which a TLS 1.2 client must list for a server to use an ECDSA P-256 certificate, RFC 8422;
//! OpenSSL holds to it), and every server here picks X25519. rustls would otherwise lead with
//! the post-quantum X25519MLKEM768, which appbroker and the runner's servers accept and
//! HAProxy and nginx (OpenSSL 3.0) do not, and the rows would compare different handshakes.
//! The report lists what each row negotiated with each target.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::loadgen::{IO_TIMEOUT, REQUEST, Tally, connect, finish, serve_loop};

/// The name every leaf certificate is issued for and the clients ask for.
pub const SERVER_NAME: &str = "localhost";
/// Bytes per bulk chunk: large enough that the per-chunk round trip (the acknowledgement)
/// costs well under 1% at loopback rates, small enough for a few chunks in a 1 s run.
const CHUNK: u64 = 16 << 20;
/// The size of the bulk client's writes and reads.
const BUF: usize = 256 << 10;
/// Bound on one bulk chunk (16 MiB) either way: only a stalled path takes this long.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(30);
/// TLS 1.2 sessions the runner's own servers remember by session id (HAProxy's default
/// `tune.ssl.cachesize`, and appbroker's), beside tickets.
const SESSION_CACHE: usize = 20_000;

/// The key of a certificate.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum KeyKind {
    Ecdsa,
    Rsa,
}

impl KeyKind {
    pub fn name(self) -> &'static str {
        match self {
            KeyKind::Ecdsa => "ecdsa",
            KeyKind::Rsa => "rsa",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            KeyKind::Ecdsa => "ECDSA P-256",
            KeyKind::Rsa => "RSA 2048",
        }
    }
}

/// The protocol version a handshake row's client speaks (the listeners speak both).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TlsVersion {
    Tls13,
    Tls12,
}

impl TlsVersion {
    pub fn name(self) -> &'static str {
        match self {
            TlsVersion::Tls13 => "tls13",
            TlsVersion::Tls12 => "tls12",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            TlsVersion::Tls13 => "TLS 1.3",
            TlsVersion::Tls12 => "TLS 1.2",
        }
    }

    fn parse(s: &str) -> Result<TlsVersion> {
        match s {
            "tls13" => Ok(TlsVersion::Tls13),
            "tls12" => Ok(TlsVersion::Tls12),
            _ => bail!("bad TLS version {s:?} (tls13, tls12)"),
        }
    }
}

/// One leaf certificate's files, as each proxy wants them.
pub struct CertFiles {
    /// The certificate alone (PEM): appbroker's `SSL_CERTIFICATE`, nginx's `ssl_certificate`.
    pub cert: PathBuf,
    /// Its key, PKCS#8 PEM: appbroker's `SSL_KEY`, nginx's `ssl_certificate_key`.
    pub key: PathBuf,
    /// Certificate then key in one file, as HAProxy's `crt` reads it.
    pub bundle: PathBuf,
}

/// The certificates of a run: one CA (the clients' only trust anchor) and a leaf for
/// `localhost` and 127.0.0.1 per key kind, issued by it.
pub struct Certs {
    pub ca: PathBuf,
    ecdsa: CertFiles,
    rsa: CertFiles,
}

impl Certs {
    /// Makes the CA and both leaves and writes them into `dir`.
    pub fn generate(dir: &Path) -> Result<Certs> {
        std::fs::create_dir_all(dir)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "appbroker benchmark CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let ca = CertifiedIssuer::self_signed(params, ca_key)?;
        let ca_path = dir.join("ca.pem");
        std::fs::write(&ca_path, ca.pem())?;
        let leaf = |kind: KeyKind| -> Result<CertFiles> {
            let alg = match kind {
                KeyKind::Ecdsa => &rcgen::PKCS_ECDSA_P256_SHA256,
                // rcgen's RSA keys (aws-lc-rs) are 2048 bits.
                KeyKind::Rsa => &rcgen::PKCS_RSA_SHA256,
            };
            let mut params =
                CertificateParams::new(vec![SERVER_NAME.to_string(), "127.0.0.1".to_string()])?;
            params
                .distinguished_name
                .push(DnType::CommonName, SERVER_NAME);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            let key = KeyPair::generate_for(alg)?;
            let cert = params.signed_by(&key, &ca)?;
            let files = CertFiles {
                cert: dir.join(format!("{}.pem", kind.name())),
                key: dir.join(format!("{}.key", kind.name())),
                bundle: dir.join(format!("{}.bundle.pem", kind.name())),
            };
            std::fs::write(&files.cert, cert.pem())?;
            std::fs::write(&files.key, key.serialize_pem())?;
            std::fs::write(&files.bundle, cert.pem() + &key.serialize_pem())?;
            Ok(files)
        };
        Ok(Certs {
            ca: ca_path,
            ecdsa: leaf(KeyKind::Ecdsa).context("the ECDSA certificate")?,
            rsa: leaf(KeyKind::Rsa).context("the RSA certificate")?,
        })
    }

    pub fn files(&self, kind: KeyKind) -> &CertFiles {
        match kind {
            KeyKind::Ecdsa => &self.ecdsa,
            KeyKind::Rsa => &self.rsa,
        }
    }
}

/// The client side of every TLS row: trusts the run's CA only, speaks `version`, offers
/// X25519 and P-256 (module docs), and keeps sessions for resumption only when `resume`.
pub fn client_config(ca: &Path, version: TlsVersion, resume: bool) -> Result<Arc<ClientConfig>> {
    use rustls::crypto::aws_lc_rs::kx_group;
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![kx_group::X25519, kx_group::SECP256R1];
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).context("the CA file")? {
        roots.add(cert?)?;
    }
    let versions: &[&rustls::SupportedProtocolVersion] = match version {
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
        TlsVersion::Tls12 => &[&rustls::version::TLS12],
    };
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = if resume {
        Resumption::in_memory_sessions(256)
    } else {
        Resumption::disabled()
    };
    Ok(Arc::new(config))
}

/// The runner's own TLS servers (the direct path): TLS 1.2 and 1.3, every group aws-lc-rs
/// has, tickets and a session cache, as the proxies are configured.
fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let chain = CertificateDer::pem_file_iter(cert)
        .context("the certificate file")?
        .collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key).context("the key file")?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
    Ok(Arc::new(config))
}

/// What a runner's server does with each connection.
#[derive(Clone, Copy)]
pub enum Role {
    /// Echo every byte back.
    Echo,
    /// The bulk protocol ([`serve_bulk`]).
    Bulk,
}

impl Role {
    pub fn parse(s: &str) -> Result<Role> {
        match s {
            "echo" => Ok(Role::Echo),
            "bulk" => Ok(Role::Bulk),
            _ => bail!("bad role {s:?} (echo, bulk)"),
        }
    }
}

/// `--serve-tls ROLE PORT CERT KEY`: the direct path of the TLS rows.
pub async fn serve_tls(role: Role, port: u16, cert: &Path, key: &Path) -> Result<()> {
    let acceptor = TlsAcceptor::from(server_config(cert, key)?);
    serve_loop(port, move |tcp| {
        let acceptor = acceptor.clone();
        async move {
            let Ok(Ok(stream)) = timeout(IO_TIMEOUT, acceptor.accept(tcp)).await else {
                return;
            };
            serve_role(role, stream).await;
        }
    })
    .await
}

/// `--serve-bulk PORT`: the plain bulk origin the proxies forward the TLS bulk rows to.
pub async fn serve_bulk_plain(port: u16) -> Result<()> {
    serve_loop(port, |tcp| serve_role(Role::Bulk, tcp)).await
}

async fn serve_role<S: AsyncRead + AsyncWrite + Unpin>(role: Role, stream: S) {
    match role {
        Role::Echo => crate::loadgen::echo(stream).await,
        Role::Bulk => {
            let _ = serve_bulk(stream).await;
        }
    }
}

/// The bulk protocol, request by request: a 9-byte head, `u` or `d` and a big-endian u64
/// length. `u`: the server reads exactly that many bytes and answers their count (8 bytes);
/// `d`: it writes that many bytes. Lower-case letters, so appbroker's query sniffing (upper-
/// case HTTP methods) forwards the first byte at once.
async fn serve_bulk<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> Result<()> {
    let mut buf = vec![0u8; BUF];
    loop {
        let mut head = [0u8; 9];
        match stream.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let len = u64::from_be_bytes(head[1..].try_into()?);
        match head[0] {
            b'u' => {
                take(&mut stream, len, &mut buf).await?;
                stream.write_all(&len.to_be_bytes()).await?;
                stream.flush().await?;
            }
            b'd' => {
                give(&mut stream, len, &buf).await?;
                stream.flush().await?;
            }
            other => bail!("bad bulk request {other:#x}"),
        }
    }
}

/// Reads exactly `len` bytes (through `buf`) and drops them.
async fn take<S: AsyncRead + Unpin>(stream: &mut S, len: u64, buf: &mut [u8]) -> Result<()> {
    let mut left = len;
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let n = stream.read(&mut buf[..want]).await?;
        if n == 0 {
            bail!("the stream ended {left} bytes short of {len}");
        }
        left -= n as u64;
    }
    Ok(())
}

/// Writes `len` bytes, `buf` at a time.
async fn give<S: AsyncWrite + Unpin>(stream: &mut S, len: u64, buf: &[u8]) -> Result<()> {
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        stream.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    Ok(())
}

/// `--loadgen tls-hs ADDR WORKERS SECS CA VERSION full|resumed`: handshake loops. Resumed
/// loops warm the shared session store with one full handshake per worker before the clock
/// starts. Prints the usual figures plus how the handshakes went (full, resumed, with a
/// HelloRetryRequest), the version, cipher suite and group negotiated, and the first error.
pub async fn handshakes(args: &[String]) -> Result<String> {
    let addr: SocketAddr = crate::loadgen::parse(args.get(1), "address")?;
    let workers: usize = crate::loadgen::parse(args.get(2), "workers")?;
    let secs: f64 = crate::loadgen::parse(args.get(3), "seconds")?;
    let ca = PathBuf::from(args.get(4).context("missing CA file")?);
    let version = TlsVersion::parse(args.get(5).map(String::as_str).unwrap_or(""))?;
    let resume = match args.get(6).map(String::as_str) {
        Some("full") => false,
        Some("resumed") => true,
        _ => bail!("missing full|resumed"),
    };
    let connector = TlsConnector::from(client_config(&ca, version, resume)?);
    if resume {
        for _ in 0..workers {
            one_handshake(addr, &connector, true)
                .await
                .context("the warm-up handshake")?;
        }
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::with_capacity(workers);
    for _ in 0..workers {
        let connector = connector.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::new();
            let mut kinds = Kinds::default();
            while t.room() && t.errors < 1000 {
                let t0 = Instant::now();
                if t0 >= deadline {
                    break;
                }
                match one_handshake(addr, &connector, true).await {
                    Ok(done) => {
                        t.samples_ns.push(t0.elapsed().as_nanos() as u64);
                        kinds.add(done);
                    }
                    Err(e) => {
                        t.fail(e);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            (t, kinds)
        }));
    }
    let mut tallies = Vec::with_capacity(workers);
    let mut kinds = Kinds::default();
    for task in tasks {
        let (t, k) = task.await?;
        tallies.push(t);
        kinds.merge(k);
    }
    let mut json = finish("tls-hs", tallies, start);
    json["full"] = kinds.full.into();
    json["resumed"] = kinds.resumed.into();
    json["hello_retry"] = kinds.retried.into();
    json["negotiated"] = kinds.negotiated.unwrap_or_default().into();
    Ok(json.to_string())
}

/// How one connection's handshake went.
struct Handshake {
    kind: Option<HandshakeKind>,
    /// `TLSv1_3 TLS13_AES_256_GCM_SHA384 X25519`, for the runner to compare across targets.
    negotiated: String,
}

#[derive(Default)]
struct Kinds {
    full: u64,
    resumed: u64,
    retried: u64,
    negotiated: Option<String>,
}

impl Kinds {
    fn add(&mut self, h: Handshake) {
        match h.kind {
            Some(HandshakeKind::Resumed) => self.resumed += 1,
            Some(HandshakeKind::FullWithHelloRetryRequest) => self.retried += 1,
            _ => self.full += 1,
        }
        // A full handshake's group says what a resumed one of TLS 1.2 (no key exchange)
        // would not.
        if self.negotiated.is_none() || h.kind == Some(HandshakeKind::Full) {
            self.negotiated = Some(h.negotiated);
        }
    }

    fn merge(&mut self, other: Kinds) {
        self.full += other.full;
        self.resumed += other.resumed;
        self.retried += other.retried;
        if self.negotiated.is_none() {
            self.negotiated = other.negotiated;
        }
    }
}

/// Connect, handshake, one exchange (when `exchange`), close_notify, close.
async fn one_handshake(
    addr: SocketAddr,
    connector: &TlsConnector,
    exchange: bool,
) -> Result<Handshake> {
    let tcp = connect(addr).await?;
    let name = ServerName::try_from(SERVER_NAME)?;
    let mut tls = timeout(IO_TIMEOUT, connector.connect(name, tcp))
        .await
        .map_err(|_| anyhow!("handshake timed out"))?
        .context("handshake")?;
    let mut reply = [0u8; 1];
    timeout(IO_TIMEOUT, async {
        if exchange {
            tls.write_all(REQUEST).await?;
            tls.read_exact(&mut reply).await?;
        }
        tls.shutdown().await
    })
    .await
    .map_err(|_| anyhow!("exchange timed out"))?
    .context("exchange")?;
    let conn = tls.get_ref().1;
    Ok(Handshake {
        kind: conn.handshake_kind(),
        negotiated: negotiated(conn)?,
    })
}

/// `TLSv1_3 TLS13_AES_256_GCM_SHA384 X25519`: what a connection's handshake settled on.
fn negotiated(conn: &rustls::ClientConnection) -> Result<String> {
    let version = conn
        .protocol_version()
        .ok_or_else(|| anyhow!("no protocol version"))?;
    let suite = conn
        .negotiated_cipher_suite()
        .ok_or_else(|| anyhow!("no cipher suite"))?
        .suite();
    let group = conn
        .negotiated_key_exchange_group()
        .map(|g| format!("{:?}", g.name()))
        .unwrap_or_else(|| "(no key exchange)".into());
    Ok(format!("{version:?} {suite:?} {group}"))
}

/// `--loadgen tls-bulk ADDR SECS CA up|down`: one TLS 1.3 stream moving 16 MiB chunks one
/// way until SECS pass. Prints bytes, seconds and Gbit/s.
pub async fn bulk(args: &[String]) -> Result<String> {
    let addr: SocketAddr = crate::loadgen::parse(args.get(1), "address")?;
    let secs: f64 = crate::loadgen::parse(args.get(2), "seconds")?;
    let ca = PathBuf::from(args.get(3).context("missing CA file")?);
    let upload = match args.get(4).map(String::as_str) {
        Some("up") => true,
        Some("down") => false,
        _ => bail!("missing up|down"),
    };
    let connector = TlsConnector::from(client_config(&ca, TlsVersion::Tls13, false)?);
    let tcp = connect(addr).await?;
    let mut tls = timeout(
        IO_TIMEOUT,
        connector.connect(ServerName::try_from(SERVER_NAME)?, tcp),
    )
    .await
    .map_err(|_| anyhow!("handshake timed out"))??;
    let negotiated = negotiated(tls.get_ref().1)?;
    let mut buf = vec![0x5au8; BUF];
    let mut bytes = 0u64;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    // At least one chunk, however short the run; at most what 600 s could move at 100 GB/s.
    while bytes == 0 || (Instant::now() < deadline && bytes < 60_000 * 1_000_000_000) {
        let mut head = [0u8; 9];
        head[0] = if upload { b'u' } else { b'd' };
        head[1..].copy_from_slice(&CHUNK.to_be_bytes());
        timeout(CHUNK_TIMEOUT, async {
            tls.write_all(&head).await?;
            if upload {
                give(&mut tls, CHUNK, &buf).await?;
                tls.flush().await?;
                let mut ack = [0u8; 8];
                tls.read_exact(&mut ack).await?;
                let got = u64::from_be_bytes(ack);
                if got != CHUNK {
                    bail!("the server counted {got} bytes of a {CHUNK}-byte chunk");
                }
            } else {
                tls.flush().await?;
                take(&mut tls, CHUNK, &mut buf).await?;
            }
            Ok(())
        })
        .await
        .map_err(|_| anyhow!("a {CHUNK}-byte chunk took more than {CHUNK_TIMEOUT:?}"))??;
        bytes += CHUNK;
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = timeout(IO_TIMEOUT, tls.shutdown()).await;
    Ok(serde_json::json!({
        "kind": if upload { "tls-bulk-up" } else { "tls-bulk-down" },
        "bytes": bytes,
        "secs": secs,
        "gbps": bytes as f64 * 8.0 / secs / 1e9,
        "negotiated": negotiated,
    })
    .to_string())
}

/// A TLS listener is up and speaks TLS with the run's certificate: one full TLS 1.3
/// handshake, from the runner (before a row is measured, so that a proxy that listens but
/// does not terminate TLS fails with that said).
pub fn probe(port: u16, ca: &Path) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let connector = TlsConnector::from(client_config(ca, TlsVersion::Tls13, false)?);
        one_handshake(SocketAddr::from(([127, 0, 0, 1], port)), &connector, false)
            .await
            .map(|_| ())
    })
    .with_context(|| format!("no TLS handshake through port {port}"))
}

impl crate::Bench {
    fn ca(&self) -> Result<String> {
        Ok(self
            .certs
            .as_ref()
            .context("no certificates")?
            .ca
            .display()
            .to_string())
    }

    /// Before a proxy's TLS row: [`probe`], failing with the target named.
    pub(crate) fn tls_probe(&self, target: crate::Target, port: u16) -> Result<()> {
        probe(port, Path::new(&self.ca()?))
            .with_context(|| format!("{} does not terminate TLS", target.title()))
    }

    /// One handshake row (full or resumed) through `port`: rate, p99, and the proxy's CPU per
    /// connection; notes when resumption did not happen or a handshake needed a retry, and
    /// what was negotiated (compared across targets when the report is written).
    pub(crate) fn tls_handshakes(
        &mut self,
        metric: crate::Metric,
        target: crate::Target,
        version: TlsVersion,
        resume: bool,
        port: u16,
        pinned: bool,
    ) -> Result<(Vec<(String, f64)>, crate::CpuWork)> {
        let kind = if resume { "resumed" } else { "full" };
        let args = [
            "tls-hs".to_string(),
            crate::addr(port),
            crate::CRR_WORKERS.to_string(),
            self.secs(),
            self.ca()?,
            version.name().to_string(),
            kind.to_string(),
        ];
        let json = self.run_loadgen(&args, pinned)?;
        let r = crate::LoadgenResult::from_json(&json)?;
        let n = |k: &str| json[k].as_f64().unwrap_or(0.0);
        let row = format!("{}_{kind}", metric.name());
        if resume && n("resumed") < 0.99 * r.count {
            self.note(format!(
                "{row} through {}: only {} of {} handshakes resumed a session",
                target.name(),
                n("resumed"),
                r.count
            ));
        }
        if n("hello_retry") > 0.0 {
            self.note(format!(
                "{row} through {}: {} handshakes needed a HelloRetryRequest",
                target.name(),
                n("hello_retry")
            ));
        }
        self.record_negotiated(format!("{} {kind}", metric.name()), target, &json);
        let values = vec![(row.clone(), r.rate), (format!("{row}_p99"), r.p99)];
        Ok((
            values,
            crate::CpuWork::new(format!("cpu_{row}"), r.count, 1e6),
        ))
    }

    fn record_negotiated(&mut self, row: String, target: crate::Target, json: &serde_json::Value) {
        if let Some(negotiated) = json["negotiated"].as_str() {
            self.negotiated
                .entry(row)
                .or_default()
                .insert(target as usize, negotiated.to_string());
        }
    }

    /// One bulk row through `port`: Gbit/s and the proxy's CPU per GB.
    pub(crate) fn tls_bulk(
        &mut self,
        target: crate::Target,
        upload: bool,
        port: u16,
        pinned: bool,
    ) -> Result<(Vec<(String, f64)>, crate::CpuWork)> {
        let way = if upload { "up" } else { "down" };
        let args = [
            "tls-bulk".to_string(),
            crate::addr(port),
            self.secs(),
            self.ca()?,
            way.to_string(),
        ];
        let json = self.run_loadgen(&args, pinned)?;
        let f = |k: &str| json[k].as_f64().ok_or_else(|| anyhow!("no {k} in {json}"));
        let row = format!("tls_bulk_{way}");
        self.record_negotiated(row.clone(), target, &json);
        Ok((
            vec![(row.clone(), f("gbps")?)],
            // ms of CPU per GB (1e9 bytes)
            crate::CpuWork::new(format!("cpu_{row}"), f("bytes")? / 1e9, 1e3),
        ))
    }
}
