//! A balancer's certificate and key loaded: every key format, passphrases, files that are
//! wrong and what they are told to be, and `SSL_METHOD`'s values.

use super::*;

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
        alpn_h2: false,
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
