//! One balancer at run time: its accept loops (one per listening socket, each on a worker),
//! its monitor and sampler (on the control runtime), and the tasks of its connections, which
//! are waited for, or cut, when it stops.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, error, info, warn};

use crate::balancer::Balancer;
use crate::balancer::alert_queue::Alert;
use crate::balancer::events::Event;
use crate::balancer::shared::{EndSignals, Shared};
use crate::broker::handoff::Handoff;
use crate::broker::monitor;
use crate::config::{AlertEvent, BalancerConfig, plural, show_duration};
use crate::http_balancer::sessions::SessionSecrets;
use crate::http_balancer::{self, HttpProxy};
use crate::net::listener::{self, StopAccepting};
use crate::net::workers::Workers;
use crate::query::{self, Operators, QueryEngine};
use crate::tcp::client::ListenerShared;
use crate::tls::Severity;

/// One balancer at run time.
pub(super) struct RunningBalancer {
    pub(super) balancer: Arc<Balancer>,
    /// Its listen address as configured, to tell when a reload moves it.
    pub(super) configured: SocketAddr,
    /// The address its listeners are bound to.
    pub(super) listen: SocketAddr,
    /// Its connections, waited for on shutdown or removal.
    pub(super) tasks: TaskTracker,
    /// Ends its relays when draining is over.
    pub(super) cut: CancellationToken,
    /// Stops its monitor and sampler.
    pub(super) stop_background: CancellationToken,
    /// Its accept loops; `None` once stopped.
    accepting: Option<Accepting>,
    /// The HTTP engine of an HTTP balancer, which serves its connections.
    pub(super) http: Option<Arc<HttpProxy>>,
    /// The engine of a TCP balancer's query connections.
    pub(super) query: Option<Arc<QueryEngine>>,
}

/// A balancer's accept loops, one per listening socket (one per worker where the kernel
/// spreads connections), and the token that stops them.
struct Accepting {
    stop: StopAccepting,
    loops: Vec<JoinHandle<()>>,
}

impl Accepting {
    /// Stops every loop and waits until each has served what its listener had queued and
    /// closed it; with `port_closes`, the port is closing for good (see [`StopAccepting`]).
    async fn stop(self, port_closes: bool) {
        if port_closes {
            self.stop.close_port();
        } else {
            self.stop.stop();
        }
        for accept_loop in self.loops {
            let _ = accept_loop.await;
        }
    }
}

/// The address `listeners` are bound to (the first's; all share it), else `configured`.
fn bound_address(listeners: &[StdListener], configured: SocketAddr) -> SocketAddr {
    listeners
        .first()
        .and_then(|l| l.local_addr().ok())
        .unwrap_or(configured)
}

impl RunningBalancer {
    /// Starts a balancer: its accept loops on `listeners` (on the workers), its monitor and
    /// sampler (here), all stopped by `stopping` as well as by its own tokens; an HTTP
    /// balancer's engine signs its session cookies with `session_secrets`; its queries' page
    /// of actions is run by `operators`.
    pub(super) fn start(
        balancer: Arc<Balancer>,
        listeners: Vec<StdListener>,
        shared: &Arc<Shared>,
        session_secrets: &Arc<SessionSecrets>,
        operators: &Arc<Operators>,
        workers: &Workers,
        stopping: &CancellationToken,
    ) -> RunningBalancer {
        let generation = balancer.generation();
        let c = &generation.config;
        let listen = bound_address(&listeners, c.listen);
        info!(
            "{} listening on {} for {}, policy {}, monitor {} every {}, quarantine {}",
            c.kind,
            listen,
            plural(c.servers.len(), "server"),
            c.sort_method.as_str(),
            c.monitoring.as_str(),
            show_duration(c.monitor_interval),
            show_duration(c.quarantine_time),
        );
        balancer.events().emit(|| Event::Listening {
            balancer: c.kind,
            address: listen,
        });
        if let Some(server) = &generation.tls.server {
            let certificate = &server.certificate;
            info!(
                "{} speaks TLS{} with the certificate of {} (issued by {}, valid until {})",
                c.kind,
                if c.tls.plain_on_same_port {
                    " and plain TCP"
                } else {
                    ""
                },
                certificate.subject,
                certificate.issuer,
                crate::tls::doctor::utc(certificate.not_after)
            );
        }
        if let Some(warning) = generation.tls.upstream.as_ref().and_then(|r| r.warning()) {
            warn!("{}: {warning}", c.kind);
        }
        let stop_background = stopping.child_token();
        tokio::spawn(
            monitor::run(Arc::clone(&balancer), stop_background.clone())
                .instrument(balancer.span()),
        );
        tokio::spawn(sample_every_minute(
            Arc::clone(&balancer),
            stop_background.clone(),
        ));
        tokio::spawn(
            check_certificate_daily(Arc::clone(&balancer), stop_background.clone())
                .instrument(balancer.span()),
        );
        let http = c
            .kind
            .is_http()
            .then(|| http_balancer::proxy(&balancer, shared, session_secrets, operators));
        let query = (!c.kind.is_http()).then(|| query::port::engine(shared, &balancer, operators));
        let mut running = RunningBalancer {
            configured: c.listen,
            listen,
            http,
            query,
            balancer,
            tasks: TaskTracker::new(),
            cut: stopping.child_token(),
            stop_background,
            accepting: None,
        };
        running.accepting = Some(running.accept_on(listeners, shared, workers));
        running
    }

    /// Starts one accept loop per listening socket, each on its own worker.
    fn accept_on(
        &self,
        listeners: Vec<StdListener>,
        shared: &Arc<Shared>,
        workers: &Workers,
    ) -> Accepting {
        // Stopped by the running balancer, or with everything when the broker's handle is dropped.
        let stop = StopAccepting::new(self.stop_background.child_token());
        let span = self.balancer.span();
        let handles = workers.handles();
        let loops = listeners
            .into_iter()
            .enumerate()
            .map(|(index, listener)| {
                let (balancer, shared, tasks, http, query) = (
                    Arc::clone(&self.balancer),
                    Arc::clone(shared),
                    self.tasks.clone(),
                    self.http.clone(),
                    self.query.clone(),
                );
                let ending = EndSignals {
                    closing: stop.token().clone(),
                    cut: self.cut.clone(),
                };
                let stop_accepting = stop.clone();
                let accept = async move {
                    // Registered with the worker's own reactor, so it must be made there.
                    match TcpListener::from_std(listener) {
                        Ok(listener) => {
                            let listener_shared = Arc::new(ListenerShared {
                                ctx: shared,
                                balancer,
                                ending,
                                local: listener.local_addr().ok(),
                                tasks,
                                query,
                                span: Span::current(),
                            });
                            let handoff = Handoff {
                                shared: listener_shared,
                                http,
                            };
                            listener::accept_loop(listener, stop_accepting, handoff).await;
                        }
                        Err(e) => error!(
                            "cannot start accepting: {}",
                            crate::support::os_error::words(&e)
                        ),
                    }
                };
                handles[index % handles.len()].spawn(accept.instrument(span.clone()))
            })
            .collect();
        Accepting { stop, loops }
    }

    /// Stops the accept loops and waits until the listeners are closed; with `port_closes`,
    /// the balancer's port closes for good (a reload removed the balancer).
    pub(super) async fn stop_accepting(&mut self, port_closes: bool) {
        if let Some(accepting) = self.accepting.take() {
            accepting.stop(port_closes).await;
        }
        self.tasks.close();
    }

    /// Binds `config`'s new listen address, starts accepting there, then closes the old
    /// listener. When the new address cannot be bound, the old one stays (and `config` says
    /// so). Returns what happened, for the reload's summary, and the error, if any.
    pub(super) async fn move_listener(
        &mut self,
        shared: &Arc<Shared>,
        workers: &Workers,
        config: &mut BalancerConfig,
    ) -> (String, Option<String>) {
        match listener::bind(config, workers.listeners_per_balancer()) {
            Ok(listeners) => {
                let new = bound_address(&listeners, config.listen);
                let accepting = self.accept_on(listeners, shared, workers);
                if let Some(old) = self.accepting.replace(accepting) {
                    old.stop(true).await;
                }
                let moved = format!(
                    "{} now listens on {} (was {})",
                    config.kind, config.listen, self.configured
                );
                info!("{moved}");
                self.listen = new;
                self.configured = config.listen;
                let kind = config.kind;
                self.balancer.events().emit(|| Event::Listening {
                    balancer: kind,
                    address: new,
                });
                (moved, None)
            }
            Err(e) => {
                let error = format!(
                    "{e}; {} keeps listening on {}",
                    config.kind, self.configured
                );
                error!("{error}");
                let kept = format!(
                    "{} still listens on {} (cannot listen on {})",
                    config.kind, self.configured, config.listen
                );
                config.listen = self.configured;
                (kept, Some(error))
            }
        }
    }
}

/// Samples each server's active connections once a minute (for the STATUS chart) until
/// `stop` is cancelled.
async fn sample_every_minute(balancer: Arc<Balancer>, stop: CancellationToken) {
    loop {
        balancer.sample();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
    }
}

/// Runs [`check_certificate`] once a day, until `stop` is cancelled.
async fn check_certificate_daily(balancer: Arc<Balancer>, stop: CancellationToken) {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(DAY) => {}
        }
        check_certificate(&balancer, SystemTime::now());
    }
}

/// The daily check of `balancer`'s certificate in use, as of `now`: what the doctor finds
/// (expired, or expiring within 30 days: warnings an operator who missed the one at start
/// still needs) is logged, published and sent as `certificate_expiring`. Public so a test can
/// run the day's check without waiting a day.
pub fn check_certificate(balancer: &Balancer, now: SystemTime) {
    let generation = balancer.generation();
    let Some(server) = &generation.tls.server else {
        return;
    };
    let roots = crate::tls::upstream::system_roots();
    let kind = generation.config.kind;
    let until_wall_ms = server
        .certificate
        .not_after
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64);
    for finding in server.diagnose(now, &roots.store) {
        if finding.severity() >= Severity::Warning {
            warn!("{kind}: {finding}");
            balancer.events().emit(|| Event::CertificateExpiring {
                balancer: kind,
                finding: finding.to_string(),
            });
            balancer.events().alert(|| Alert {
                until_wall_ms,
                ..Alert::new(AlertEvent::CertificateExpiring)
                    .on(kind)
                    .because(finding.to_string())
            });
        }
    }
}
