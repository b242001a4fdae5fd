//! Health events: a server put in quarantine (by a failed check, a client's failed connect, a
//! run of timed-out requests) or released (its checks passed, a client's connect, its time
//! up), the expiry sweep, and the monitor's checks counted. The pure transitions are
//! [`health`](super::rules::health)'s; this applies them to a server, writes the operator's
//! lines (the TOTVS quarantine line byte for byte), publishes the events and queues the
//! alerts, and tells when no server is available any more or one is again.

use std::time::Duration;

use tracing::{info, warn};

use crate::balancer::Balancer;
use crate::balancer::alert_queue::Alert;
use crate::balancer::events::Event;
use crate::balancer::rules::health::{CheckFailed, CheckResult, Quarantined, Reason, Release};
use crate::balancer::server::Server;
use crate::config::AlertEvent;
use crate::support::clock::time_of_day;

impl Balancer {
    /// Puts `server` in quarantine for `reason` (or moves its end out) for `QUARANTINE_TIME`,
    /// and logs it: the TOTVS line byte for byte, then the end in local time for people.
    pub fn quarantine(&self, server: &Server, reason: Reason, error: &str) {
        let duration = self.generation.load().config.quarantine_time;
        self.quarantine_for(server, reason, error, duration);
    }

    /// Puts `server` in quarantine for `reason` for `duration` (or moves its end), and logs it.
    fn quarantine_for(&self, server: &Server, reason: Reason, error: &str, duration: Duration) {
        let q = server.health.failed(reason, error, duration, self.now());
        self.quarantined(server, reason, error, q);
    }

    /// What a quarantine's start (or its end moved) tells: the release of the one before, if
    /// its time was up, the event and the TOTVS line.
    pub(super) fn quarantined(&self, server: &Server, reason: Reason, error: &str, q: Quarantined) {
        if q.expired_first {
            self.announce_release(server, Release::TimeUp, Release::TimeUp.as_str());
        }
        let (start, stop) = (q.at_wall_ms / 1000, q.until_wall_ms / 1000);
        self.events.emit(|| Event::Quarantined {
            balancer: self.kind(),
            server: server.address.clone(),
            reason,
            error: error.to_string(),
            started: q.started,
            at_wall_ms: q.at_wall_ms,
            until_wall_ms: q.until_wall_ms,
        });
        warn!(
            "putting server {} in quarantine start={start} stop={stop} ({}) until={}",
            server.address,
            reason.as_str(),
            time_of_day(stop * 1000)
        );
        if q.started {
            self.events.alert(|| Alert {
                until_wall_ms: Some(q.until_wall_ms),
                ..Alert::new(AlertEvent::QuarantineEntered)
                    .on(self.kind())
                    .about(server.alert_server())
                    .because(format!("{}: {error}", reason.as_str()))
            });
            self.availability_changed();
        }
        // The monitor sleeps until the earliest deadline; a new one may be earlier.
        self.health_changed.notify_one();
    }

    /// Releases `server` from quarantine, if it is in one, because it proved itself again
    /// (`why`: its checks passed, or a client's connect succeeded while every server was
    /// quarantined), and logs why. An operator's quarantine is not released so: only its time
    /// or [`Balancer::release_by_operator`] ends it.
    pub fn release_recovered(&self, server: &Server, why: Release) {
        if server.health.passed(why, self.now()) {
            self.announce_release(server, why, why.as_str());
        }
    }

    /// The one place a release is told, whoever released the server: its line, with `words`
    /// for its cause, and its event.
    pub(super) fn announce_release(&self, server: &Server, why: Release, words: &str) {
        info!(
            "releasing server {} from quarantine ({words})",
            server.address
        );
        self.events.emit(|| Event::Released {
            balancer: self.kind(),
            server: server.address.clone(),
            why,
        });
        self.events.alert(|| {
            Alert::new(AlertEvent::QuarantineLeft)
                .on(self.kind())
                .about(server.alert_server())
                .because(words)
        });
        self.availability_changed();
    }

    /// Tells when no server takes new clients any more, or one does again after none did:
    /// its event and alert, once per change.
    pub(super) fn availability_changed(&self) {
        let generation = self.generation();
        let now = self.clock.now_ms();
        let total = generation.servers.len();
        let available = generation
            .servers
            .iter()
            .filter(|s| s.takes_new_clients(now))
            .count();
        let none = available == 0;
        if self
            .none_available
            .swap(none, std::sync::atomic::Ordering::Relaxed)
            == none
        {
            return;
        }
        let kind = self.kind();
        self.events.emit(|| Event::ServersAvailable {
            balancer: kind,
            available,
            total,
        });
        let event = if none {
            AlertEvent::NoServersAvailable
        } else {
            AlertEvent::ServersAvailableAgain
        };
        self.events.alert(|| Alert {
            available: Some(available),
            total: Some(total),
            ..Alert::new(event).on(kind)
        });
    }

    /// The expiry sweep: releases the servers whose quarantine's time is up, logging each;
    /// returns the earliest deadline left (on the balancer's clock), for the monitor to wake
    /// then.
    pub fn sweep_expired_quarantines(&self) -> Option<tokio::time::Instant> {
        let now = self.now();
        let mut earliest: Option<u64> = None;
        for server in &self.generation().servers {
            if server.health.expired(now) {
                self.announce_release(server, Release::TimeUp, Release::TimeUp.as_str());
            }
            let until = server.health.until_ms();
            if until != 0 {
                earliest = Some(earliest.map_or(until, |e| e.min(until)));
            }
        }
        earliest.map(|ms| self.clock.instant(ms))
    }

    /// Completes when a quarantine starts or a reload stores a new generation.
    pub async fn health_changed(&self) {
        self.health_changed.notified().await;
    }

    /// Records a passed monitor check of `server`; returns the checks passed in a row.
    pub fn check_passed(&self, server: &Server, check: CheckResult) -> u32 {
        server.health.check_passed(check)
    }

    /// Records a failed monitor check of `server` (the check's error is set).
    pub fn check_failed(&self, server: &Server, check: CheckResult) -> CheckFailed {
        server.health.check_failed(check, self.now())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::balancer::Standing;
    use crate::balancer::rules::health::{Reason, Release};
    use crate::balancer::tests::balancer;

    #[tokio::test(start_paused = true)]
    async fn a_failure_after_the_time_is_up_starts_a_new_quarantine() {
        let balancer = balancer("REMOTE_SERVER_01=127.0.0.1 6001\n");
        let server = Arc::clone(&balancer.generation().servers[0]);
        balancer.quarantine(&server, Reason::Monitor, "refused");
        tokio::time::advance(Duration::from_secs(121)).await;
        // The monitor has not woken to apply the release yet; a client's connect fails.
        balancer.quarantine(&server, Reason::Connect, "timed out");
        let state = balancer.state();
        let server = &state.servers[0];
        assert_eq!(server.quarantines, 2);
        assert_eq!(server.history.len(), 2);
        assert_eq!(server.history[0].released, Some(Release::TimeUp));
        assert_eq!(server.history[1].reason, Reason::Connect);
        assert!(server.history[1].end_wall_ms.is_none());
        assert_eq!(server.state, Standing::Quarantined);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_quarantines_are_released_and_the_next_deadline_returned() {
        let balancer =
            balancer("REMOTE_SERVER_01=127.0.0.1 6001\nREMOTE_SERVER_02=127.0.0.1 6002\n");
        let generation = balancer.generation();
        assert_eq!(balancer.sweep_expired_quarantines(), None);
        balancer.quarantine(&generation.servers[0], Reason::Monitor, "refused");
        tokio::time::advance(Duration::from_secs(60)).await;
        balancer.quarantine(&generation.servers[1], Reason::Monitor, "refused");
        let first_end = tokio::time::Instant::now() + Duration::from_secs(60);
        assert_eq!(balancer.sweep_expired_quarantines(), Some(first_end));
        tokio::time::advance(Duration::from_secs(60)).await;
        let second_end = tokio::time::Instant::now() + Duration::from_secs(60);
        assert_eq!(balancer.sweep_expired_quarantines(), Some(second_end));
        assert!(!generation.servers[0].is_quarantined());
        assert!(generation.servers[1].is_quarantined());
    }
}
