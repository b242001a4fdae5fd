//! The HTTP engine alone on a real loopback listener ([`LoopbackEngine`]), over a balancer of
//! the tests' own ([`TestUpstreams`]: servers in order, every event recorded), for the tests of
//! the engine itself (tests/http_proxy.rs, tests/http_head.rs, tests/http_bodies.rs).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use appbroker::http::{
    Choice, ClientHead, ConnectFailure, Downstream, Engine, Exchange, Report, Settings, Tunnel,
    Upstreams,
};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// An event as the test balancer recorded it.
#[derive(Debug, Clone)]
pub enum Recorded {
    /// A connect to the server failed, with the error's text.
    ConnectFailed(SocketAddr, String),
    /// An upstream connection to the server opened.
    Opened(SocketAddr),
    /// An upstream connection to the server closed.
    Closed(SocketAddr),
    /// A request and its answer.
    Exchange(Exchange<SocketAddr>),
    /// An upgraded connection, once it ended.
    Tunnel(Tunnel<SocketAddr>),
}

/// A balancer for tests: its servers in order (the first not tried yet is chosen), a cookie
/// it sets on every answer, every event kept.
#[derive(Default)]
pub struct TestUpstreams {
    /// The servers, in the order they are chosen; a test may change them between requests.
    pub servers: Mutex<Vec<SocketAddr>>,
    /// A `Set-Cookie` added to every answer, as a balancer's session cookie is.
    pub set_cookie: Mutex<Option<String>>,
    /// Every event the engine reported, and every failed connect, in order.
    pub events: Mutex<Vec<Recorded>>,
    /// Leases held by the engine now: requests in hand and upgraded connections.
    pub leased: Arc<AtomicUsize>,
    /// Every connect fails as the broker's own failure would (out of descriptors).
    pub broker_fault: AtomicBool,
}

/// A lease of the test balancer: counted in `leased` while it lives.
pub struct TestLease(Arc<AtomicUsize>);

impl Drop for TestLease {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl TestUpstreams {
    /// A balancer over `servers`, in this order.
    pub fn new(servers: &[SocketAddr]) -> Arc<TestUpstreams> {
        Arc::new(TestUpstreams {
            servers: Mutex::new(servers.to_vec()),
            ..TestUpstreams::default()
        })
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Recorded> {
        self.events.lock().unwrap().clone()
    }

    /// The exchanges (requests and their answers) so far.
    pub fn exchanges(&self) -> Vec<Exchange<SocketAddr>> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Recorded::Exchange(x) => Some(x),
                _ => None,
            })
            .collect()
    }

    /// The upgraded connections ended so far.
    pub fn tunnels(&self) -> Vec<Tunnel<SocketAddr>> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Recorded::Tunnel(t) => Some(t),
                _ => None,
            })
            .collect()
    }

    /// The servers of the failed connects so far, one entry per failure.
    pub fn connect_failures(&self) -> Vec<SocketAddr> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Recorded::ConnectFailed(s, _) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// Upstream connections opened and closed so far.
    pub fn opened_closed(&self) -> (usize, usize) {
        let events = self.events();
        let opened = events
            .iter()
            .filter(|e| matches!(e, Recorded::Opened(_)))
            .count();
        let closed = events
            .iter()
            .filter(|e| matches!(e, Recorded::Closed(_)))
            .count();
        (opened, closed)
    }
}

/// A failed connect of the test balancer: a server's (the next one is tried), or with
/// [`TestUpstreams::broker_fault`] the broker's own.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct TestConnectError {
    error: std::io::Error,
    brokers: bool,
}

impl ConnectFailure for TestConnectError {
    fn try_next(&self) -> bool {
        !self.brokers
    }
}

impl Upstreams for TestUpstreams {
    type Server = SocketAddr;
    type Lease = TestLease;
    type Stream = TcpStream;
    type ConnectError = TestConnectError;
    type ClientHold = ();
    type Admission = ();

    fn hold_client(&self, _client: &Downstream) -> Option<()> {
        Some(())
    }

    fn admit(&self, _client: &Downstream, (): &mut ()) -> bool {
        true
    }

    fn choose(
        &self,
        _request: &ClientHead<'_>,
        _client: &Downstream,
        tried: &[SocketAddr],
    ) -> Option<Choice<Self>> {
        let servers = self.servers.lock().unwrap();
        let server = servers.iter().find(|s| !tried.contains(s))?;
        self.leased.fetch_add(1, SeqCst);
        Some(Choice {
            server: *server,
            lease: TestLease(Arc::clone(&self.leased)),
            set_cookie: self.set_cookie.lock().unwrap().clone(),
        })
    }

    /// Accounts for a failed connect itself, as a balancer does.
    fn connect(
        &self,
        server: &SocketAddr,
        _client: &Downstream,
    ) -> impl Future<Output = Result<TcpStream, TestConnectError>> + Send {
        let server = *server;
        let brokers = self.broker_fault.load(SeqCst);
        async move {
            let connected = if brokers {
                Err(std::io::Error::from_raw_os_error(24)) // EMFILE
            } else {
                tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(server))
                    .await
                    .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut)))
            };
            connected.map_err(|error| {
                let failed = Recorded::ConnectFailed(server, error.to_string());
                self.events.lock().unwrap().push(failed);
                TestConnectError { error, brokers }
            })
        }
    }

    fn report(&self, report: Report<'_, SocketAddr>) {
        let recorded = match report {
            Report::ConnectFailed { server, error, .. } => {
                Recorded::ConnectFailed(*server, error.to_string())
            }
            Report::Opened { server } => Recorded::Opened(*server),
            Report::Closed { server } => Recorded::Closed(*server),
            Report::Exchange(x) => Recorded::Exchange(x.clone()),
            Report::Tunnel(t) => Recorded::Tunnel(t.clone()),
        };
        self.events.lock().unwrap().push(recorded);
    }
}

/// The engine on a loopback port.
pub struct LoopbackEngine {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The engine itself.
    pub proxy: Arc<Engine<TestUpstreams>>,
    /// Its balancer.
    pub upstreams: Arc<TestUpstreams>,
    /// Cancelling it asks every connection to finish its request and close.
    pub closing: CancellationToken,
    /// Client connections being served now.
    pub serving: Arc<AtomicUsize>,
}

impl LoopbackEngine {
    /// The engine with `settings` over `upstreams`, serving every client it accepts.
    pub async fn start(upstreams: Arc<TestUpstreams>, settings: Settings) -> LoopbackEngine {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let proxy = Engine::new(Arc::clone(&upstreams), settings);
        let closing = CancellationToken::new();
        let serving = Arc::new(AtomicUsize::new(0));
        {
            let proxy = Arc::clone(&proxy);
            let closing = closing.clone();
            let serving = Arc::clone(&serving);
            tokio::spawn(async move {
                loop {
                    let Ok((stream, peer)) = listener.accept().await else {
                        continue;
                    };
                    let client = Downstream {
                        peer: peer.into(),
                        front_off_host: false,
                        tls: false,
                        local: None,
                        check: false,
                    };
                    let proxy = Arc::clone(&proxy);
                    let closing = closing.clone();
                    let serving = Arc::clone(&serving);
                    serving.fetch_add(1, SeqCst);
                    tokio::spawn(async move {
                        let cut = CancellationToken::new();
                        proxy.serve(stream, client, closing, cut, ()).await;
                        serving.fetch_sub(1, SeqCst);
                    });
                }
            });
        }
        LoopbackEngine {
            addr,
            proxy,
            upstreams,
            closing,
            serving,
        }
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}
