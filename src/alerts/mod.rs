//! Alerts and restarts: what operators ran watchdogs for, scraping the status page. The broker
//! knows its events first-hand: each alert (a quarantine entered or left, no server available,
//! an operator's hold, the broker started or stopping, a certificate expiring, a restart run)
//! goes to the webhooks and commands the configuration names, and an AppServer stuck in a
//! health quarantine is restarted by the operator's command.
//!
//! Never on the data path, never unbounded: the balancers put alerts on a low-rate queue of
//! their own ([`crate::balancer::alert_queue::AlertQueue`], bounded, the oldest dropped and
//! counted); one task routes them to each receiver's queue (bounded alike); each receiver's
//! task delivers at its pace, each delivery bounded by `ALERT_TIMEOUT`. A client, a check or a
//! reload waits for none of it.
//!
//! - `dispatch`: the routes, the receivers' queues and tasks, their failures logged once per
//!   episode.
//! - `message`: an alert as JSON, as one line of text, as a command's variables (pure).
//! - `webhook`: one POST over HTTP or HTTPS, bounded, retried with back-off.
//! - `command`: one command run with `/bin/sh -c`, bounded, without the broker's own
//!   variables, its last lines kept.
//! - `restart`: `RESTART_COMMAND` for servers stuck in quarantine, and `ctl restart`.
//! - `address`: whether `RESTART_ONLY_WITH_ADDRESS` is on this host.

mod address;
mod command;
pub mod dispatch;
pub mod message;
pub mod restart;
mod webhook;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::balancer::alert_queue::{Alert, Popped};
use crate::balancer::events::{AlertFeed, Event, Events};
use crate::balancer::shared::Shared;
use crate::balancer::{Balancer, Restarted, Server};
use crate::config::{AlertEvent, Config};
use dispatch::{Delivery, MAX_COMMANDS, Sinks};
use restart::Restarts;

pub use command::is_internal;

/// A running broker's alerts and restarts: started beside its monitors, stopped with it.
#[derive(Debug, Clone)]
pub struct Alerting {
    restarts: Arc<Restarts>,
    feed: Arc<AlertFeed>,
    sinks: Arc<Mutex<Sinks>>,
}

impl std::fmt::Debug for Sinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sinks")
    }
}

/// This host's name, as the alerts name the broker (`broker`).
pub fn host_name() -> String {
    #[cfg(unix)]
    if let Ok(name) = nix::unistd::gethostname() {
        return name.to_string_lossy().into_owned();
    }
    "localhost".into()
}

impl Alerting {
    /// Starts reading `events`' alerts for the broker `shared` describes, and its restarts, until
    /// `stop` is cancelled.
    pub fn start(shared: Arc<Shared>, events: &Events, stop: CancellationToken) -> Alerting {
        let delivery = Delivery {
            broker: host_name().into(),
            events: Some(events.clone()),
            commands: Arc::new(Semaphore::new(MAX_COMMANDS)),
            stop: stop.clone(),
        };
        let alerting = Alerting {
            restarts: Arc::new(Restarts::new(Arc::clone(&shared))),
            feed: Arc::new(events.alert_feed()),
            sinks: Arc::new(Mutex::new(Sinks::new(delivery))),
        };
        tokio::spawn(Arc::clone(&alerting.restarts).run(stop.clone()));
        tokio::spawn(alerting.clone().dispatch(shared, events.clone(), stop));
        alerting
    }

    fn sinks(&self) -> std::sync::MutexGuard<'_, Sinks> {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Routes each alert to its receivers, until `stop`.
    async fn dispatch(self, shared: Arc<Shared>, events: Events, stop: CancellationToken) {
        loop {
            let popped = tokio::select! {
                _ = stop.cancelled() => return,
                popped = self.feed.next() => popped,
            };
            let alert = match popped {
                Popped::Alert(alert) => *alert,
                Popped::Dropped(count) => {
                    warn!("alerts: {count} alert(s) dropped: the queue of alerts was full");
                    events.emit(|| Event::AlertsDropped { count });
                    dispatch::dropped(count)
                }
            };
            if matches!(
                alert.event,
                AlertEvent::QuarantineEntered
                    | AlertEvent::QuarantineLeft
                    | AlertEvent::ServersAvailableAgain
            ) {
                self.restarts.look_again();
            }
            let config = shared.config.load_full();
            self.sinks().route(&config, &alert);
            self.feed.done();
        }
    }

    /// Waits, up to `within`, until every alert queued has been delivered or given up: what
    /// a stopping broker gives its last alerts.
    pub async fn flush(&self, within: Duration) {
        let end = tokio::time::Instant::now() + within;
        while !(self.feed.is_idle() && self.sinks().idle()) && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `ctl restart`: `RESTART_COMMAND` for `server` of `balancer` now (see
    /// [`Restarts::by_hand`]).
    pub async fn restart(
        &self,
        balancer: &Arc<Balancer>,
        server: &Arc<Server>,
        force: bool,
        by: &str,
    ) -> Result<Restarted, String> {
        self.restarts
            .by_hand(balancer, server, force, by)
            .await
            .map_err(|refusal| refusal.words())
    }

    /// How the status page's `restart` runs: as `ctl restart` without `--force` (its
    /// cooldown holds), asked by the `who` it is given.
    pub fn restarter(&self) -> crate::query::operate::Restarter {
        let restarts = Arc::clone(&self.restarts);
        Arc::new(move |balancer, server, who| {
            let restarts = Arc::clone(&restarts);
            Box::pin(async move { restarts.by_hand(&balancer, &server, false, &who).await })
        })
    }
}

/// Sends `alert` to the receivers `config` routes it to, once, in the background: for a
/// process that runs no broker (the supervisor's `broker_restarted`). Bounded as any delivery.
pub fn send_now(config: &Config, alert: Alert) -> tokio::task::JoinHandle<()> {
    let destinations = dispatch::routes(config, &alert);
    let broker = host_name();
    tokio::spawn(async move {
        let mut deliveries = tokio::task::JoinSet::new();
        for destination in destinations {
            let (alert, broker) = (alert.clone(), broker.clone());
            deliveries
                .spawn(async move { dispatch::deliver_once(&destination, &alert, &broker).await });
        }
        while deliveries.join_next().await.is_some() {}
    })
}
