//! What OpenSSL writes and how OpenSSL connects: its key files load, the commands the
//! findings advise work, and `openssl s_client` verifies the chain and resumes (ignored by
//! default: they need the `openssl` command).

use super::*;

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

/// A CA, an RSA leaf it issued, and a directory holding the leaf's key as PKCS#8 (`rsa.pk8`)
/// for `openssl` to rewrite.
fn rsa_leaf_and_its_key() -> (Ca, Leaf, Files) {
    let ca = Ca::new("Test Root CA");
    let rsa = ca.issue(&["broker.test"], &rcgen::PKCS_RSA_SHA256, |_| {});
    let files = Files::new();
    files.write("rsa.pk8", rsa.key.serialize_pem());
    (ca, rsa, files)
}

#[test]
#[ignore = "needs openssl (apt-get install openssl)"]
fn keys_as_openssl_writes_them_load() {
    let (ca, rsa, files) = rsa_leaf_and_its_key();
    let ecdsa = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let dir = files.0.path();
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
}

#[test]
#[ignore = "needs openssl (apt-get install openssl)"]
fn an_old_openssl_encrypted_key_converts_with_the_advised_command() {
    let (ca, rsa, files) = rsa_leaf_and_its_key();
    let dir = files.0.path();
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
}

#[test]
#[ignore = "needs openssl (apt-get install openssl)"]
fn a_der_certificate_converts_with_the_advised_command() {
    let (ca, rsa, files) = rsa_leaf_and_its_key();
    let dir = files.0.path();
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
