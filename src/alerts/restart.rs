//! `RESTART_COMMAND`: an AppServer that has stayed in a health quarantine (a failed check, a
//! client's failed connect, timed-out requests; never an operator's) for `RESTART_AFTER` is
//! restarted by a command of the operator's, within bounds: once per `RESTART_COOLDOWN` per
//! AppServer (its host and id, in whichever balancers list it), `RESTART_MAX_PARALLEL` at
//! once per balancer, killed after `RESTART_TIMEOUT`, none while every server of the balancer
//! is in quarantine (a network fault is no AppServer's), and with `RESTART_ONLY_WITH_ADDRESS`
//! only while that address is on this host. `ctl restart` runs it by hand, within the same
//! bounds (the cooldown too, unless forced).
//!
//! The task wakes when a quarantine starts or ends (the alerts' dispatcher says so), at the
//! next deadline it computed, when a restart ends, and every minute regardless.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::address;
use super::command;
use crate::balancer::alert_queue::{Alert, RestartOutcome};
use crate::balancer::shared::Shared;
use crate::balancer::{Balancer, RestartRefusal, Restarted, Server};
use crate::config::{AlertEvent, BalancerKind, RestartSettings, command_text, show_duration};
use crate::support::clock::wall_ms;

/// How often a restart held back by something nothing announces (the address not here) is
/// looked at again.
const RECHECK: Duration = Duration::from_secs(5);

/// The longest sleep between two looks, whatever was announced.
const ANYWAY: Duration = Duration::from_secs(60);

/// An AppServer across balancers: a TCP and an HTTP balancer usually list the same ones, on
/// other ports, under the same id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AppServer {
    host: String,
    id: String,
}

impl AppServer {
    fn of(server: &Server) -> AppServer {
        AppServer {
            host: server.host.to_string().to_ascii_lowercase(),
            id: server.id.to_string(),
        }
    }
}

/// What the restarts remember.
#[derive(Debug, Default)]
struct Book {
    /// When each AppServer's last restart started.
    last: HashMap<AppServer, Instant>,
    /// The AppServers being restarted now.
    running: HashSet<AppServer>,
    /// Restarts running now, per balancer.
    per_balancer: HashMap<BalancerKind, u32>,
    /// What holds a balancer's restarts back, told once until it no longer does.
    told: HashSet<(BalancerKind, &'static str)>,
}

/// The restarts of one broker.
#[derive(Debug)]
pub struct Restarts {
    shared: Arc<Shared>,
    book: Mutex<Book>,
    wake: Notify,
}

impl Restarts {
    /// The restarts of the balancers `shared` holds.
    pub fn new(shared: Arc<Shared>) -> Restarts {
        Restarts {
            shared,
            book: Mutex::default(),
            wake: Notify::new(),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Something changed that may start or allow a restart: look again now.
    pub fn look_again(&self) {
        self.wake.notify_one();
    }

    /// Looks for servers to restart until `stop` is cancelled.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let next = self.scan();
            let wake = next.map_or(Instant::now() + ANYWAY, |at| {
                at.min(Instant::now() + ANYWAY)
            });
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Starts the restarts due now; the next instant one may be due.
    fn scan(self: &Arc<Self>) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut sooner = |at: Instant| next = Some(next.map_or(at, |n: Instant| n.min(at)));
        for balancer in self.shared.balancers.load().iter() {
            let generation = balancer.generation();
            let settings = &generation.config.restarts;
            if settings.command.is_none() {
                continue;
            }
            let now_wall = wall_ms();
            let after = settings.after.as_millis() as u64;
            let mut due = Vec::new();
            for server in &generation.servers {
                let Some(since) = server.health_quarantine_since() else {
                    continue;
                };
                match (since + after).checked_sub(now_wall) {
                    Some(left) if left > 0 => {
                        sooner(Instant::now() + Duration::from_millis(left));
                    }
                    _ => due.push((std::sync::Arc::clone(server), now_wall - since)),
                }
            }
            if due.is_empty() || !self.may_restart_now(balancer, settings, &mut sooner) {
                continue;
            }
            for (server, lasted) in due {
                let why = format!(
                    "in quarantine ({}) for {}",
                    server.quarantine_reason().map_or("", |r| r.as_str()),
                    show_duration(Duration::from_millis(lasted / 1000 * 1000))
                );
                match self.claim(balancer, &server, false) {
                    Ok(()) => {
                        let restarts = Arc::clone(self);
                        let balancer = Arc::clone(balancer);
                        tokio::spawn(async move {
                            restarts.run_one(&balancer, &server, why, None).await
                        });
                    }
                    Err(RestartRefusal::CoolingDown { until, .. }) => sooner(until),
                    Err(_) => {}
                }
            }
        }
        next
    }

    /// The balancer's restarts may run now: some server of it is out of quarantine, and the
    /// address asked for is on this host. What holds them back is logged once.
    fn may_restart_now(
        &self,
        balancer: &Balancer,
        settings: &RestartSettings,
        sooner: &mut impl FnMut(Instant),
    ) -> bool {
        let kind = balancer.kind();
        let now = balancer.clock_ms();
        let all_down = balancer
            .generation()
            .servers
            .iter()
            .all(|s| !s.is_available(now));
        let told = |book: &mut Book, what, holds: bool| {
            if holds {
                book.told.insert((kind, what))
            } else {
                book.told.remove(&(kind, what));
                false
            }
        };
        let skipped = || {
            balancer
                .events()
                .figures()
                .restart(kind, RestartOutcome::Skipped)
        };
        if told(&mut self.book(), "all down", all_down) {
            skipped();
            warn!(
                "{kind}: no restart while every server is in quarantine: a network fault, not \
                 an AppServer's, is likely"
            );
        }
        if all_down {
            return false;
        }
        let absent = address_absent(settings);
        if told(&mut self.book(), "address", absent.is_some())
            && let Some(why) = &absent
        {
            skipped();
            info!("{kind}: no restart: {why}");
        }
        if absent.is_some() {
            sooner(Instant::now() + RECHECK);
            return false;
        }
        true
    }

    /// Takes a place for a restart of `server` (of `balancer`) within the bounds; `force`
    /// leaves the cooldown out.
    fn claim(
        &self,
        balancer: &Balancer,
        server: &Server,
        force: bool,
    ) -> Result<(), RestartRefusal> {
        let settings = balancer.generation().config.restarts.clone();
        if settings.command.is_none() {
            return Err(RestartRefusal::NoCommand);
        }
        let key = AppServer::of(server);
        let kind = balancer.kind();
        let mut book = self.book();
        if book.running.contains(&key) {
            return Err(RestartRefusal::Running);
        }
        if !force
            && let Some(last) = book.last.get(&key)
            && last.elapsed() < settings.cooldown
        {
            return Err(RestartRefusal::CoolingDown {
                until: *last + settings.cooldown,
                cooldown: settings.cooldown,
            });
        }
        let running = book.per_balancer.get(&kind).copied().unwrap_or(0);
        if running >= settings.max_parallel {
            return Err(RestartRefusal::Busy(running));
        }
        book.per_balancer.insert(kind, running + 1);
        book.running.insert(key.clone());
        // Servers a reload removed leave their last restart behind: past the longest
        // cooldown, none matters.
        book.last
            .retain(|_, at| at.elapsed() < crate::config::keys::DAY);
        book.last.insert(key, Instant::now());
        Ok(())
    }

    /// `ctl restart` and the page's: runs `RESTART_COMMAND` for `server` of `balancer` now,
    /// asked by `by`, within the bounds (the cooldown left out when `force`); what it came
    /// to, or why not (each says it in its own words).
    pub async fn by_hand(
        self: &Arc<Self>,
        balancer: &Arc<Balancer>,
        server: &Arc<Server>,
        force: bool,
        by: &str,
    ) -> Result<Restarted, RestartRefusal> {
        let settings = balancer.generation().config.restarts.clone();
        let skipped = |refusal: RestartRefusal| {
            let kind = balancer.kind();
            balancer
                .events()
                .figures()
                .restart(kind, RestartOutcome::Skipped);
            refusal
        };
        if settings.command.is_some()
            && let Some(why) = address_absent(&settings)
        {
            return Err(skipped(RestartRefusal::AddressAbsent(why)));
        }
        self.claim(balancer, server, force).map_err(skipped)?;
        let forced = if force { " (--force)" } else { "" };
        Ok(self
            .run_one(balancer, server, format!("asked by {by}{forced}"), Some(by))
            .await)
    }

    /// Runs the command for `server` (its place claimed), records and tells what it came to;
    /// the alert names `by`, the operator who asked (`ctl`'s uid, the page's `web:` user).
    async fn run_one(
        &self,
        balancer: &Arc<Balancer>,
        server: &Arc<Server>,
        why: String,
        by: Option<&str>,
    ) -> Restarted {
        let generation = balancer.generation();
        let settings = &generation.config.restarts;
        let kind = balancer.kind();
        let command = settings
            .command
            .as_ref()
            .map(command_text)
            .unwrap_or_default();
        info!(
            "{kind}: restarting server {} ({}) with RESTART_COMMAND: {why}",
            server.address, server.id
        );
        let started = wall_ms();
        let env = environment(kind, server, &why);
        let ran = command::run(&command, None, &env, settings.timeout).await;
        let took = if ran.timed_out {
            String::new()
        } else {
            let ms = wall_ms().saturating_sub(started);
            format!(" in {}", show_duration(Duration::from_millis(ms)))
        };
        let lines = if ran.output.is_empty() {
            String::new()
        } else {
            format!("; its last lines: {}", ran.output)
        };
        let (address, id, outcome) = (&server.address, server.id, &ran.outcome);
        if ran.succeeded() {
            info!("{kind}: restart of server {address} ({id}): {outcome}{took}{lines}");
        } else {
            warn!("{kind}: restart of server {address} ({id}) failed: {outcome}{took}{lines}");
        }
        let record = Restarted {
            at_wall_ms: started,
            exit: ran.exit,
            outcome: ran.outcome.clone(),
            output: ran.output.clone(),
            why,
        };
        self.record(server, &record);
        let outcome = if ran.succeeded() {
            RestartOutcome::Ok
        } else if ran.timed_out {
            RestartOutcome::Timeout
        } else {
            RestartOutcome::Failed
        };
        balancer.events().figures().restart(kind, outcome);
        balancer.events().alert(|| Alert {
            exit: ran.exit,
            output: (!ran.output.is_empty()).then(|| ran.output.clone()),
            who: by.map(str::to_string),
            ..Alert::new(AlertEvent::RestartRan)
                .on(kind)
                .about(server.alert_server())
                .because(ran.outcome.clone())
        });
        {
            let mut book = self.book();
            book.running.remove(&AppServer::of(server));
            if let Some(n) = book.per_balancer.get_mut(&kind) {
                *n = n.saturating_sub(1);
            }
        }
        self.look_again();
        record
    }

    /// Shows `record` beside the AppServer in every balancer that lists it.
    fn record(&self, server: &Server, record: &Restarted) {
        let key = AppServer::of(server);
        for balancer in self.shared.balancers.load().iter() {
            for listed in balancer.generation().servers.iter() {
                if AppServer::of(listed) == key {
                    balancer.restarted(listed, record.clone());
                }
            }
        }
    }
}

/// Why `RESTART_ONLY_WITH_ADDRESS` holds restarts back now; `None` when it does not.
fn address_absent(settings: &RestartSettings) -> Option<String> {
    let address = settings.only_with_address?;
    match address::is_on_this_host(address) {
        Ok(true) => None,
        Ok(false) => Some(format!(
            "{address} (RESTART_ONLY_WITH_ADDRESS) is not on this host: the broker that holds it \
             restarts"
        )),
        Err(why) => Some(format!(
            "{why}; RESTART_ONLY_WITH_ADDRESS cannot be checked"
        )),
    }
}

/// The variables of `RESTART_COMMAND`: the server's, the balancer's, and why it runs.
fn environment(kind: BalancerKind, server: &Server, why: &str) -> Vec<(String, String)> {
    let s = server.alert_server();
    [
        ("APPBROKER_EVENT", "restart".to_string()),
        ("APPBROKER_BALANCER", kind.section().to_string()),
        ("APPBROKER_SERVER", s.address),
        ("APPBROKER_SERVER_ID", s.id),
        ("APPBROKER_SERVER_HOST", s.host),
        ("APPBROKER_SERVER_PORT", s.port.to_string()),
        ("APPBROKER_REASON", why.to_string()),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect()
}
