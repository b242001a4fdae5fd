//! The control loop of a running broker, on the runtime that started it: it applies reloads
//! one at a time as they are asked for, and on shutdown drains: keeps serving for
//! `SHUTDOWN_GRACE`, closes the listeners, lets connections finish for up to
//! `SHUTDOWN_TIMEOUT`, and cuts the rest.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::running_balancer::RunningBalancer;
use super::{ControlCommand, ReloadError, Source};
use crate::alerts::Alerting;
use crate::balancer::alert_queue::Alert;
use crate::balancer::events::{Event, Events, Reloaded};
use crate::balancer::shared::Shared;
use crate::config::{AlertEvent, BalancerKind, plural, show_duration};
use crate::http_balancer::sessions::SessionSecrets;
use crate::net::resolve::Resolver;
use crate::net::workers::Workers;
use crate::query::Operators;

/// The broker's state at run time, owned by its control loop ([`ControlLoop::run`]), which
/// applies each reload to it.
pub(super) struct ControlLoop {
    /// What every connection reads: the configuration and the balancers a reload swaps, the
    /// shutdown state the drain sets.
    pub(super) shared: Arc<Shared>,
    /// The keys of the HTTP balancers' session cookies, configured again by each reload.
    pub(super) session_secrets: Arc<SessionSecrets>,
    /// Who may act from the status page: the users file read again by each reload.
    pub(super) operators: Arc<Operators>,
    pub(super) workers: Workers,
    pub(super) resolver: Arc<Resolver>,
    pub(super) events: Events,
    /// The balancers serving, in configuration order.
    pub(super) serving: Vec<RunningBalancer>,
    /// Balancers removed by a reload whose connections may still be open.
    pub(super) retired: Vec<RunningBalancer>,
    /// Cancelled when the broker's handle is dropped: everything stops at once.
    pub(super) stopping: CancellationToken,
    /// Where the balancers listen, for the handle.
    pub(super) addrs: Arc<ArcSwap<Vec<(BalancerKind, SocketAddr)>>>,
    /// Why the file is not read again on a reload, when it is not.
    pub(super) no_file_reload: Option<String>,
    /// The alerts, given their last deliveries once the drain is over.
    pub(super) alerting: Alerting,
    /// The broker this one replaces on its supervisor's ports (see [`super::Bound::taking_over`]).
    pub(super) takes_over: Option<u32>,
}

/// How long a stopping broker gives its last alerts (`broker_stopping`) to be delivered:
/// one request to a receiver that answers; a receiver that does not is not waited for.
const LAST_ALERTS: Duration = Duration::from_secs(5);

impl ControlLoop {
    /// Serves until a shutdown is requested (then drains) or the handle is dropped (then
    /// everything is cut), applying each reload asked for on `commands`.
    pub(super) async fn run(mut self, mut commands: mpsc::Receiver<ControlCommand>) {
        info!("broker ready");
        self.events.emit(|| Event::Ready);
        match self.takes_over {
            // Its supervisor tells of the change (`broker_upgraded`), or it is none (a
            // reload that moved the ports): nothing started that was not serving.
            Some(pid) => info!(
                "taking over from the broker (pid {pid}) on the ports its supervisor holds; \
                 that one drains"
            ),
            None => self.events.alert(|| Alert::new(AlertEvent::BrokerStarted)),
        }
        let shutdown = self.shared.shutdown.clone();
        let mut every_second = tokio::time::interval(Duration::from_secs(1));
        every_second.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut wave = Wave::default();
        loop {
            tokio::select! {
                _ = shutdown.requested() => break,
                _ = self.stopping.cancelled() => return,
                command = commands.recv() => match command {
                    Some(ControlCommand::Reload { source, reply }) => {
                        self.reload(source, reply).await
                    }
                    None => std::future::pending().await,
                },
                _ = every_second.tick() => {
                    if wave.ebbs(self.open()) {
                        crate::support::unsafe_calls::give_back_free_memory();
                    }
                }
            }
        }
        self.drain().await;
        self.alerting.flush(LAST_ALERTS).await;
        self.events.emit(|| Event::Stopped);
        info!("broker stopped");
    }

    /// Applies one reload and answers with its result, when an answer is awaited.
    async fn reload(
        &mut self,
        source: Source,
        reply: Option<oneshot::Sender<Result<Reloaded, ReloadError>>>,
    ) {
        let result = match source {
            Source::File => self.reload_file().await,
            Source::Config(config) => self.apply(*config).await,
        };
        match &result {
            Ok(reloaded) => self.events.emit(|| Event::Reloaded(reloaded.clone())),
            Err(e) => self
                .events
                .emit(|| Event::ReloadRejected { errors: e.lines() }),
        }
        if let Some(reply) = reply {
            let _ = reply.send(result);
        }
    }

    /// The shutdown: `SHUTDOWN_GRACE` of service while PING answers 503, the listeners
    /// closed, `SHUTDOWN_TIMEOUT` for the connections to finish, then the rest cut.
    async fn drain(&mut self) {
        let general = self.shared.config.load().general.clone();
        self.shared.shutdown.set_draining();
        self.events.emit(|| Event::Draining);
        // Handed over, the ports go on being served by the broker that took them.
        if !self.shared.shutdown.is_handed_over() {
            self.events.alert(|| Alert::new(AlertEvent::BrokerStopping));
        }
        if !general.shutdown_grace.is_zero() {
            info!(
                "draining: still serving for SHUTDOWN_GRACE ({}) while PING answers 503",
                show_duration(general.shutdown_grace)
            );
            tokio::time::sleep(general.shutdown_grace).await;
        }
        self.serving.append(&mut self.retired);
        for running in &mut self.serving {
            running.stop_accepting(false).await;
        }
        let open = self.open();
        if open > 0 {
            info!(
                "listeners closed; waiting up to {} for {} to finish",
                show_duration(general.shutdown_timeout),
                plural(open, "connection")
            );
        } else {
            info!("listeners closed");
        }
        if tokio::time::timeout(general.shutdown_timeout, self.all_done())
            .await
            .is_err()
        {
            warn!(
                "SHUTDOWN_TIMEOUT ({}) is over: cutting {} still open",
                show_duration(general.shutdown_timeout),
                plural(self.open(), "connection")
            );
            for running in &self.serving {
                running.cut.cancel();
            }
            // Cut relays end at their next poll; this only waits for their closing log lines.
            let _ = tokio::time::timeout(Duration::from_secs(5), self.all_done()).await;
        }
        for running in &self.serving {
            running.stop_background.cancel();
        }
    }

    /// Connections open now, in every balancer.
    fn open(&self) -> usize {
        self.serving.iter().map(|r| r.tasks.len()).sum()
    }

    /// Completes when every connection of every balancer has ended.
    async fn all_done(&self) {
        for running in &self.serving {
            running.tasks.wait().await;
        }
    }
}

/// A wave of connections, followed to its ebb: once at least [`Wave::LEAST`] connections have
/// gone and fewer than half of its peak are left, the heap's free memory is given back to the
/// system, so the process does not stay at the wave's peak (glibc keeps what its worker
/// threads' arenas freed). Only then: giving it back walks the heap under its locks, which a
/// steady load should not pay every second.
#[derive(Debug, Default)]
struct Wave {
    /// The most connections open since memory was last given back.
    peak: usize,
}

impl Wave {
    /// The fewest connections gone that make a wave worth a trim: each took a few kilobytes
    /// at most, so fewer free too little to matter.
    const LEAST: usize = 1000;

    /// Counts `open` connections now: true at a wave's ebb, when memory is to be given back
    /// (the next wave is counted from here).
    fn ebbs(&mut self, open: usize) -> bool {
        self.peak = self.peak.max(open);
        if self.peak - open >= Wave::LEAST && open <= self.peak / 2 {
            self.peak = open;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_given_back_once_per_wave_at_its_ebb() {
        let mut wave = Wave::default();
        // Rising, and a steady load's swings: nothing.
        for open in [0, 500, 3000, 5000, 4000, 3000, 2600] {
            assert!(!wave.ebbs(open), "{open}");
        }
        // Below half the peak with a thousand gone or more: given back, and counted anew.
        assert!(wave.ebbs(2400));
        assert!(!wave.ebbs(1500), "fewer than a thousand gone since");
        assert!(wave.ebbs(100));
        // A small wave is not worth it; a new large one is.
        assert!(!wave.ebbs(900));
        assert!(!wave.ebbs(0));
        assert!(!wave.ebbs(10_000));
        assert!(wave.ebbs(10));
    }
}
