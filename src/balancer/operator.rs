//! An operator's actions on a server (`appbroker ctl`, and the state file read back at start):
//! hold it out of the balancing (disabled or draining) and enable it again, give it a weight,
//! put it in quarantine or release it, cut its connections; and the record of a restart of
//! it (`RESTART_COMMAND`, run by the alerts machinery or `ctl restart`). Each is applied through
//! [`super::rules::overrides`]' pure transitions and logged once with who asked; they are
//! called through [`super::operation`] (`ctl` and the status page's actions alike) and by the
//! state file read back at start.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tracing::{info, warn};

use crate::balancer::Balancer;
use crate::balancer::alert_queue::Alert;
use crate::balancer::events::Event;
use crate::balancer::rules::health::{OperatorAsk, Reason, Release};
use crate::balancer::rules::overrides::{Hold, Mode, Overrides};
use crate::balancer::server::{Restarted, Server};
use crate::config::{AlertEvent, connections_stay, plural};

impl Balancer {
    /// The server of the current generation that `name` names (its id or `host:port`).
    pub fn find_server(&self, name: &str) -> Option<Arc<Server>> {
        self.generation()
            .servers
            .iter()
            .find(|s| s.is_named(name))
            .cloned()
    }

    /// Holds `server` out of the balancing (disabled or draining): no new clients, its open
    /// connections stay. True when this changed anything.
    pub fn hold(&self, server: &Server, hold: Hold) -> bool {
        let (mode, reason, by) = (hold.mode, hold.reason.clone(), hold.by.clone());
        let old = {
            let mut overrides = server.lock_overrides();
            // Under the lock, so `held` always says what `overrides` does.
            server.held.store(true, Relaxed);
            overrides.hold(hold)
        };
        if old
            .as_ref()
            .is_some_and(|o| o.mode == mode && o.reason == reason)
        {
            return false;
        }
        let why = if reason.is_empty() {
            String::new()
        } else {
            format!(" ({reason})")
        };
        let done = match mode {
            Mode::Drain => "draining",
            Mode::Disabled => "disabled",
        };
        warn!(
            "server {} {done} by {by}{why}: no new clients, {}",
            server.address,
            connections_stay(server.active() as usize)
        );
        self.told_held(server, true, &by, &format!("{done}{why}"));
        true
    }

    /// An operator's hold (`held`) or its end, told: its event and alert, and what it
    /// changed of the servers available.
    fn told_held(&self, server: &Server, held: bool, by: &str, words: &str) {
        let kind = self.kind();
        self.events.emit(|| Event::Held {
            balancer: kind,
            server: server.address.clone(),
            held,
            by: by.to_string(),
        });
        let event = if held {
            AlertEvent::ServerDisabled
        } else {
            AlertEvent::ServerEnabled
        };
        self.events.alert(|| Alert {
            who: Some(by.to_string()),
            ..Alert::new(event)
                .on(kind)
                .about(server.alert_server())
                .because(words)
        });
        self.availability_changed();
    }

    /// Ends an operator's hold of `server`; true when it was held.
    pub fn enable(&self, server: &Server, by: &str) -> bool {
        let mut overrides = server.lock_overrides();
        let Some(old) = overrides.enable() else {
            return false;
        };
        server.held.store(false, Relaxed);
        drop(overrides);
        info!(
            "server {} enabled by {by} (was {})",
            server.address,
            old.mode.as_str()
        );
        self.told_held(
            server,
            false,
            by,
            &format!("enabled (was {})", old.mode.as_str()),
        );
        true
    }

    /// Gives `server` an operator's weight (`None`: the file's again); the weight it takes.
    pub fn set_weight(&self, server: &Server, weight: Option<u32>, by: &str) -> u32 {
        let file = server.file_weight.load(Relaxed);
        let now = server.lock_overrides().set_weight(weight, file);
        let was = server.weight.swap(now, Relaxed);
        match weight {
            Some(_) => {
                info!(
                    "server {} weight {was} -> {now} by {by} (the file says {file})",
                    server.address
                )
            }
            None => {
                info!(
                    "server {} weight {was} -> {now} by {by}: the file's again",
                    server.address
                )
            }
        }
        now
    }

    /// Puts `server` in quarantine for `duration` on an operator's word (`asked`: who, or who
    /// and why): passing checks do not end it, only its time or [`Balancer::release_by_operator`].
    pub fn force_quarantine(
        &self,
        server: &Server,
        duration: Duration,
        asked: impl Into<OperatorAsk>,
    ) {
        let asked = asked.into();
        let (by, words) = (asked.by.clone(), asked.words());
        let why = match asked.reason.as_str() {
            "" => String::new(),
            reason => format!(" ({reason})"),
        };
        let q = server.health.forced(asked, duration, self.now());
        self.quarantined(server, Reason::Operator, &words, q);
        info!(
            "server {} put in quarantine by {by}{why} for {}: checks do not end it; `appbroker ctl release` does",
            server.address,
            crate::config::show_duration(duration)
        );
    }

    /// Ends `server`'s quarantine, whoever started it, on the word of the operator `by`; true
    /// when it was in one.
    pub fn release_by_operator(&self, server: &Server, by: &str) -> bool {
        let released = server.health.passed(Release::Operator, self.now());
        if released {
            self.announce_release(server, Release::Operator, &format!("released by {by}"));
        }
        released
    }

    /// Records a run of `RESTART_COMMAND` for `server` (shown beside it until the next), and
    /// publishes it.
    pub fn restarted(&self, server: &Server, run: Restarted) {
        let kind = self.kind();
        self.events.emit(|| Event::RestartRan {
            balancer: kind,
            server: server.address.clone(),
            exit: run.exit,
            outcome: run.outcome.clone(),
        });
        *server.restarted.lock().unwrap_or_else(|p| p.into_inner()) = Some(run);
    }

    /// Closes every open connection to `server` now (what each relay has written is flushed
    /// by the close); returns how many were open.
    pub fn cut(&self, server: &Server, by: &str) -> u64 {
        let open = server.active();
        let token = std::mem::take(&mut *server.cut.lock().unwrap_or_else(|p| p.into_inner()));
        token.cancel();
        warn!(
            "server {}: cutting its {} at the request of {by}",
            server.address,
            plural(open as usize, "open connection")
        );
        open
    }

    /// Applies overrides read back from the state file to `server` (its hold as it was, its
    /// weight); logged once.
    pub fn restore(&self, server: &Server, overrides: Overrides) {
        if let Some(weight) = overrides.weight {
            let file = server.file_weight.load(Relaxed);
            let now = server.lock_overrides().set_weight(Some(weight), file);
            server.weight.store(now, Relaxed);
        }
        if let Some(hold) = overrides.hold {
            let mut held = server.lock_overrides();
            server.held.store(true, Relaxed);
            held.hold(hold);
        }
        let o = server.overrides();
        info!(
            "server {}: restored from the state file: {}",
            server.address,
            describe(&o)
        );
    }
}

/// Overrides in words, for logs: `disabled (reason) by uid 0, weight 3`.
fn describe(o: &Overrides) -> String {
    let mut words = Vec::new();
    if let Some(h) = &o.hold {
        let reason = if h.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", h.reason)
        };
        words.push(format!("{}{reason} by {}", h.mode.as_str(), h.by));
    }
    if let Some(w) = o.weight {
        words.push(format!("weight {w}"));
    }
    if words.is_empty() {
        "no override".to_string()
    } else {
        words.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::balancer::rules::health::{Reason, Release};
    use crate::balancer::rules::overrides::{Hold, Mode};
    use crate::balancer::tests::balancer;
    use crate::balancer::{Balancer, Eligible, GenerationTls, Standing};

    fn hold(mode: Mode) -> Hold {
        Hold {
            mode,
            reason: "patch".into(),
            by: "uid 0".into(),
            since_wall_ms: 1,
        }
    }

    /// The servers (by index) the next `n` picks choose, each lease dropped at once.
    fn picks(balancer: &Balancer, n: usize) -> Vec<usize> {
        let generation = balancer.generation();
        (0..n)
            .filter_map(|_| {
                let now = balancer.clock_ms();
                generation
                    .pick(now, &[], Eligible::Available)
                    .or_else(|| generation.pick(now, &[], Eligible::EvenQuarantined))
                    .map(|lease| lease.index)
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_server_gets_no_client_until_enabled() {
        let balancer =
            balancer("REMOTE_SERVER_01=127.0.0.1 6001\nREMOTE_SERVER_02=127.0.0.1 6002\n");
        let first = balancer.find_server("01").expect("by id");
        assert!(
            balancer.find_server("127.0.0.1:6002").is_some(),
            "by address"
        );
        assert!(balancer.hold(&first, hold(Mode::Disabled)));
        assert!(picks(&balancer, 10).iter().all(|&i| i == 1));
        assert_eq!(balancer.state().servers[0].state, Standing::Disabled);
        // Even with every other server quarantined, a held one is not tried.
        let second = balancer.find_server("02").expect("by id");
        balancer.quarantine(&second, Reason::Monitor, "refused");
        assert!(picks(&balancer, 3).iter().all(|&i| i == 1));
        assert!(balancer.enable(&first, "uid 0"));
        assert!(!balancer.enable(&first, "uid 0"), "nothing left to enable");
        assert_eq!(picks(&balancer, 2), vec![0, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_operators_weight_is_followed_and_outlives_a_reload() {
        let text = "REMOTE_SERVER_01=127.0.0.1 6001\nREMOTE_SERVER_02=127.0.0.1 6002\n";
        let balancer = balancer(text);
        let first = balancer.find_server("01").expect("by id");
        assert_eq!(balancer.set_weight(&first, Some(0), "uid 0"), 0);
        assert!(picks(&balancer, 4).iter().all(|&i| i == 1));
        let again = crate::balancer::tests::balancer(
            "REMOTE_SERVER_01=127.0.0.1 6001 5\nREMOTE_SERVER_02=127.0.0.1 6002\n",
        );
        let changes =
            balancer.reconfigure(again.generation().config.clone(), GenerationTls::default());
        assert!(
            changes
                .iter()
                .any(|c| c.contains("keeps the operator's weight 0")),
            "{changes:?}"
        );
        let state = balancer.state();
        assert_eq!(
            (state.servers[0].weight, state.servers[0].file_weight),
            (0, 5)
        );
        assert_eq!(
            balancer.set_weight(&first, None, "uid 0"),
            5,
            "the file's again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_operators_quarantine_is_no_stale_one_to_fall_back_on() {
        let balancer = balancer("REMOTE_SERVER_01=127.0.0.1 6001\n");
        let server = balancer.find_server("01").expect("by id");
        balancer.quarantine(&server, Reason::Monitor, "refused");
        assert_eq!(picks(&balancer, 1), vec![0], "a stale quarantine is tried");
        balancer.force_quarantine(&server, Duration::from_secs(600), "uid 0");
        assert!(picks(&balancer, 1).is_empty());
        balancer.release_recovered(&server, Release::CheckPassed);
        assert!(picks(&balancer, 1).is_empty(), "checks do not end it");
        assert!(balancer.release_by_operator(&server, "uid 0"));
        assert_eq!(picks(&balancer, 1), vec![0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_ends_the_leases_of_that_server_only() {
        let balancer =
            balancer("REMOTE_SERVER_01=127.0.0.1 6001\nREMOTE_SERVER_02=127.0.0.1 6002\n");
        let generation = balancer.generation();
        let a = generation.pick(0, &[1], Eligible::Available).expect("01");
        let b = generation.pick(0, &[0], Eligible::Available).expect("02");
        assert_eq!(balancer.cut(&a.server, "uid 0"), 1);
        assert!(a.cut.is_cancelled() && !b.cut.is_cancelled());
        let later = generation.pick(0, &[1], Eligible::Available).expect("01");
        assert!(!later.cut.is_cancelled(), "a new connection is not cut");
    }
}
