//! The configuration doctor: what the broker's certificate and key, and the certificates it
//! trusts towards servers, mean for the connections they serve, told before a client or a
//! server finds out. Each diagnosis is a pure function of what was loaded, the time and the
//! roots this machine trusts, and returns [`Finding`]s, one line each, naming the key and the
//! file. Files that cannot be loaded at all are reported in the same words
//! ([`super::files`]), so `--check`, start-up and a reload print one kind of line.
//!
//! - `identity`: the broker's own certificate and key ([`diagnose`]): the key is not the
//!   certificate's (an error: nothing can be served with the pair); the certificate is not for
//!   TLS servers (a client certificate used as the broker's identity: the mix-up of a TIBCO
//!   EMS fault-tolerant pair, where the client-side `ft_ssl_` files held server certificates
//!   and every connection between the pair failed), or is a CA's; it has expired, expires
//!   within [`EXPIRY_WARNING_DAYS`] or is not valid yet (warnings, never a refusal to start:
//!   one expired certificate must not take every other balancer down); the chain is out of
//!   order, or stops short of a root (an intermediate missing).
//! - `upstream_ca`: upstream trust ([`pinned`]): a certificate of `SSL_UPSTREAM_CA` that is a
//!   server's own is pinned (a notice), and past its end of validity a warning (servers
//!   presenting it are refused).
//! - `finding`: the report: each [`Finding`] in words, its [`Severity`] and key, and the
//!   [`Findings`] that stop a configuration from loading.
//! - `certificate`: certificates described for people: the broker's own for the status page
//!   and METRICS ([`CertificateSummary`], [`summarize`]), any one in a log line
//!   ([`Presented`]).
//! - `dates`: times as certificates hold them and as operators read them.

mod certificate;
mod dates;
mod finding;
mod identity;
mod upstream_ca;

pub use certificate::{CertificateSummary, Presented, summarize};
pub(crate) use dates::utc;
pub use finding::{Finding, Findings, MAX_PEM_FILE, Severity};
pub use identity::{EXPIRY_WARNING_DAYS, Identity, diagnose};
pub use upstream_ca::pinned;
