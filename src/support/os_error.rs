//! What an operating-system error means to an operator: the words, the errno name, the Windows
//! code a TOTVS broker operator knows, and whether it points at the network, at configuration,
//! at the server itself or at the broker's own resources (the TOTVS broker note classifies
//! them the same way, the server aside), which the log line says as whose side the cause is
//! on.

use std::fmt;
use std::io;

/// Where an error points, which decides what the operator should look at and whether a server
/// is blamed for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointsAt {
    /// Infrastructure: cables, routes, firewalls, a host that is down.
    Network,
    /// Configuration or operation: nothing listening, a wrong address or port.
    Configuration,
    /// The server itself: it took the connection, then failed it (closed it before taking a
    /// request, broke off its TLS handshake). Its own log says why.
    Server,
    /// The broker's own limits (descriptors, local ports, memory): no server is to blame.
    Broker,
}

impl PointsAt {
    /// Whose side the cause is on, in words an operator reads without our vocabulary; the end
    /// of the log line (`...: the server is down, or the address or port is wrong; the cause
    /// is on the server's side or in the configuration, not the broker's`).
    pub fn whose_side(self) -> &'static str {
        match self {
            PointsAt::Network => {
                "the cause is on the way to the server (its host, the network, a firewall), \
                 not the broker's"
            }
            PointsAt::Configuration => {
                "the cause is on the server's side or in the configuration, not the broker's"
            }
            PointsAt::Server => "the cause is on the server's side, not the broker's",
            PointsAt::Broker => "the cause is the broker's own, not the server's",
        }
    }
}

/// An OS error explained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explained {
    /// The error in words (`connection refused`).
    pub words: String,
    /// The errno name (`ECONNREFUSED`), when there is one.
    pub errno: Option<&'static str>,
    /// The Windows/Winsock codes for the same condition (`10061/1225`).
    pub windows: Option<&'static str>,
    /// What it points at.
    pub points_at: PointsAt,
    /// What to check, in one short sentence.
    pub advice: &'static str,
}

impl fmt::Display for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.words)?;
        match (self.errno, self.windows) {
            (Some(e), Some(w)) => write!(f, " ({e}, Windows {w})")?,
            (Some(e), None) => write!(f, " ({e})")?,
            (None, Some(w)) => write!(f, " (Windows {w})")?,
            (None, None) => {}
        }
        write!(f, ": {}; {}", self.advice, self.points_at.whose_side())
    }
}

/// Explains an error met while connecting to a server.
pub fn explain_connect(error: &io::Error) -> Explained {
    // Our own connect timeout carries no OS code; it is the same condition as ETIMEDOUT.
    let errno =
        errno_name(error).or((error.kind() == io::ErrorKind::TimedOut).then_some("ETIMEDOUT"));
    let (windows, points_at, advice) = on_the_way(error.kind())
        .or_else(|| broker_limit(error.kind(), errno))
        .unwrap_or_else(|| match error.kind() {
            io::ErrorKind::NotFound => (
                Some("11001"),
                PointsAt::Configuration,
                "the host name could not be resolved: check the name in the configuration and DNS",
            ),
            _ => (None, PointsAt::Network, "unexpected error while connecting"),
        });
    Explained {
        words: words(error),
        errno,
        windows,
        points_at,
        advice,
    }
}

/// What a connect's error means: the Windows codes, what it points at, the advice.
type Meaning = (Option<&'static str>, PointsAt, &'static str);

/// A connect refused, or lost on the way to the server: told by the error's kind alone.
fn on_the_way(kind: io::ErrorKind) -> Option<Meaning> {
    use io::ErrorKind::*;
    Some(match kind {
        ConnectionRefused => (
            Some("10061/1225"),
            PointsAt::Configuration,
            "nothing is listening on that port: the server is down, or the address or port is wrong",
        ),
        TimedOut => (
            Some("121/10060"),
            PointsAt::Network,
            "the server gave no sign of life: check that the host is up and the network path and firewalls between",
        ),
        NetworkDown => (
            Some("10050"),
            PointsAt::Network,
            "the broker's own network interface is down",
        ),
        NetworkUnreachable => (
            Some("10051"),
            PointsAt::Network,
            "no route to that network: check routes, or the server address in the configuration",
        ),
        HostUnreachable => (
            Some("10065"),
            PointsAt::Network,
            "no route to that host: check that it is up and reachable, or the address in the configuration",
        ),
        ConnectionReset => (
            Some("10054"),
            PointsAt::Network,
            "the server or something between reset the connection",
        ),
        ConnectionAborted => (
            Some("10053"),
            PointsAt::Network,
            "the connection was aborted on the way",
        ),
        PermissionDenied => (
            Some("10013"),
            PointsAt::Network,
            "a local firewall rule refused the connection",
        ),
        _ => return None,
    })
}

/// The broker's own limits met by a connect (local ports, descriptors, buffer memory): told by
/// the errno where the kind is too vague.
fn broker_limit(kind: io::ErrorKind, errno: Option<&str>) -> Option<Meaning> {
    use io::ErrorKind::*;
    Some(match (kind, errno) {
        (AddrNotAvailable, _) | (_, Some("EADDRNOTAVAIL")) => (
            Some("10049"),
            PointsAt::Broker,
            "the broker has run out of local ports for outgoing connections",
        ),
        (_, Some("EMFILE" | "ENFILE")) => (
            Some("10024"),
            PointsAt::Broker,
            "the broker has run out of file descriptors (raise LimitNOFILE)",
        ),
        (_, Some("ENOBUFS")) | (OutOfMemory, _) | (_, Some("ENOMEM")) => (
            Some("10055"),
            PointsAt::Broker,
            "the broker's machine is out of socket buffer memory",
        ),
        _ => return None,
    })
}

/// Explains an error met while binding a listening port.
pub fn explain_bind(error: &io::Error, port: u16) -> String {
    let errno = errno_name(error);
    let (windows, advice) = match error.kind() {
        io::ErrorKind::AddrInUse => (
            Some("10048"),
            format!("another process holds port {port}; find it with `ss -ltnp 'sport = :{port}'`"),
        ),
        io::ErrorKind::PermissionDenied => (
            Some("10013"),
            "ports below 1024 need root or CAP_NET_BIND_SERVICE (docs/operations.md)".to_string(),
        ),
        io::ErrorKind::AddrNotAvailable => (
            Some("10049"),
            "LOCAL_SERVER_ADDRESS is not an address of this machine".to_string(),
        ),
        _ => (
            None,
            "check LOCAL_SERVER_ADDRESS and LOCAL_SERVER_PORT".to_string(),
        ),
    };
    let codes = match (errno, windows) {
        (Some(e), Some(w)) => format!(" ({e}, Windows {w})"),
        (Some(e), None) => format!(" ({e})"),
        _ => String::new(),
    };
    format!("{}{codes}; {advice}", words(error))
}

/// The error in plain lower-case words, without Rust's " (os error N)" suffix.
pub fn words(error: &io::Error) -> String {
    let text = error.to_string();
    let text = match text.find(" (os error") {
        Some(at) => &text[..at],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The errno name of an OS error (`ECONNREFUSED`), when it has one.
#[cfg(unix)]
pub fn errno_name(error: &io::Error) -> Option<&'static str> {
    let errno = nix::errno::Errno::from_raw(error.raw_os_error()?);
    KNOWN.iter().find(|(e, _)| *e == errno).map(|(_, n)| *n)
}

/// Windows has no errno names; its codes are printed instead.
#[cfg(not(unix))]
pub fn errno_name(_error: &io::Error) -> Option<&'static str> {
    None
}

/// The errors worth a name in an operator's log line.
#[cfg(unix)]
const KNOWN: &[(nix::errno::Errno, &str)] = {
    use nix::errno::Errno::*;
    &[
        (ECONNREFUSED, "ECONNREFUSED"),
        (ETIMEDOUT, "ETIMEDOUT"),
        (ENETDOWN, "ENETDOWN"),
        (ENETUNREACH, "ENETUNREACH"),
        (EHOSTUNREACH, "EHOSTUNREACH"),
        (EHOSTDOWN, "EHOSTDOWN"),
        (ECONNRESET, "ECONNRESET"),
        (ECONNABORTED, "ECONNABORTED"),
        (EPIPE, "EPIPE"),
        (EADDRINUSE, "EADDRINUSE"),
        (EADDRNOTAVAIL, "EADDRNOTAVAIL"),
        (EACCES, "EACCES"),
        (EPERM, "EPERM"),
        (EMFILE, "EMFILE"),
        (ENFILE, "ENFILE"),
        (ENOBUFS, "ENOBUFS"),
        (ENOMEM, "ENOMEM"),
        (EINVAL, "EINVAL"),
    ]
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_points_at_configuration_with_both_windows_codes() {
        let e = io::Error::from(io::ErrorKind::ConnectionRefused);
        let x = explain_connect(&e);
        assert_eq!(x.windows, Some("10061/1225"));
        assert_eq!(x.points_at, PointsAt::Configuration);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn raw_errors_get_their_names_and_blame() {
        let cases = [
            (111, "ECONNREFUSED", PointsAt::Configuration, "10061/1225"),
            (110, "ETIMEDOUT", PointsAt::Network, "121/10060"),
            (100, "ENETDOWN", PointsAt::Network, "10050"),
            (101, "ENETUNREACH", PointsAt::Network, "10051"),
            (113, "EHOSTUNREACH", PointsAt::Network, "10065"),
            (24, "EMFILE", PointsAt::Broker, "10024"),
            (23, "ENFILE", PointsAt::Broker, "10024"),
            (99, "EADDRNOTAVAIL", PointsAt::Broker, "10049"),
            (105, "ENOBUFS", PointsAt::Broker, "10055"),
        ];
        for (code, name, points_at, windows) in cases {
            let x = explain_connect(&io::Error::from_raw_os_error(code));
            assert_eq!(x.errno, Some(name), "{code}");
            assert_eq!(x.points_at, points_at, "{code}");
            assert_eq!(x.windows, Some(windows), "{code}");
        }
        let line = explain_connect(&io::Error::from_raw_os_error(111)).to_string();
        assert!(
            line.starts_with(
                "connection refused (ECONNREFUSED, Windows 10061/1225): nothing is listening"
            ),
            "{line}"
        );
        // Whose side, in words: no `points at configuration/operation`.
        assert!(
            line.ends_with(
                "the server is down, or the address or port is wrong; the cause is on the \
                 server's side or in the configuration, not the broker's"
            ),
            "{line}"
        );
        let bind = explain_bind(&io::Error::from_raw_os_error(98), 5000);
        assert!(bind.starts_with("address already in use (EADDRINUSE, Windows 10048); another process holds port 5000"), "{bind}");
    }
}
