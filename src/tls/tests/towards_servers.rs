//! Handshakes towards servers (`SSL_ENCRYPT_UPSTREAM`): verification that passes or says why
//! not, pinned certificates, refusals in words, settings that cannot work, the system's roots.

use super::*;

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

/// What the verification tests reach: a server with a good certificate from `ca`, one with an
/// expired one, and the broker's connector trusting `ca`.
struct Verifying {
    ca: Ca,
    files: Files,
    good_server: ServerTls,
    expired_server: ServerTls,
    trusting: UpstreamTls,
    /// Kept so the expired server's files outlive it.
    _expired_files: Files,
}

fn verifying() -> Verifying {
    let ca = Ca::new("AppServer CA");
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
    Verifying {
        ca,
        files,
        good_server,
        expired_server,
        trusting,
        _expired_files,
    }
}

/// Why the broker's side of a handshake failed, which it must have.
fn failure<T: std::fmt::Debug>(result: Result<T, HandshakeFailure>) -> HandshakeFailure {
    result.expect_err("the handshake fails")
}

#[tokio::test]
async fn upstream_verification_passes_with_a_trusted_ca_by_name_and_by_address() {
    let Verifying {
        good_server,
        trusting,
        ..
    } = verifying();
    // Trusted CA, by name and by IP address.
    for host in ["app1.test", "127.0.0.1"] {
        let (server, client) = upstream(&good_server, &trusting, host).await;
        exchange(server.unwrap(), client.unwrap()).await;
        assert!(trusting.warning().is_none());
    }
}

#[tokio::test]
async fn upstream_verification_with_the_wrong_ca_says_what_was_presented_and_trusted() {
    let Verifying {
        files, good_server, ..
    } = verifying();
    let other_ca = Ca::new("Some Other CA");
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
}

#[tokio::test]
async fn upstream_verification_of_the_wrong_name_says_so_and_server_name_mends_it() {
    let Verifying {
        ca,
        files,
        good_server,
        trusting,
        ..
    } = verifying();
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
}

#[tokio::test]
async fn upstream_verification_of_an_expired_certificate_says_when_and_what_to_do() {
    let Verifying {
        expired_server,
        trusting,
        ..
    } = verifying();
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
}

#[tokio::test]
async fn a_server_port_that_does_not_speak_tls_is_told_apart() {
    let Verifying { trusting, .. } = verifying();
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
}

#[tokio::test]
async fn upstream_verification_off_lets_anything_through_and_warns() {
    let Verifying {
        files,
        good_server,
        expired_server,
        ..
    } = verifying();
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
