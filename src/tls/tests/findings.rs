//! The doctor's findings on a loaded identity: a key that is not the certificate's, a
//! certificate not for servers, expiry, the chain's order and gaps, the summary.

use super::*;

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
