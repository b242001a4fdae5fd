//! What happens in a broker, as [`Event`]s a program can subscribe to: quarantines entered
//! and left, monitor checks and rounds, failed connects, connections ended, reloads. Tests
//! assert on these (and on a balancer's state) rather than on log text; an administration
//! interface can follow them.
//!
//! Publishing costs one atomic read while nobody listens: the event is not even built, and the
//! channel exists only from the first subscription on.
//!
//! The hub holds the alerts' queue too ([`crate::balancer::alert_queue`]): a balancer queues
//! an [`Alert`] through it, and the alerts machinery reads them through its feed
//! ([`Events::alert_feed`]), only while it does.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::broadcast;

use crate::balancer::alert_queue::{ALERT_QUEUE, Alert, AlertFigures, AlertQueue, Popped};
use crate::balancer::rules::health::{Reason, Release};
use crate::config::BalancerKind;
use crate::net::relay::End;

/// Something that happened in the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A balancer listens on `address` (at start, when a reload adds it or moves it).
    Listening {
        /// Which balancer.
        balancer: BalancerKind,
        /// The address it is bound to.
        address: SocketAddr,
    },
    /// Every balancer runs: the broker serves.
    Ready,
    /// A server was put in quarantine (`started`), or its quarantine was extended.
    Quarantined {
        /// Which balancer.
        balancer: BalancerKind,
        /// The server's `host:port`.
        server: String,
        /// What failed.
        reason: Reason,
        /// The failure in words.
        error: String,
        /// True when this failure started the quarantine.
        started: bool,
        /// When the failure came (wall ms).
        at_wall_ms: u64,
        /// When the quarantine ends now (wall ms).
        until_wall_ms: u64,
    },
    /// A server's quarantine ended.
    Released {
        /// Which balancer.
        balancer: BalancerKind,
        /// The server's `host:port`.
        server: String,
        /// Why.
        why: Release,
    },
    /// A monitor check passed.
    CheckPassed {
        /// Which balancer.
        balancer: BalancerKind,
        /// The server's `host:port`.
        server: String,
        /// Checks passed in a row (for `MONITOR_RISE`).
        in_a_row: u32,
    },
    /// A monitor check failed.
    CheckFailed {
        /// Which balancer.
        balancer: BalancerKind,
        /// The server's `host:port`.
        server: String,
        /// The failure in words.
        error: String,
        /// The failure with what it points at, as the log explains it.
        explained: String,
        /// Checks failed in a row (for `MONITOR_FALL`).
        in_a_row: u32,
    },
    /// A monitor round ended.
    MonitorRound {
        /// Which balancer.
        balancer: BalancerKind,
        /// Servers that take clients.
        available: usize,
        /// The servers in quarantine, by `host:port`.
        unavailable: Vec<String>,
        /// Servers not checked for the broker's own lack of resources.
        unchecked: usize,
    },
    /// A client's connect to a server failed.
    ConnectFailed {
        /// Which balancer.
        balancer: BalancerKind,
        /// The client's address.
        client: SocketAddr,
        /// The server's `host:port`.
        server: String,
        /// The failure explained (words, codes, what it points at).
        error: String,
        /// True when it counts against the server (a cause on the server's side).
        blamed: bool,
    },
    /// A client was closed without a server.
    Unserved {
        /// Which balancer.
        balancer: BalancerKind,
        /// The client's address.
        client: SocketAddr,
        /// Why.
        why: Unserved,
    },
    /// A client was refused: `MAX_CONNECTIONS` were open.
    Refused {
        /// Which balancer.
        balancer: BalancerKind,
    },
    /// A client's connection was refused: the client had `MAX_CONNECTIONS_PER_CLIENT` open.
    ClientLimited {
        /// Which balancer.
        balancer: BalancerKind,
        /// The client's address (the PROXY protocol's, when there is one; the one a trusted
        /// proxy's `X-Forwarded-For` names, for a request through it).
        client: IpAddr,
        /// Its connections open then (with its requests in hand and WebSockets through trusted
        /// proxies).
        open: u32,
    },
    /// A connection was refused at the PROXY protocol step (no valid header from a front
    /// balancer, or one from another source) and closed.
    ProxyHeaderRefused {
        /// Which balancer.
        balancer: BalancerKind,
        /// The connection's peer.
        peer: SocketAddr,
        /// Why, as METRICS labels it.
        cause: &'static str,
    },
    /// An HTTP balancer finished a request (answered it, or gave up on it).
    Request {
        /// Which balancer.
        balancer: BalancerKind,
        /// The client's address.
        client: SocketAddr,
        /// The request's method.
        method: String,
        /// The request's target (path and query).
        path: String,
        /// The status sent; `None` when the client went away first.
        status: Option<u16>,
        /// The server that answered (or last failed), `host:port`.
        server: Option<String>,
    },
    /// A relayed connection ended.
    ConnectionEnded {
        /// Which balancer.
        balancer: BalancerKind,
        /// The client's address.
        client: SocketAddr,
        /// The server's `host:port`.
        server: String,
        /// How long it lasted.
        duration: Duration,
        /// Bytes from the client to the server.
        bytes_from_client: u64,
        /// Bytes from the server to the client.
        bytes_to_client: u64,
        /// Who or what ended it.
        ended_by: End,
    },
    /// A reload was applied.
    Reloaded(Reloaded),
    /// A reload was rejected; the running configuration stays.
    ReloadRejected {
        /// Every error, one per line as logged.
        errors: Vec<String>,
    },
    /// Every server of a balancer stopped taking new clients (`available` 0), or one takes
    /// them again after none did.
    ServersAvailable {
        /// Which balancer.
        balancer: BalancerKind,
        /// Servers that take new clients now.
        available: usize,
        /// Servers of the balancer.
        total: usize,
    },
    /// An operator held a server out of the balancing (`ctl disable`, `ctl drain`), or
    /// enabled it again.
    Held {
        /// Which balancer.
        balancer: BalancerKind,
        /// The server's `host:port`.
        server: String,
        /// True when held (disabled or draining), false when enabled again.
        held: bool,
        /// Who asked.
        by: String,
    },
    /// The daily check found the certificate served to clients expiring or expired.
    CertificateExpiring {
        /// Which balancer.
        balancer: BalancerKind,
        /// What the check found, in words.
        finding: String,
    },
    /// `RESTART_COMMAND` ran (or was refused) for an AppServer.
    RestartRan {
        /// The balancer whose server it was.
        balancer: BalancerKind,
        /// The server's `host:port`.
        server: String,
        /// Its exit code; `None` when it was killed (its timeout) or could not start.
        exit: Option<i32>,
        /// What happened, in words (`exit 0`, `killed after RESTART_TIMEOUT (5s)`).
        outcome: String,
    },
    /// Alerts were dropped: a receiver was too slow and their queue full.
    AlertsDropped {
        /// How many.
        count: u64,
    },
    /// The shutdown began: PING answers 503, listeners close after `SHUTDOWN_GRACE`.
    Draining,
    /// The broker stopped.
    Stopped,
}

/// Why a client was closed without a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unserved {
    /// Every candidate was tried (or `MAX_ATTEMPTS` were) and none answered.
    NoServer,
    /// The broker itself lacked descriptors, ports or memory: no server is blamed.
    BrokerFault,
}

/// What a reload applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Every change, as the `configuration reloaded:` line lists them (empty: nothing
    /// changed).
    pub changes: Vec<String>,
    /// What could not be applied (a listen address that cannot be bound), each as logged.
    pub errors: Vec<String>,
}

/// Events waiting for a slow subscriber before the oldest are dropped for it (it is told how
/// many): room for a few seconds of a busy test broker.
const CAPACITY: usize = 16 * 1024;

/// Where events are published; cheap to clone, shared by everything in one broker.
#[derive(Debug, Clone, Default)]
pub struct Events(Arc<Hub>);

#[derive(Debug)]
struct Hub {
    /// Made at the first subscription.
    sender: OnceLock<broadcast::Sender<Event>>,
    /// Subscriptions alive: none, and nothing is built or sent.
    subscribers: AtomicUsize,
    /// The alerts, for the one reader of them.
    alerts: AlertQueue,
    /// True while a reader takes alerts ([`Events::alert_feed`]): else none is built.
    alerting: AtomicBool,
    /// The alerts and restarts counted, for METRICS.
    figures: Arc<AlertFigures>,
}

impl Default for Hub {
    fn default() -> Self {
        let figures = Arc::new(AlertFigures::default());
        Hub {
            sender: OnceLock::new(),
            subscribers: AtomicUsize::new(0),
            alerts: AlertQueue::new(ALERT_QUEUE, Some(Arc::clone(&figures))),
            alerting: AtomicBool::new(false),
            figures,
        }
    }
}

impl Events {
    /// Events from now on.
    pub fn subscribe(&self) -> Subscription {
        let sender = self.0.sender.get_or_init(|| broadcast::channel(CAPACITY).0);
        self.0.subscribers.fetch_add(1, Relaxed);
        Subscription {
            receiver: sender.subscribe(),
            hub: Arc::clone(&self.0),
        }
    }

    /// Publishes the event `make` builds, when anyone listens.
    pub fn emit(&self, make: impl FnOnce() -> Event) {
        if self.0.subscribers.load(Relaxed) == 0 {
            return;
        }
        if let Some(sender) = self.0.sender.get() {
            let _ = sender.send(make());
        }
    }

    /// Queues the alert `make` builds, when the alerts machinery reads them.
    pub fn alert(&self, make: impl FnOnce() -> Alert) {
        if self.0.alerting.load(Relaxed) {
            self.0.alerts.push(make());
        }
    }

    /// The alerts and restarts counted since start, for METRICS.
    pub fn figures(&self) -> &Arc<AlertFigures> {
        &self.0.figures
    }

    /// The alerts from now on, for their one reader (a second feed shares the queue).
    pub fn alert_feed(&self) -> AlertFeed {
        self.0.alerting.store(true, Relaxed);
        AlertFeed {
            hub: Arc::clone(&self.0),
        }
    }
}

/// The reading end of a broker's alerts: while it lives, alerts are queued.
#[derive(Debug)]
pub struct AlertFeed {
    hub: Arc<Hub>,
}

impl AlertFeed {
    /// The next alert, or how many were dropped before it.
    pub async fn next(&self) -> Popped {
        self.hub.alerts.pop().await
    }

    /// The next alert, or how many were dropped, when one waits.
    pub fn try_next(&self) -> Option<Popped> {
        self.hub.alerts.try_pop()
    }

    /// What was taken last has been dealt with.
    pub fn done(&self) {
        self.hub.alerts.done();
    }

    /// True when nothing waits and nothing taken is still being dealt with.
    pub fn is_idle(&self) -> bool {
        self.hub.alerts.is_idle()
    }
}

impl Drop for AlertFeed {
    fn drop(&mut self) {
        self.hub.alerting.store(false, Relaxed);
    }
}

/// A subscription to a broker's events.
#[derive(Debug)]
pub struct Subscription {
    receiver: broadcast::Receiver<Event>,
    hub: Arc<Hub>,
}

/// Why no event came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Missed {
    /// The subscriber fell behind: this many events were dropped for it.
    #[error("{0} events were dropped: the subscriber fell behind")]
    Lagged(u64),
    /// The broker is gone.
    #[error("the broker is gone")]
    Closed,
}

impl Subscription {
    /// The next event.
    pub async fn recv(&mut self) -> Result<Event, Missed> {
        self.receiver.recv().await.map_err(|e| match e {
            broadcast::error::RecvError::Lagged(n) => Missed::Lagged(n),
            broadcast::error::RecvError::Closed => Missed::Closed,
        })
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.subscribers.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AlertEvent;

    #[tokio::test]
    async fn events_reach_subscribers_and_cost_nothing_without_one() {
        let events = Events::default();
        let mut built = 0;
        events.emit(|| {
            built += 1;
            Event::Ready
        });
        assert_eq!(built, 0, "nobody listens: nothing is built");
        let mut subscription = events.subscribe();
        events.emit(|| Event::Draining);
        assert_eq!(subscription.recv().await, Ok(Event::Draining));
        drop(subscription);
        events.emit(|| {
            built += 1;
            Event::Stopped
        });
        assert_eq!(built, 0, "the subscription is gone");
    }

    #[tokio::test]
    async fn alerts_are_queued_only_while_read_and_the_oldest_dropped_past_the_bound() {
        let events = Events::default();
        let mut built = 0;
        events.alert(|| {
            built += 1;
            Alert::new(AlertEvent::BrokerStarted)
        });
        assert_eq!(built, 0, "no reader: nothing is built");
        let feed = events.alert_feed();
        for n in 0..ALERT_QUEUE + 5 {
            events.alert(|| Alert::new(AlertEvent::QuarantineEntered).because(n.to_string()));
        }
        assert_eq!(feed.next().await, Popped::Dropped(5));
        match feed.next().await {
            Popped::Alert(alert) => assert_eq!(alert.reason.as_deref(), Some("5"), "oldest kept"),
            other => panic!("{other:?}"),
        }
        let mut left = 0;
        while let Some(Popped::Alert(_)) = feed.try_next() {
            left += 1;
        }
        assert_eq!(left, ALERT_QUEUE - 1);
        drop(feed);
        events.alert(|| {
            built += 1;
            Alert::new(AlertEvent::BrokerStopping)
        });
        assert_eq!(built, 0, "the reader is gone");
    }
}
