//! The alerts' own queue: [`Alert`]s, the few events worth telling people (a quarantine
//! entered or left, no server available, an operator's hold, the broker started or stopping,
//! a restart run), on a low-rate bounded queue ([`AlertQueue`]) that the alerts machinery
//! reads through the events hub's feed, and the alerts and restarts counted for METRICS
//! ([`AlertFigures`]). It is no subscription to every event: an HTTP request builds and sends
//! nothing here. Past [`ALERT_QUEUE`] the oldest are dropped, and the reader is told how many.
//!
//! In `balancer/`, not in `alerts/`: the balancer writes on it, and `alerts` is a higher
//! layer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::config::{AlertEvent, BalancerKind};
use crate::support::clock::wall_ms;

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
