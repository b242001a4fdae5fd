//! A connection to a server for a client: the dialer's steps ([`dial::dial`]: resolve, the
//! broker itself refused, connect within `CONNECT_TIMEOUT`, the PROXY protocol header first,
//! TLS towards the server), the socket's keepalive, and what became of the connect told to
//! whoever counts connects ([`ConnectReport`]: the balancer, which counts, quarantines and
//! logs). Both connection paths, a TCP client's and an HTTP request's, connect through it, so
//! every `SSL_*` and socket key means the same on both; it does the connecting and judges
//! nothing.

use std::sync::Arc;

use tracing::debug;

use crate::config::{BalancerConfig, Host};
use crate::net::dial::{self, ConnectError, ServerStream};
use crate::net::resolve::Resolver;
use crate::net::stream::Stream;
use crate::net::sys;
use crate::support::os_error::words;
use crate::tls::UpstreamTls;

/// What a [`Connector`] tells of each connect it makes, to whoever counts them.
pub trait ConnectReport {
    /// The connect succeeded (its TLS handshake too, when there is one).
    fn connected(&self);

    /// The connect failed with `error` (a lookup not tried for `DNS_MAX_LOOKUPS` included:
    /// whoever counts decides whom a failure blames).
    fn failed(&self, error: &ConnectError);

    /// Writes a line of the connector's own (`write`) where the reporter's lines go: one whose
    /// lines carry a span enters it here.
    fn line(&self, write: impl FnOnce()) {
        write();
    }
}

/// Connects to the servers of one generation of a balancer's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Connector<'a> {
    /// The process's resolver.
    pub resolver: &'a Arc<Resolver>,
    /// The generation's settings (`CONNECT_TIMEOUT`, `DNS_CACHE_TIME`, keepalive, `SSL_*`).
    pub config: &'a BalancerConfig,
    /// The generation's TLS towards the servers (`SSL_ENCRYPT_UPSTREAM=1`), when loaded.
    pub tls: Option<&'a UpstreamTls>,
}

impl Connector<'_> {
    /// A connection to `host:port` (`address`: how the log names it), `preface` written first
    /// (a PROXY protocol header, `SEND_PROXY_PROTOCOL`: it is for the server's TCP side, as
    /// HAProxy sends it, before any TLS), with TCP keepalive; the outcome told to `report`,
    /// once.
    pub async fn connect(
        &self,
        host: &Host,
        port: u16,
        address: &str,
        preface: &[u8],
        report: &impl ConnectReport,
    ) -> Result<ServerStream, ConnectError> {
        let dialed = dial::dial(self.resolver, host, port, self.config, self.tls, preface).await;
        match &dialed {
            Ok(stream) => {
                // A failure only costs the early notice of a vanished server: the
                // connection goes on.
                if let Some(socket) = stream.socket()
                    && let Err(e) = sys::set_keepalive(socket, &self.config.keepalive)
                {
                    report.line(|| {
                        debug!(server = %address, "cannot set keepalive: {}", words(&e));
                    });
                }
                report.connected();
            }
            Err(e) => report.failed(e),
        }
        dialed
    }
}
