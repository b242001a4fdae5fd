//! What happens in a broker, as [`Event`]s a program can subscribe to: quarantines entered
//! and left, monitor checks and rounds, failed connects, connections ended, reloads. Tests
//! assert on these (and on a balancer's state) rather than on log text; an administration
//! interface can follow them.
//!
//! Publishing costs one atomic read while nobody listens: the event is not even built, and the
//! channel exists only from the first subscription on.
//!
//! Beside them, [`Alert`]s: the few events worth telling people (a quarantine entered or left,
//! no server available, an operator's hold, the broker started or stopping, a restart run), on
//! a low-rate queue of their own ([`AlertQueue`]) that the alerts machinery reads. It is no
//! subscription to every event: an HTTP request builds and sends nothing there. The queue is
//! bounded; past [`ALERT_QUEUE`] the oldest are dropped, and the reader is told how many.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{Notify, broadcast};

use crate::balancer::rules::health::{Reason, Release};
use crate::config::{AlertEvent, BalancerKind};
use crate::net::relay::End;
use crate::process::clock::wall_ms;

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

/// Alerts waiting for delivery at most, in the broker's queue and in each receiver's: past it
/// the oldest are dropped (and counted). Alerts come at the pace of quarantines and operators'
/// actions; a thousand waiting means a receiver has been down for long, and its newest news
/// is what matters.
pub const ALERT_QUEUE: usize = 1000;

/// One alert: an event worth telling people, with what the receivers are sent about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    /// What happened.
    pub event: AlertEvent,
    /// When (wall ms).
    pub at_wall_ms: u64,
    /// The balancer it happened in; `None` for the broker as a whole.
    pub balancer: Option<BalancerKind>,
    /// The server it is about.
    pub server: Option<AlertServer>,
    /// Why, in the words the log uses.
    pub reason: Option<String>,
    /// Until when (wall ms): a quarantine's end, a certificate's expiry.
    pub until_wall_ms: Option<u64>,
    /// Who did it (an operator's action).
    pub who: Option<String>,
    /// Servers taking new clients, of `total`.
    pub available: Option<usize>,
    /// Servers of the balancer.
    pub total: Option<usize>,
    /// A restart's exit code.
    pub exit: Option<i32>,
    /// A restart's last lines of output.
    pub output: Option<String>,
    /// Alerts dropped.
    pub dropped: Option<u64>,
    /// An upgrade's two brokers and how long the handover took (`broker_upgraded`).
    pub upgrade: Option<Upgraded>,
}

/// What `broker_upgraded` tells: the broker replaced and the one that serves now, each with
/// its version and pid, and how long the new one took to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgraded {
    /// The replaced broker's version; `None` when the supervisor image it came from did not
    /// say (one from before `broker_upgraded`).
    pub from_version: Option<String>,
    /// The version of the broker that serves now.
    pub to_version: String,
    /// The replaced broker's pid.
    pub from_pid: u32,
    /// The pid of the broker that serves now.
    pub to_pid: u32,
    /// From the supervisor's re-execution to the new broker serving, in milliseconds.
    pub handover_ms: u64,
}

/// The server an alert is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertServer {
    /// `REMOTE_SERVER_<id>`'s id.
    pub id: String,
    /// Its host, as configured.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// `host:port`.
    pub address: String,
}

impl Alert {
    /// An alert of `event` now, about nothing in particular yet.
    pub fn new(event: AlertEvent) -> Alert {
        Alert {
            event,
            at_wall_ms: wall_ms(),
            balancer: None,
            server: None,
            reason: None,
            until_wall_ms: None,
            who: None,
            available: None,
            total: None,
            exit: None,
            output: None,
            dropped: None,
            upgrade: None,
        }
    }

    /// The same, in `balancer`.
    pub fn on(self, balancer: BalancerKind) -> Alert {
        Alert {
            balancer: Some(balancer),
            ..self
        }
    }

    /// The same, about `server`.
    pub fn about(self, server: AlertServer) -> Alert {
        Alert {
            server: Some(server),
            ..self
        }
    }

    /// The same, for `reason`.
    pub fn because(self, reason: impl Into<String>) -> Alert {
        Alert {
            reason: Some(reason.into()),
            ..self
        }
    }
}

/// What became of an alert at one receiver (or before any).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AlertOutcome {
    /// The receiver took it.
    Delivered,
    /// The receiver failed to take it (after the webhook's retries).
    Failed,
    /// Dropped from a full queue.
    Dropped,
}

/// What became of a restart that was due or asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RestartOutcome {
    /// The command exited 0.
    Ok,
    /// It exited otherwise, or could not run.
    Failed,
    /// It was killed at `RESTART_TIMEOUT`.
    Timeout,
    /// It was held back (every server down, the address elsewhere, a refused `ctl restart`).
    Skipped,
}

impl AlertOutcome {
    /// METRICS' label.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertOutcome::Delivered => "delivered",
            AlertOutcome::Failed => "failed",
            AlertOutcome::Dropped => "dropped",
        }
    }
}

impl RestartOutcome {
    /// METRICS' label.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartOutcome::Ok => "ok",
            RestartOutcome::Failed => "failed",
            RestartOutcome::Timeout => "timeout",
            RestartOutcome::Skipped => "skipped",
        }
    }
}

/// Alerts by balancer, event and outcome, and restarts by balancer and outcome, since start:
/// `appbroker_alerts_total` and `appbroker_restarts_total`. A few dozen entries at most.
#[derive(Debug, Default)]
pub struct AlertFigures {
    alerts: Mutex<std::collections::BTreeMap<(String, AlertEvent, AlertOutcome), u64>>,
    restarts: Mutex<std::collections::BTreeMap<(String, RestartOutcome), u64>>,
}

/// The section's name, or empty for the broker as a whole: METRICS' `balancer` label.
fn section(balancer: Option<BalancerKind>) -> String {
    balancer.map_or_else(String::new, |b| b.section().to_string())
}

impl AlertFigures {
    /// Counts `alert` (a notice of drops, as the count it carries) with `outcome`.
    pub fn alert(&self, alert: &Alert, outcome: AlertOutcome) {
        let mut alerts = self.alerts.lock().unwrap_or_else(|p| p.into_inner());
        *alerts
            .entry((section(alert.balancer), alert.event, outcome))
            .or_default() += 1;
    }

    /// Counts a restart of a server of `balancer` with `outcome`.
    pub fn restart(&self, balancer: BalancerKind, outcome: RestartOutcome) {
        let mut restarts = self.restarts.lock().unwrap_or_else(|p| p.into_inner());
        *restarts
            .entry((section(Some(balancer)), outcome))
            .or_default() += 1;
    }

    /// The alerts counted of `balancer` and of the broker as a whole: (balancer label,
    /// event, outcome, count).
    pub fn alerts_of(
        &self,
        balancer: BalancerKind,
    ) -> Vec<(String, &'static str, &'static str, u64)> {
        let alerts = self.alerts.lock().unwrap_or_else(|p| p.into_inner());
        alerts
            .iter()
            .filter(|((b, _, _), _)| b.is_empty() || b == balancer.section())
            .map(|((b, e, o), n)| (b.clone(), e.as_str(), o.as_str(), *n))
            .collect()
    }

    /// The restarts counted of `balancer`: (outcome, count).
    pub fn restarts_of(&self, balancer: BalancerKind) -> Vec<(&'static str, u64)> {
        let restarts = self.restarts.lock().unwrap_or_else(|p| p.into_inner());
        restarts
            .iter()
            .filter(|((b, _), _)| b == balancer.section())
            .map(|((_, o), n)| (o.as_str(), *n))
            .collect()
    }
}

/// What the alert queue gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Popped {
    /// The next alert.
    Alert(Box<Alert>),
    /// This many alerts were dropped (the oldest, the queue being full) since the last time.
    Dropped(u64),
}

/// A queue of alerts, bounded: past its capacity the oldest are dropped and counted, so a
/// slow reader never holds up whoever pushes (a balancer's quarantine, an operator's action).
#[derive(Debug)]
pub struct AlertQueue {
    inner: Mutex<Waiting>,
    ready: Notify,
    capacity: usize,
    /// Where the alerts it drops are counted.
    figures: Option<Arc<AlertFigures>>,
}

#[derive(Debug, Default)]
struct Waiting {
    alerts: VecDeque<Alert>,
    dropped: u64,
    /// Taken and not [`AlertQueue::done`] with yet.
    in_hand: usize,
}

impl Default for AlertQueue {
    fn default() -> Self {
        AlertQueue::new(ALERT_QUEUE, None)
    }
}

impl AlertQueue {
    /// A queue of at most `capacity` alerts, counting those it drops in `figures`.
    pub fn new(capacity: usize, figures: Option<Arc<AlertFigures>>) -> AlertQueue {
        AlertQueue {
            inner: Mutex::default(),
            ready: Notify::new(),
            capacity: capacity.max(1),
            figures,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `alert`, dropping the oldest when full (a dropped `alerts_dropped` adds its
    /// count to the next); never waits.
    pub fn push(&self, alert: Alert) {
        {
            let mut waiting = self.lock();
            if waiting.alerts.len() >= self.capacity
                && let Some(oldest) = waiting.alerts.pop_front()
            {
                // A notice of alerts dropped before, dropped in turn, passes its count on.
                waiting.dropped += match (oldest.event, oldest.dropped) {
                    (AlertEvent::AlertsDropped, Some(n)) => n,
                    _ => 1,
                };
                if let Some(figures) = &self.figures {
                    figures.alert(&oldest, AlertOutcome::Dropped);
                }
            }
            waiting.alerts.push_back(alert);
        }
        self.ready.notify_one();
    }

    /// The count of alerts dropped since the last time, when any were, else the next alert,
    /// when one waits.
    pub fn try_pop(&self) -> Option<Popped> {
        let mut waiting = self.lock();
        let popped = if waiting.dropped > 0 {
            Popped::Dropped(std::mem::take(&mut waiting.dropped))
        } else {
            Popped::Alert(Box::new(waiting.alerts.pop_front()?))
        };
        waiting.in_hand += 1;
        Some(popped)
    }

    /// What was popped last has been dealt with (delivered, or given up).
    pub fn done(&self) {
        let mut waiting = self.lock();
        waiting.in_hand = waiting.in_hand.saturating_sub(1);
    }

    /// True when nothing waits and nothing popped is still being dealt with.
    pub fn is_idle(&self) -> bool {
        let waiting = self.lock();
        waiting.alerts.is_empty() && waiting.dropped == 0 && waiting.in_hand == 0
    }

    /// As [`AlertQueue::try_pop`], waiting for an alert.
    pub async fn pop(&self) -> Popped {
        loop {
            if let Some(popped) = self.try_pop() {
                return popped;
            }
            // A push between the look and here left a permit: this returns at once.
            self.ready.notified().await;
        }
    }

    /// Alerts waiting now.
    pub fn len(&self) -> usize {
        self.lock().alerts.len()
    }

    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
