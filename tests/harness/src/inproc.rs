//! A broker started in this process through the library's entry point, on a generated
//! `appserver.ini`, with every event it publishes recorded from before it starts: tests
//! assert on those events and on a balancer's state, not on log text.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use appbroker::balancer::BalancerState;
use appbroker::balancer::events::{Missed, Reloaded, Subscription};
pub use appbroker::balancer::rules::health::{Reason, Release};
use appbroker::config::{BalancerKind, Config, Notice};
pub use appbroker::net::relay::{End, Side};
use appbroker::{Bound, Broker, Event, ReloadError, StartError};
use tokio::task::JoinHandle;

use super::{fill_placeholders, free_ports, until};

/// A broker running in this process, and what it has published.
pub struct InProcess {
    /// The broker itself, started.
    pub broker: Broker,
    /// Ports of the balancers, in the order of the `@PORT@`, `@PORT2@` placeholders.
    pub ports: Vec<u16>,
    /// Its directory (`@DIR@`), where its configuration file is; removed when dropped.
    pub dir: tempfile::TempDir,
    /// Its configuration file, which [`InProcess::rewrite`] replaces.
    pub config_path: PathBuf,
    /// Every event since before it started.
    pub events: EventLog,
    /// What the configuration's load had to say (accepted TOTVS keys, substitutions, ...).
    pub notices: Vec<Notice>,
}

impl InProcess {
    /// Starts a broker on `ini`, where `@PORT@` (and `@PORT2@` for a second balancer) stand
    /// for free ports and `@DIR@` for its directory, and waits until it serves.
    pub async fn start(ini: &str) -> InProcess {
        InProcess::start_with(ini, |bound| bound).await
    }

    /// As [`InProcess::start`], with `prepare` applied to the bound broker before it starts
    /// (its own session secret given, say).
    pub async fn start_with(ini: &str, prepare: impl Fn(Bound) -> Bound) -> InProcess {
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("temp dir");
            let ports = free_ports();
            let config_path = dir.path().join("appserver.ini");
            std::fs::write(&config_path, fill_placeholders(ini, &ports, dir.path()))
                .expect("write ini");
            let loaded = Config::from_path(&config_path)
                .unwrap_or_else(|e| panic!("the test's ini is invalid: {}", e.report()));
            let notices = loaded.notices;
            let bound = match Broker::bind_own(loaded.config) {
                Ok(bound) => bound,
                // Someone took a port between free_ports() and the bind.
                Err(StartError::Bind(e)) if e.reason.contains("address already in use") => {
                    continue;
                }
                Err(e) => panic!("the broker did not start: {e}"),
            };
            let events = EventLog::follow(bound.subscribe());
            let broker = prepare(bound).start();
            events
                .wait_for("the broker ready", |e| *e == Event::Ready)
                .await;
            return InProcess {
                broker,
                ports,
                dir,
                config_path,
                events,
                notices,
            };
        }
        panic!("no free port after 5 tries");
    }

    /// The first balancer's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[0]))
    }

    /// The second balancer's address.
    pub fn addr2(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[1]))
    }

    /// The live state of the first balancer.
    pub fn state(&self) -> BalancerState {
        let (kind, _) = self.broker.addrs()[0];
        self.state_of(kind)
    }

    /// The live state of balancer `kind`.
    pub fn state_of(&self, kind: BalancerKind) -> BalancerState {
        self.broker
            .state(kind)
            .unwrap_or_else(|| panic!("no balancer {kind}"))
    }

    /// Writes `text` as the broker's configuration file, with the placeholders standing for
    /// the ports and directory it started with.
    pub fn rewrite(&self, text: &str) {
        std::fs::write(
            &self.config_path,
            fill_placeholders(text, &self.ports, self.dir.path()),
        )
        .expect("rewrite the ini");
    }

    /// Rewrites the file with `text` and reloads it, as a SIGHUP does; what the reload did.
    pub async fn reload(&self, text: &str) -> Reloaded {
        self.rewrite(text);
        self.broker
            .reload_file()
            .await
            .unwrap_or_else(|e| panic!("the reload was rejected: {e}"))
    }

    /// Rewrites the file with `text` and reloads it; the reload must be rejected.
    pub async fn reload_rejected(&self, text: &str) -> ReloadError {
        self.rewrite(text);
        match self.broker.reload_file().await {
            Ok(reloaded) => panic!("the reload was applied: {reloaded:?}"),
            Err(e) => e,
        }
    }
}

/// The events of one broker, recorded as they come by a task of their own.
pub struct EventLog {
    seen: Arc<Mutex<Vec<Event>>>,
    /// Events dropped because the recorder fell behind: any makes the assertions void.
    missed: Arc<Mutex<Option<Missed>>>,
    recorder: JoinHandle<()>,
}

impl EventLog {
    /// Records what `subscription` receives from now on.
    pub fn follow(mut subscription: Subscription) -> EventLog {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let missed = Arc::new(Mutex::new(None));
        let recorder = {
            let (seen, missed) = (Arc::clone(&seen), Arc::clone(&missed));
            tokio::spawn(async move {
                loop {
                    match subscription.recv().await {
                        Ok(event) => seen.lock().unwrap().push(event),
                        Err(Missed::Closed) => return,
                        Err(lagged) => *missed.lock().unwrap() = Some(lagged),
                    }
                }
            })
        };
        EventLog {
            seen,
            missed,
            recorder,
        }
    }

    /// Every event so far.
    pub fn all(&self) -> Vec<Event> {
        if let Some(missed) = *self.missed.lock().unwrap() {
            panic!("the test cannot judge: {missed}");
        }
        self.seen.lock().unwrap().clone()
    }

    /// The events so far that `wanted` picks.
    pub fn matching(&self, wanted: impl Fn(&Event) -> bool) -> Vec<Event> {
        self.all().into_iter().filter(|e| wanted(e)).collect()
    }

    /// How many events so far `wanted` picks.
    pub fn count(&self, wanted: impl Fn(&Event) -> bool) -> usize {
        self.all().iter().filter(|e| wanted(e)).count()
    }

    /// Waits until an event that `wanted` picks has come; returns the first.
    pub async fn wait_for(&self, what: &str, wanted: impl Fn(&Event) -> bool) -> Event {
        self.wait_for_count(what, 1, &wanted).await;
        self.matching(wanted).remove(0)
    }

    /// Waits until `count` events that `wanted` picks have come.
    pub async fn wait_for_count(&self, what: &str, count: usize, wanted: impl Fn(&Event) -> bool) {
        until(&format!("{count} x {what}"), async || {
            let enough = self.count(&wanted) >= count;
            enough
                .then_some(())
                .ok_or_else(|| format!("events:\n{}", self.text()))
        })
        .await
    }

    /// The events so far, one per line, for assertion messages.
    pub fn text(&self) -> String {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.recorder.abort();
    }
}

impl EventLog {
    /// The index (in [`EventLog::all`]) of the first event `wanted` picks.
    pub fn position(&self, wanted: impl Fn(&Event) -> bool) -> Option<usize> {
        self.all().iter().position(wanted)
    }

    /// Every quarantine of `server` (started or extended), in order.
    pub fn quarantines(&self, server: &str) -> Vec<Quarantine> {
        self.all()
            .iter()
            .filter_map(|e| quarantine_of(e, server))
            .collect()
    }

    /// Waits for a quarantine of `server` for `reason`.
    pub async fn wait_for_quarantine(&self, server: &str, reason: Reason) -> Quarantine {
        let event = self
            .wait_for(&format!("a quarantine of {server} ({reason:?})"), |e| {
                quarantine_of(e, server).is_some_and(|q| q.reason == reason)
            })
            .await;
        quarantine_of(&event, server).expect("matched above")
    }

    /// Waits for `server`'s release for `why`.
    pub async fn wait_for_release(&self, server: &str, why: Release) {
        self.wait_for(&format!("the release of {server} ({why:?})"), |e| {
            is_release_of(e, server, why)
        })
        .await;
    }

    /// The explanations of `server`'s failed monitor checks, with their count in a row.
    pub fn check_failures(&self, server: &str) -> Vec<(String, u32)> {
        self.all()
            .iter()
            .filter_map(|e| match e {
                Event::CheckFailed {
                    server: s,
                    explained,
                    in_a_row,
                    ..
                } if s == server => Some((explained.clone(), *in_a_row)),
                _ => None,
            })
            .collect()
    }

    /// Waits for a failed monitor check of `server`; its explanation.
    pub async fn wait_for_check_failure(&self, server: &str) -> String {
        self.wait_for(&format!("a failed check of {server}"), |e| {
            is_check_failure_of(e, server)
        })
        .await;
        self.check_failures(server).remove(0).0
    }

    /// The errors of the failed connects of clients to `server`.
    pub fn connect_failures(&self, server: &str) -> Vec<String> {
        self.all()
            .iter()
            .filter_map(|e| match e {
                Event::ConnectFailed {
                    server: s, error, ..
                } if s == server => Some(error.clone()),
                _ => None,
            })
            .collect()
    }

    /// Waits for a monitor round that found `available` servers and `unavailable` in
    /// quarantine.
    pub async fn wait_for_round(&self, available: usize, unavailable: usize) {
        self.wait_for_rounds(available, unavailable, 1).await;
    }

    /// Waits for `count` such rounds.
    pub async fn wait_for_rounds(&self, available: usize, unavailable: usize, count: usize) {
        let what = format!("a round with {available} available, {unavailable} unavailable");
        self.wait_for_count(&what, count, |e| is_round(e, available, unavailable))
            .await;
    }

    /// How a connection from `client` ended, once it has.
    pub async fn wait_for_end(&self, client: SocketAddr) -> Ended {
        let event = self
            .wait_for(&format!("the end of {client}'s connection"), |e| {
                ended_of(e, client).is_some()
            })
            .await;
        ended_of(&event, client).expect("matched above")
    }

    /// Connections ended so far.
    pub fn ended(&self) -> usize {
        self.count(|e| matches!(e, Event::ConnectionEnded { .. }))
    }

    /// Waits until `count` connections have ended in all.
    pub async fn wait_for_ended(&self, count: usize) {
        self.wait_for_count("connections ended", count, |e| {
            matches!(e, Event::ConnectionEnded { .. })
        })
        .await;
    }
}

/// A quarantine as its event tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    /// What put the server there.
    pub reason: Reason,
    /// The failure, as the event words it.
    pub error: String,
    /// True when the failure started it (false: it was extended).
    pub started: bool,
    /// Its `start=` and `stop=` (the failure's time and the end), in seconds since the epoch.
    pub start: u64,
    /// Its end: `start=` plus the quarantine's time.
    pub stop: u64,
}

/// The quarantine `event` is, when it is one of `server`.
pub fn quarantine_of(event: &Event, server: &str) -> Option<Quarantine> {
    match event {
        Event::Quarantined {
            server: s,
            reason,
            error,
            started,
            at_wall_ms,
            until_wall_ms,
            ..
        } if s == server => Some(Quarantine {
            reason: *reason,
            error: error.clone(),
            started: *started,
            start: at_wall_ms / 1000,
            stop: until_wall_ms / 1000,
        }),
        _ => None,
    }
}

/// True for the release of `server` for `why`.
pub fn is_release_of(event: &Event, server: &str, why: Release) -> bool {
    matches!(event, Event::Released { server: s, why: w, .. } if s == server && *w == why)
}

/// True for any release of `server`.
pub fn is_any_release_of(event: &Event, server: &str) -> bool {
    matches!(event, Event::Released { server: s, .. } if s == server)
}

/// True for a failed monitor check of `server`.
pub fn is_check_failure_of(event: &Event, server: &str) -> bool {
    matches!(event, Event::CheckFailed { server: s, .. } if s == server)
}

/// True for a passed monitor check of `server`.
pub fn is_check_pass_of(event: &Event, server: &str) -> bool {
    matches!(event, Event::CheckPassed { server: s, .. } if s == server)
}

/// True for a monitor round that found `available` servers and `unavailable` in quarantine.
pub fn is_round(event: &Event, available: usize, unavailable: usize) -> bool {
    matches!(event, Event::MonitorRound { available: a, unavailable: u, .. }
        if *a == available && u.len() == unavailable)
}

/// How a relayed connection ended, as its event tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The server it was relayed to (`host:port`).
    pub server: String,
    /// Bytes the client sent, relayed to the server.
    pub bytes_from_client: u64,
    /// Bytes the server sent, relayed to the client.
    pub bytes_to_client: u64,
    /// Which side ended it, or why the broker did.
    pub ended_by: End,
}

/// The end of `client`'s connection, when `event` is it.
pub fn ended_of(event: &Event, client: SocketAddr) -> Option<Ended> {
    match event {
        Event::ConnectionEnded {
            client: c,
            server,
            bytes_from_client,
            bytes_to_client,
            ended_by,
            ..
        } if *c == client => Some(Ended {
            server: server.clone(),
            bytes_from_client: *bytes_from_client,
            bytes_to_client: *bytes_to_client,
            ended_by: ended_by.clone(),
        }),
        _ => None,
    }
}
