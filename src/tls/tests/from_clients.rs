//! Handshakes from clients: failures told apart and blaming no server, the handshake timeout,
//! session resumption across a reload, ALPN, the server's cipher order.

use super::*;

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

/// An HTTP balancer offers `h2` first and `http/1.1`, or `http/1.1` alone with `HTTP2=0`; a
/// TCP balancer offers nothing (a browser on its query interface falls back to none).
#[tokio::test]
async fn alpn_h2_and_http1_only_where_asked() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let files = Files::new();
    let browser = client_with(ca.roots(), |c| {
        c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    });
    let old = client_with(ca.roots(), |c| {
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
    });
    let cases = [
        (true, true, &browser, Some(&b"h2"[..])),
        (true, true, &old, Some(&b"http/1.1"[..])),
        (true, false, &browser, Some(&b"http/1.1"[..])),
        (false, true, &browser, None),
    ];
    for (http, h2, client, expected) in cases {
        let mut settings = files.settings(&leaf.pem, &leaf.key.serialize_pem());
        (settings.alpn_http1, settings.alpn_h2) = (http, h2);
        let tls = load(&settings, &ca).unwrap();
        let (server, client) = handshake(&tls, client.clone(), "broker.test").await;
        let (server, _client) = (server.unwrap(), client.unwrap());
        assert_eq!(
            server.get_ref().1.alpn_protocol(),
            expected,
            "alpn_http1={http} alpn_h2={h2}"
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
