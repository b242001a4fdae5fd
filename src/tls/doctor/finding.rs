//! The doctor's report: a [`Finding`] is one line for an operator, naming the key and the file,
//! saying what is wrong and what to do, with its [`Severity`]; [`Findings`] are those that stop
//! a configuration from loading. The words are written here for every kind of finding, those
//! of loading a file ([`crate::tls::files`]) and those of the diagnoses beside this file, so
//! `--check`, start-up and a reload print one kind of line.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::certificate::Presented;
use super::dates::{days, utc};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Worth knowing; nothing is wrong for sure.
    Notice,
    /// Clients will, or soon will, fail; the broker serves anyway.
    Warning,
    /// Nothing can be served with this configuration: the balancer (or the reload) is refused.
    Error,
}

impl Severity {
    /// How a line of this severity starts when printed for an operator.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Notice => "notice",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// The largest PEM file read. A chain of ten certificates is some 20 KiB and Debian's whole CA
/// bundle 220 KiB: anything past 4 MiB is not the file meant, and must not fill memory.
pub const MAX_PEM_FILE: u64 = 4 << 20;

/// What the doctor, or the loading of a file, found: one line naming the key and the file,
/// saying what is wrong and what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Finding {
    /// The file could not be read.
    #[error("{key} {}: cannot be read: {source}{}", path.display(), read_advice(source))]
    Unreadable {
        /// The configuration key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: Arc<std::io::Error>,
    },
    /// The path names a directory, a FIFO, a device.
    #[error("{key} {}: is {what}, not a file", path.display())]
    NotAFile {
        /// The configuration key naming the file.
        key: &'static str,
        /// The path.
        path: PathBuf,
        /// What it is, in words.
        what: &'static str,
    },
    /// Far larger than any PEM file of certificates or keys.
    #[error(
        "{key} {}: is {size} bytes, more than the {} MiB a PEM file of certificates or keys \
         would be; is it the right file?",
        path.display(),
        MAX_PEM_FILE >> 20
    )]
    TooLarge {
        /// The configuration key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
    },
    /// Binary (DER, PKCS#12) or text without a PEM block.
    #[error("{key} {}: {}", path.display(), not_pem_advice(key, path, *binary))]
    NotPem {
        /// The configuration key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Whether it is binary (DER or PKCS#12) rather than text.
        binary: bool,
    },
    /// A PEM block that cannot be decoded.
    #[error("{key} {}: is not valid PEM ({detail}); export it again as PEM", path.display())]
    BadPem {
        /// The configuration key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        detail: String,
    },
    /// No certificate in a file that should hold the chain (or the CA bundle).
    #[error("{key} {}: holds no certificate (-----BEGIN CERTIFICATE-----){}", path.display(), holds(found, key))]
    NoCertificate {
        /// The configuration key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The PEM labels found instead.
        found: Vec<String>,
    },
    /// A certificate block that is not an X.509 certificate.
    #[error(
        "{key} {}: certificate {} of the file cannot be read ({detail}); export it again",
        path.display(),
        index + 1
    )]
    BadCertificate {
        /// The configuration key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Its place in the file, from 0.
        index: usize,
        /// What the parser said.
        detail: String,
    },
    /// No private key in the key file.
    #[error(
        "SSL_KEY {}: holds no private key (-----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC \
         PRIVATE KEY){}",
        path.display(),
        holds(found, "SSL_KEY")
    )]
    NoKey {
        /// The file.
        path: PathBuf,
        /// The PEM labels found instead.
        found: Vec<String>,
    },
    /// A key encrypted the old OpenSSL way (`Proc-Type: 4,ENCRYPTED`), which no maintained
    /// library reads: the operator converts it once.
    #[error(
        "SSL_KEY {old}: is encrypted the old OpenSSL way (Proc-Type: 4,ENCRYPTED), which \
         appbroker does not read; convert it to encrypted PKCS#8 with `openssl pkcs8 -topk8 -v2 \
         aes-256-cbc -in {old} -out {new}` (it asks for the old passphrase, then the new one for \
         SSL_PASSPHRASE) and set SSL_KEY={new}",
        old = .0.display(),
        new = pkcs8_name(.0).display()
    )]
    OldStyleEncryptedKey(PathBuf),
    /// An encrypted key and no passphrase.
    #[error(
        "SSL_KEY {}: is encrypted (ENCRYPTED PRIVATE KEY) and SSL_PASSPHRASE is not set; set it \
         to the key's passphrase",
        .0.display()
    )]
    PassphraseMissing(PathBuf),
    /// The passphrase does not decrypt the key.
    #[error("SSL_KEY {}: SSL_PASSPHRASE does not decrypt it (wrong passphrase)", .0.display())]
    WrongPassphrase(PathBuf),
    /// Encrypted with a scheme appbroker does not implement.
    #[error(
        "SSL_KEY {old}: is encrypted with a scheme appbroker does not read ({detail}); encrypt \
         it again with `openssl pkcs8 -topk8 -v2 aes-256-cbc -in {old} -out {new}` and set \
         SSL_KEY={new}",
        old = path.display(),
        new = pkcs8_name(path).display()
    )]
    UnsupportedEncryption {
        /// The file.
        path: PathBuf,
        /// The scheme, or what the decoder said.
        detail: String,
    },
    /// A key the crypto provider cannot sign with (DSA, an unsupported curve, a broken key).
    #[error(
        "SSL_KEY {}: the key cannot be used ({detail}); appbroker signs with RSA (2048 bits or \
         more), ECDSA P-256 or P-384, and Ed25519 keys",
        path.display()
    )]
    UnusableKey {
        /// The file.
        path: PathBuf,
        /// What the provider said.
        detail: String,
    },
    /// `SSL_PASSPHRASE` is set but the key is not encrypted.
    #[error("SSL_KEY {}: is not encrypted, so SSL_PASSPHRASE is not used", .0.display())]
    PassphraseUnused(PathBuf),
    /// The key is not the certificate's.
    #[error(
        "SSL_KEY {}: does not match the certificate in SSL_CERTIFICATE {}: nothing can be served \
         with them; give the key the certificate was issued for (their public keys must be the \
         same: compare `openssl x509 -noout -pubkey -in CERTIFICATE` with `openssl pkey -pubout \
         -in KEY`)",
        key_path.display(),
        certificate_path.display()
    )]
    KeyMismatch {
        /// The key file.
        key_path: PathBuf,
        /// The certificate file.
        certificate_path: PathBuf,
    },
    /// The key belongs to a later certificate of the file: the broker's own certificate is
    /// not first, so rustls would present another one.
    #[error(
        "SSL_CERTIFICATE {}: the broker's own certificate ({subject}, the one SSL_KEY belongs \
         to) is certificate {} of the file, not the first: order the file leaf first, each \
         certificate followed by its issuer's",
        path.display(),
        index + 1
    )]
    LeafNotFirst {
        /// The certificate file.
        path: PathBuf,
        /// The place of the key's certificate in the file, from 0.
        index: usize,
        /// Its subject.
        subject: String,
    },
    /// Extended key usage without TLS server authentication: most often a client certificate
    /// given as the broker's identity.
    #[error(
        "SSL_CERTIFICATE {}: the certificate for {subject} does not allow TLS server \
         authentication (extended key usage: {usages}){}; clients will refuse it: give the \
         server certificate issued for the broker's name",
        path.display(),
        if *client_only {
            ": it is a client certificate used as the broker's identity"
        } else {
            ""
        }
    )]
    NotForServers {
        /// The certificate file.
        path: PathBuf,
        /// The leaf's subject.
        subject: String,
        /// The usages it allows, in words.
        usages: String,
        /// Whether it allows TLS client authentication (the mix-up named in words).
        client_only: bool,
    },
    /// A CA's certificate as the broker's own.
    #[error(
        "SSL_CERTIFICATE {}: the first certificate ({subject}) is a CA's certificate, not a \
         server's; clients will refuse it: put the broker's own certificate first, followed by \
         its intermediates",
        path.display()
    )]
    CaAsIdentity {
        /// The certificate file.
        path: PathBuf,
        /// The leaf's subject.
        subject: String,
    },
    /// Past its end of validity.
    #[error(
        "SSL_CERTIFICATE {}: the certificate for {subject} expired on {} ({} ago); clients \
         will refuse it: renew it",
        path.display(),
        utc(*not_after),
        days(*ago)
    )]
    Expired {
        /// The certificate file.
        path: PathBuf,
        /// The leaf's subject.
        subject: String,
        /// Its end of validity.
        not_after: SystemTime,
        /// How long ago that was.
        ago: Duration,
    },
    /// Expiring within [`EXPIRY_WARNING_DAYS`](super::EXPIRY_WARNING_DAYS).
    #[error(
        "SSL_CERTIFICATE {}: the certificate for {subject} expires on {} (in {}); renew it \
         before then",
        path.display(),
        utc(*not_after),
        days(*left)
    )]
    ExpiresSoon {
        /// The certificate file.
        path: PathBuf,
        /// The leaf's subject.
        subject: String,
        /// Its end of validity.
        not_after: SystemTime,
        /// How long until then.
        left: Duration,
    },
    /// Before its start of validity.
    #[error(
        "SSL_CERTIFICATE {}: the certificate for {subject} is not valid before {}; clients will \
         refuse it until then (or check this machine's clock)",
        path.display(),
        utc(*not_before)
    )]
    NotYetValid {
        /// The certificate file.
        path: PathBuf,
        /// The leaf's subject.
        subject: String,
        /// Its start of validity.
        not_before: SystemTime,
    },
    /// A certificate of the chain followed by one that is not its issuer.
    #[error(
        "SSL_CERTIFICATE {}: certificate {} of the file ({next}) is not the issuer of \
         certificate {} ({subject}); some clients refuse such a chain: order it leaf first, each \
         certificate followed by its issuer's",
        path.display(),
        index + 2,
        index + 1
    )]
    OutOfOrder {
        /// The certificate file.
        path: PathBuf,
        /// The place of the certificate whose issuer does not follow, from 0.
        index: usize,
        /// Its subject.
        subject: String,
        /// The subject of the certificate that follows it.
        next: String,
    },
    /// The chain stops at a certificate whose issuer is neither in the file nor a root this
    /// machine trusts, and the certificate names where its issuer's certificate is published:
    /// an intermediate left out (`cert.pem` given where `fullchain.pem` was meant).
    #[error(
        "SSL_CERTIFICATE {}: the chain stops at {subject}, issued by {issuer}, which is not in \
         the file: an intermediate certificate is missing (published at {url}); clients that do \
         not have it will refuse the chain: append it to the file after the certificate (a CA's \
         \"full chain\" file has it)",
        path.display()
    )]
    MissingIntermediate {
        /// The certificate file.
        path: PathBuf,
        /// The last certificate's subject.
        subject: String,
        /// Its issuer.
        issuer: String,
        /// Where the issuer's certificate is published (authority information access).
        url: String,
    },
    /// The chain stops at a certificate whose issuer is neither in the file nor a root this
    /// machine trusts: a private CA (fine, when clients trust it) or an intermediate left out.
    #[error(
        "SSL_CERTIFICATE {}: the chain stops at {subject}, issued by {issuer}, which is neither \
         in the file nor a root this machine trusts: if {issuer} is an intermediate CA, append \
         its certificate to the file; if it is your own root CA, clients must trust it",
        path.display()
    )]
    PrivateIssuer {
        /// The certificate file.
        path: PathBuf,
        /// The last certificate's subject.
        subject: String,
        /// Its issuer.
        issuer: String,
    },
    /// A CA bundle in which no certificate can serve as a root.
    #[error(
        "SSL_UPSTREAM_CA {}: none of its certificates can be used as a trusted root ({detail})",
        path.display()
    )]
    UnusableCa {
        /// The CA file.
        path: PathBuf,
        /// What the root store said.
        detail: String,
    },
    /// A certificate of `SSL_UPSTREAM_CA` that is a server's own (self-signed as `openssl
    /// req -x509` makes it, or no CA's at all): trusted when a server presents exactly it.
    #[error(
        "SSL_UPSTREAM_CA {}: {presented} is pinned: a server that presents exactly this \
         certificate is trusted as it is (its CA flag and names are not checked, its dates are){}",
        path.display(),
        if presented.ca { "; as a CA it is trusted too, for any certificate it signed" } else { "" }
    )]
    Pinned {
        /// The CA file.
        path: PathBuf,
        /// The certificate.
        presented: Box<Presented>,
    },
    /// A pinned certificate past its end of validity.
    #[error(
        "SSL_UPSTREAM_CA {}: the pinned certificate {} expired on {} ({} ago); a server \
         presenting it is refused: make the server a new certificate and put it in this file \
         in place of the old one",
        path.display(),
        presented.subject,
        utc(presented.not_after),
        days(*ago)
    )]
    PinnedExpired {
        /// The CA file.
        path: PathBuf,
        /// The certificate.
        presented: Box<Presented>,
        /// How long ago it expired.
        ago: Duration,
    },
    /// Verification asked, no CA given, and the system trusts nothing.
    #[error(
        "SSL_UPSTREAM_VERIFY=1 and SSL_UPSTREAM_CA is not set, but this system has no trusted \
         root certificates ({0}): set SSL_UPSTREAM_CA to the CA that issued the servers' \
         certificates, or install the system's (Debian: ca-certificates)"
    )]
    NoSystemRoots(String),
    /// A server name that cannot be one.
    #[error(
        "SSL_UPSTREAM_SERVER_NAME `{0}` is neither a DNS name nor an IP address; give the name \
         the servers' certificates are issued for"
    )]
    BadServerName(String),
    /// The TLS library refused what the checks before it accepted: a bug to report.
    #[error("{key}: the TLS library refused the configuration ({detail}); please report this")]
    Unexpected {
        /// The key closest to the cause.
        key: &'static str,
        /// What the library said.
        detail: String,
    },
}

impl Finding {
    /// How bad it is.
    pub fn severity(&self) -> Severity {
        use Finding::*;
        match self {
            PassphraseUnused(_) | PrivateIssuer { .. } | Pinned { .. } => Severity::Notice,
            NotForServers { .. }
            | PinnedExpired { .. }
            | CaAsIdentity { .. }
            | Expired { .. }
            | ExpiresSoon { .. }
            | NotYetValid { .. }
            | OutOfOrder { .. }
            | MissingIntermediate { .. } => Severity::Warning,
            Unreadable { .. }
            | NotAFile { .. }
            | TooLarge { .. }
            | NotPem { .. }
            | BadPem { .. }
            | NoCertificate { .. }
            | BadCertificate { .. }
            | NoKey { .. }
            | OldStyleEncryptedKey(_)
            | PassphraseMissing(_)
            | WrongPassphrase(_)
            | UnsupportedEncryption { .. }
            | UnusableKey { .. }
            | KeyMismatch { .. }
            | LeafNotFirst { .. }
            | UnusableCa { .. }
            | NoSystemRoots(_)
            | BadServerName(_)
            | Unexpected { .. } => Severity::Error,
        }
    }

    /// The configuration key the finding is about (the one to fix).
    pub fn key(&self) -> &'static str {
        use Finding::*;
        match self {
            Unreadable { key, .. }
            | NotAFile { key, .. }
            | TooLarge { key, .. }
            | NotPem { key, .. }
            | BadPem { key, .. }
            | NoCertificate { key, .. }
            | BadCertificate { key, .. }
            | Unexpected { key, .. } => key,
            NoKey { .. }
            | OldStyleEncryptedKey(_)
            | UnsupportedEncryption { .. }
            | UnusableKey { .. }
            | PassphraseUnused(_)
            | KeyMismatch { .. } => "SSL_KEY",
            PassphraseMissing(_) | WrongPassphrase(_) => "SSL_PASSPHRASE",
            NotForServers { .. }
            | CaAsIdentity { .. }
            | Expired { .. }
            | ExpiresSoon { .. }
            | NotYetValid { .. }
            | OutOfOrder { .. }
            | LeafNotFirst { .. }
            | MissingIntermediate { .. }
            | PrivateIssuer { .. } => "SSL_CERTIFICATE",
            UnusableCa { .. } | Pinned { .. } | PinnedExpired { .. } => "SSL_UPSTREAM_CA",
            NoSystemRoots(_) => "SSL_UPSTREAM_VERIFY",
            BadServerName(_) => "SSL_UPSTREAM_SERVER_NAME",
        }
    }
}

/// Findings that stop a configuration from loading: every one found (errors and the warnings
/// beside them), one per line.
#[derive(Debug)]
pub struct Findings(pub Vec<Finding>);

impl Findings {
    /// Whether any of them is an [`Severity::Error`].
    pub fn has_errors(&self) -> bool {
        self.0.iter().any(|f| f.severity() == Severity::Error)
    }
}

impl From<Finding> for Findings {
    fn from(finding: Finding) -> Self {
        Findings(vec![finding])
    }
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, finding) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}: {finding}", finding.severity().as_str())?;
        }
        Ok(())
    }
}

impl std::error::Error for Findings {}

/// What to do about an unreadable file, by what the system said.
fn read_advice(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::NotFound => {
            "; check the path (a relative one is taken from the broker's working directory)"
        }
        std::io::ErrorKind::PermissionDenied => "; let the broker's user read it",
        _ => "",
    }
}

/// What to do with a file that is not PEM, by which file it is.
fn not_pem_advice(key: &str, path: &Path, binary: bool) -> String {
    let p = path.display();
    match (binary, key) {
        (false, _) => "holds no PEM block (-----BEGIN ...-----); give a PEM file".to_string(),
        (true, "SSL_KEY") => format!(
            "is binary (DER, or a PKCS#12 .pfx/.p12), not PEM: convert it with `openssl pkey \
             -inform der -in {p} -out key.pem` (a DER key) or `openssl pkcs12 -in {p} -nocerts \
             -out key.pem` (a .pfx)"
        ),
        (true, _) => format!(
            "is binary (DER, or a PKCS#12 .pfx/.p12), not PEM: convert it with `openssl x509 \
             -inform der -in {p} -out cert.pem` (a DER certificate) or `openssl pkcs12 -in {p} \
             -nokeys -out cert.pem` (a .pfx)"
        ),
    }
}

/// What a file holds instead of what was asked, and the likely mix-up.
fn holds(found: &[String], key: &str) -> String {
    if found.is_empty() {
        return String::new();
    }
    let swapped = match key {
        "SSL_KEY" => found.iter().any(|l| l == "CERTIFICATE"),
        _ => found.iter().any(|l| l.ends_with("PRIVATE KEY")),
    };
    format!(
        "; it holds {}{}",
        found.join(", "),
        if swapped {
            ": are SSL_CERTIFICATE and SSL_KEY swapped?"
        } else {
            ""
        }
    )
}

/// Where the converted key of an old-style encrypted one could go: `x.key` -> `x.pk8.key`.
fn pkcs8_name(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(|| "key".into(), |s| s.to_string_lossy().into_owned());
    let ext = path
        .extension()
        .map_or_else(|| "pem".into(), |e| e.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}.pk8.{ext}"))
}
