//! PEM files to certificates and keys: the broker's chain (`SSL_CERTIFICATE`, leaf first), its
//! key (`SSL_KEY`: PKCS#8, PKCS#1 or SEC1; encrypted PKCS#8 with `SSL_PASSPHRASE`) and the
//! upstream CA bundle (`SSL_UPSTREAM_CA`). Each way a file can be wrong is a [`Finding`] that
//! says what the file holds and what to do.
//!
//! PEM is read with rustls-pki-types' parser (the one rustls itself uses; rustls-pemfile, its
//! predecessor, is no longer maintained), except the `ENCRYPTED PRIVATE KEY` block, which
//! that parser skips: the pkcs8 crate decodes and decrypts it (PBES2: PBKDF2 or scrypt with
//! AES-CBC, what `openssl pkcs8 -topk8` has written since OpenSSL 1.1).

use std::fmt;
use std::io::Read;
use std::path::Path;

use pkcs8::der::Decode;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::doctor::{Finding, MAX_PEM_FILE};

/// `SSL_PASSPHRASE` (and `SESSION_SECRET`): kept out of every printout. Its `Debug` and
/// `Display` show `(set)`, so a configuration dump, a log line or a panic message cannot leak
/// it.
#[derive(Clone, PartialEq, Eq)]
pub struct Passphrase(String);

impl Passphrase {
    /// Wraps the value as written (an empty value in a TOTVS file means "not set": the caller
    /// passes `None` then).
    pub fn new(value: impl Into<String>) -> Self {
        Passphrase(value.into())
    }

    /// The secret's bytes, for the one use it is for (decrypting the key, keying the session
    /// cookie's MAC); never to be printed.
    pub fn expose(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(set)")
    }
}

impl fmt::Display for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(set)")
    }
}

/// A file's bytes, refusing what is not a regular file or is larger than [`MAX_PEM_FILE`].
pub fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, Finding> {
    let failed = |source| Finding::Unreadable {
        key,
        path: path.to_path_buf(),
        source: std::sync::Arc::new(source),
    };
    // Checked before opening: opening a FIFO would wait for a writer.
    let metadata = std::fs::metadata(path).map_err(failed)?;
    if !metadata.is_file() {
        let what = if metadata.is_dir() {
            "a directory"
        } else {
            "not a regular file (a FIFO, socket or device)"
        };
        return Err(Finding::NotAFile {
            key,
            path: path.to_path_buf(),
            what,
        });
    }
    let too_large = |size| Finding::TooLarge {
        key,
        path: path.to_path_buf(),
        size,
    };
    if metadata.len() > MAX_PEM_FILE {
        return Err(too_large(metadata.len()));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_PEM_FILE + 1).read_to_end(&mut bytes))
        .map_err(failed)?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(too_large(bytes.len() as u64)); // it grew while being read
    }
    Ok(bytes)
}

/// The certificates of a PEM file, in file order; at least one, each a parsable X.509
/// certificate.
pub fn certificates(
    key: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, Finding> {
    require_pem(key, path, pem)?;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Finding::BadPem {
            key,
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Finding::NoCertificate {
            key,
            path: path.to_path_buf(),
            found: labels(pem),
        });
    }
    for (index, cert) in certs.iter().enumerate() {
        if let Err(e) = x509_parser::parse_x509_certificate(cert) {
            return Err(Finding::BadCertificate {
                key,
                path: path.to_path_buf(),
                index,
                detail: e.to_string(),
            });
        }
    }
    Ok(certs)
}

/// A private key as it was read: the DER, and whether it was encrypted.
#[derive(Debug)]
pub struct KeyFile {
    /// PKCS#8, PKCS#1 or SEC1 DER (an encrypted key, decrypted).
    pub der: PrivateKeyDer<'static>,
    /// Whether the file held it encrypted.
    pub encrypted: bool,
}

/// The first private key of a PEM file (`SSL_KEY`), decrypted with `passphrase` when it is
/// encrypted PKCS#8.
pub fn private_key(
    path: &Path,
    pem: &[u8],
    passphrase: Option<&Passphrase>,
) -> Result<KeyFile, Finding> {
    // Before anything else: its base64 carries header lines no PEM parser reads, and the
    // operator needs the conversion command, not "invalid base64".
    if contains(pem, b"Proc-Type: 4,ENCRYPTED") {
        return Err(Finding::OldStyleEncryptedKey(path.to_path_buf()));
    }
    require_pem("SSL_KEY", path, pem)?;
    if let Some(block) = pem_block(pem, "ENCRYPTED PRIVATE KEY") {
        let Some(passphrase) = passphrase else {
            return Err(Finding::PassphraseMissing(path.to_path_buf()));
        };
        return decrypt(path, block, passphrase).map(|der| KeyFile {
            der: PrivateKeyDer::Pkcs8(der),
            encrypted: true,
        });
    }
    match PrivateKeyDer::from_pem_slice(pem) {
        Ok(der) => Ok(KeyFile {
            der,
            encrypted: false,
        }),
        Err(rustls::pki_types::pem::Error::NoItemsFound) => Err(Finding::NoKey {
            path: path.to_path_buf(),
            found: labels(pem),
        }),
        Err(e) => Err(Finding::BadPem {
            key: "SSL_KEY",
            path: path.to_path_buf(),
            detail: e.to_string(),
        }),
    }
}

/// Decrypts an `ENCRYPTED PRIVATE KEY` block (its PEM text, from BEGIN to END).
fn decrypt(
    path: &Path,
    block: &[u8],
    passphrase: &Passphrase,
) -> Result<PrivatePkcs8KeyDer<'static>, Finding> {
    let unsupported = |detail: String| Finding::UnsupportedEncryption {
        path: path.to_path_buf(),
        detail,
    };
    let bad_pem = |detail: String| Finding::BadPem {
        key: "SSL_KEY",
        path: path.to_path_buf(),
        detail,
    };
    let text = std::str::from_utf8(block).map_err(|e| bad_pem(e.to_string()))?;
    let (_, der) =
        pkcs8::der::pem::decode_vec(text.as_bytes()).map_err(|e| bad_pem(e.to_string()))?;
    let info =
        pkcs8::EncryptedPrivateKeyInfo::from_der(&der).map_err(|e| bad_pem(e.to_string()))?;
    match info.decrypt(passphrase.expose()) {
        // A wrong passphrase fails the padding check, except about once in 256 tries, when it
        // yields garbage instead (which pkcs8 may already refuse as DER, `Asn1`): that is the
        // same mistake, so it gets the same words.
        Ok(plain) if pkcs8::PrivateKeyInfo::from_der(plain.as_bytes()).is_ok() => {
            Ok(PrivatePkcs8KeyDer::from(plain.as_bytes().to_vec()))
        }
        // pkcs5 0.7 reports a failed padding check on decryption as `EncryptFailed`.
        Ok(_)
        | Err(pkcs8::Error::Asn1(_))
        | Err(pkcs8::Error::EncryptedPrivateKey(
            pkcs8::pkcs5::Error::DecryptFailed | pkcs8::pkcs5::Error::EncryptFailed,
        )) => Err(Finding::WrongPassphrase(path.to_path_buf())),
        Err(e) => Err(unsupported(format!(
            "{e}, {}",
            info.encryption_algorithm.oid()
        ))),
    }
}

/// Refuses a file without any PEM block, telling binary (DER, PKCS#12) from other text.
fn require_pem(key: &'static str, path: &Path, bytes: &[u8]) -> Result<(), Finding> {
    if contains(bytes, b"-----BEGIN ") {
        return Ok(());
    }
    // DER and PKCS#12 start with a SEQUENCE (0x30); text has no control bytes but blanks.
    let binary = bytes.first() == Some(&0x30)
        || bytes
            .iter()
            .take(512)
            .any(|b| b.is_ascii_control() && !b.is_ascii_whitespace());
    Err(Finding::NotPem {
        key,
        path: path.to_path_buf(),
        binary,
    })
}

/// The labels of a PEM file's blocks (`CERTIFICATE`, `PRIVATE KEY`, ...), for saying what a
/// file holds instead of what was asked.
fn labels(pem: &[u8]) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for line in pem.split(|b| *b == b'\n') {
        let line = String::from_utf8_lossy(line);
        if let Some(label) = line
            .trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
            && !found.iter().any(|f| f == label)
        {
            found.push(label.to_string());
        }
    }
    found
}

/// The PEM text of the first block with this label, from its BEGIN line through its END line.
fn pem_block<'a>(pem: &'a [u8], label: &str) -> Option<&'a [u8]> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = find(pem, begin.as_bytes())?;
    let stop = start + find(&pem[start..], end.as_bytes())? + end.len();
    Some(&pem[start..stop])
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
