//! Server-side cost of a TLS handshake under rustls' two crypto providers, aws-lc-rs and ring:
//! the measurement behind appbroker's choice
//! (docs/decisions/2026-11-30-tls-crypto-provider.md).
//!
//! Client and server run in this one thread over memory buffers, so no socket, scheduler or
//! load generator enters the figure. Only the server's work is counted: the thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) around each call into the server connection, which includes
//! creating it. Under callgrind, the same calls all go through [`server_step`], so
//! `--toggle-collect='*server_step*'` counts the server's instructions alone.
//!
//! ```text
//! cargo run --release --manifest-path benches/tls-providers/Cargo.toml -- [ROUNDS] [HANDSHAKES]
//! ```
//! Each round measures every case once, in turn, so a neighbour's load on a shared machine
//! spreads over all of them rather than falling on one.

use std::sync::Arc;
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use rustls::client::Resumption;
use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::ServerSessionMemoryCache;
use rustls::{ClientConfig, ClientConnection, HandshakeKind, RootCertStore, ServerConfig};
use rustls::{ServerConnection, SupportedProtocolVersion};

/// The broker's identity for one key type: CA certificate, leaf chain and key.
struct Identity {
    name: &'static str,
    ca: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivatePkcs8KeyDer<'static>,
}

fn identity(name: &'static str, algorithm: &'static rcgen::SignatureAlgorithm) -> Identity {
    let ca_key = rcgen::KeyPair::generate_for(algorithm).expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate_for(algorithm).expect("leaf key");
    let leaf = rcgen::CertificateParams::new(vec!["broker.test".to_string()])
        .expect("leaf params")
        .signed_by(&key, &issuer)
        .expect("leaf certificate");
    Identity {
        name,
        ca: ca.der().clone(),
        chain: vec![leaf.der().clone()],
        key: PrivatePkcs8KeyDer::from(key.serialize_der()),
    }
}

/// One provider, as the broker would configure it, with the key exchange the case asks for.
fn provider(which: &str, kx: &'static dyn SupportedKxGroup) -> Arc<CryptoProvider> {
    let mut provider = match which {
        "aws-lc-rs" => rustls::crypto::aws_lc_rs::default_provider(),
        _ => rustls::crypto::ring::default_provider(),
    };
    provider.kx_groups = vec![kx];
    Arc::new(provider)
}

fn server_config(
    which: &str,
    provider: Arc<CryptoProvider>,
    id: &Identity,
    versions: &[&'static SupportedProtocolVersion],
) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(id.chain.clone(), PrivateKeyDer::Pkcs8(id.key.clone_key()))
        .expect("server config");
    config.session_storage = ServerSessionMemoryCache::new(20_000);
    config.ticketer = match which {
        "aws-lc-rs" => rustls::crypto::aws_lc_rs::Ticketer::new(),
        _ => rustls::crypto::ring::Ticketer::new(),
    }
    .expect("ticketer");
    Arc::new(config)
}

/// The client: always aws-lc-rs, so the client's side is the same whichever server is measured
/// (its cost is not counted anyway), offering only the case's key exchange group.
fn client_config(
    id: &Identity,
    versions: &[&'static SupportedProtocolVersion],
    kx: &'static dyn SupportedKxGroup,
    resumed: bool,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(id.ca.clone()).expect("root");
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![kx];
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = if resumed {
        Resumption::in_memory_sessions(64)
    } else {
        Resumption::disabled()
    };
    Arc::new(config)
}

fn thread_cpu() -> Duration {
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).expect("thread CPU clock");
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

/// Every call into the server goes through here: timed, and visible to callgrind by name.
#[inline(never)]
fn server_step<T>(spent: &mut Duration, f: impl FnOnce() -> T) -> T {
    let start = thread_cpu();
    let out = f();
    *spent += thread_cpu() - start;
    out
}

/// One handshake in memory, returning how it went; the server's CPU time is added to `spent`.
fn handshake(
    server_config: &Arc<ServerConfig>,
    client_config: &Arc<ClientConfig>,
    spent: &mut Duration,
) -> HandshakeKind {
    let name = ServerName::try_from("broker.test").expect("name");
    let mut client = ClientConnection::new(client_config.clone(), name).expect("client");
    let mut server = server_step(spent, || ServerConnection::new(server_config.clone()))
        .expect("server");
    let mut buf = Vec::with_capacity(16 * 1024);
    // Until both are done, then once more so the client takes the server's session tickets.
    for _ in 0..10 {
        buf.clear();
        while client.wants_write() {
            client.write_tls(&mut buf).expect("client write");
        }
        if !buf.is_empty() {
            server_step(spent, || {
                let mut rd = &buf[..];
                while !rd.is_empty() {
                    server.read_tls(&mut rd).expect("server read");
                    server.process_new_packets().expect("server handshake");
                }
            });
        }
        buf.clear();
        server_step(spent, || {
            while server.wants_write() {
                server.write_tls(&mut buf).expect("server write");
            }
        });
        if !buf.is_empty() {
            let mut rd = &buf[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).expect("client read");
                client.process_new_packets().expect("client handshake");
            }
        }
        if !client.is_handshaking() && !server.is_handshaking() && !server.wants_write() {
            break;
        }
    }
    assert!(!client.is_handshaking() && !server.is_handshaking());
    server.handshake_kind().expect("handshake kind")
}

struct Case {
    provider: &'static str,
    key: usize,
    kx: &'static str,
    version: &'static str,
    resumed: bool,
}

fn main() {
    let mut args = std::env::args().skip(1);
    if matches!(args.next().as_deref(), Some("--help" | "-h")) {
        println!("usage: tls-providers [ROUNDS=5] [HANDSHAKES=2000] [FILTER]");
        return;
    }
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(5, |a| a.parse().expect("ROUNDS"));
    let count: usize = args.next().map_or(2000, |a| a.parse().expect("HANDSHAKES"));
    let filter = args.next().unwrap_or_default();

    let ids = [
        identity("ECDSA P-256", &rcgen::PKCS_ECDSA_P256_SHA256),
        identity("RSA 2048", &rcgen::PKCS_RSA_SHA256),
    ];
    let mut cases = Vec::new();
    for key in 0..ids.len() {
        for resumed in [false, true] {
            for (version, kx) in [("1.3", "X25519"), ("1.2", "X25519"), ("1.3", "X25519MLKEM768")]
            {
                for provider in ["aws-lc-rs", "ring"] {
                    if provider == "ring" && kx == "X25519MLKEM768" {
                        continue; // ring has no ML-KEM
                    }
                    cases.push(Case {
                        provider,
                        key,
                        kx,
                        version,
                        resumed,
                    });
                }
            }
        }
    }
    let label = |c: &Case| {
        format!(
            "{:<9} {:<11} TLS {} {:<14} {}",
            c.provider,
            ids[c.key].name,
            c.version,
            c.kx,
            if c.resumed { "resumed" } else { "full" }
        )
    };
    cases.retain(|c| label(c).contains(&filter));

    let mut results: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (case, samples) in cases.iter().zip(&mut results) {
            let kx: &'static dyn SupportedKxGroup = match (case.provider, case.kx) {
                ("aws-lc-rs", "X25519") => rustls::crypto::aws_lc_rs::kx_group::X25519,
                ("aws-lc-rs", _) => rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768,
                _ => rustls::crypto::ring::kx_group::X25519,
            };
            let versions: &[&'static SupportedProtocolVersion] = match case.version {
                "1.3" => &[&rustls::version::TLS13],
                _ => &[&rustls::version::TLS12],
            };
            let id = &ids[case.key];
            let server = server_config(case.provider, provider(case.provider, kx), id, versions);
            // The client offers the case's group too.
            let client_kx: &'static dyn SupportedKxGroup = match case.kx {
                "X25519" => rustls::crypto::aws_lc_rs::kx_group::X25519,
                _ => rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768,
            };
            let client = client_config(id, versions, client_kx, case.resumed);
            let mut warm = Duration::ZERO;
            // Warm-up (and the first ticket for the resumed cases).
            for _ in 0..20 {
                handshake(&server, &client, &mut warm);
            }
            let mut spent = Duration::ZERO;
            for _ in 0..count {
                let kind = handshake(&server, &client, &mut spent);
                let want_resumed = case.resumed;
                assert_eq!(kind == HandshakeKind::Resumed, want_resumed, "{}", label(case));
            }
            samples.push(spent.as_secs_f64() * 1e6 / count as f64);
        }
    }
    println!(
        "server CPU per handshake, µs (median of {rounds} rounds of {count}; min-max), and \
         handshakes per server CPU-second"
    );
    for (case, samples) in cases.iter().zip(&mut results) {
        samples.sort_by(f64::total_cmp);
        let median = samples[samples.len() / 2];
        println!(
            "{}  {:>8.1} µs  ({:.1}-{:.1})  {:>8.0}/s",
            label(case),
            median,
            samples[0],
            samples[samples.len() - 1],
            1e6 / median
        );
    }
}
