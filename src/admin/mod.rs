//! Runtime administration: what `appbroker ctl` asks of a running broker over its control
//! socket, and the answers. Each request that changes something is an operation
//! ([`Operation`]) the balancer applies (logged once, with who asked), then the state file is
//! written so a restart keeps the change: the one code path the status page's actions take
//! too (`query::operate`), through a local socket whose permissions say who may use it.
//!
//! - [`protocol`]: the JSON lines spoken on the socket.
//! - [`paths`]: where the socket and the state file live.
//! - [`session_secret`]: the secret of the HTTP session cookies, kept beside the state file
//!   ([`crate::balancer::state_file`]).
//! - `socket` (Unix): the control socket itself.
//! - [`control_client`]: the control socket's client, for `appbroker ctl`, `ping` and
//!   `upgrade`: ask, print the answer, say by the exit code how it went.

pub mod control_client;
pub mod paths;
pub mod protocol;
pub mod session_secret;
#[cfg(unix)]
pub mod socket;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::balancer::operation::{self, Operation};
use crate::balancer::{Balancer, BalancerState, Server, ServerState, Standing};
use crate::broker::{Control, ReloadError};
use crate::config::keys::DAY;
use crate::config::{duration_within, plural, show_duration};
use protocol::{
    Answer, BalancerView, QuarantineView, Request, RestartView, ServerView, names_section,
};

/// How long `drain --wait` waits by default: long enough for most sessions to end on their
/// own after a notice to users, short enough that a forgotten script does not hang all day.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(600);

/// How long `ctl restart` waits for its answer past the usual time: the longest
/// `RESTART_TIMEOUT`, after which the broker has killed the command and answers.
pub const RESTART_WAIT: Duration = Duration::from_secs(1800);

/// How often a `wait` looks at the server's connections. Short, so the answer comes as the
/// last connection ends; one atomic read per look.
const WAIT_POLL: Duration = Duration::from_millis(20);

/// What answers the control socket's requests for one running broker.
#[derive(Debug)]
pub struct Admin {
    control: Control,
    /// Where changes are kept; `None` when `STATE_FILE=0`.
    state_file: Option<PathBuf>,
    /// The supervisor, when the broker runs under one: a reload goes through it, so that it
    /// holds every port the file names.
    #[cfg(unix)]
    supervisor: Option<crate::supervisor::Link>,
}

impl Admin {
    /// Administration of the broker `control` drives, keeping changes in `state_file`.
    pub fn new(control: Control, state_file: Option<PathBuf>) -> Admin {
        Admin {
            control,
            state_file,
            #[cfg(unix)]
            supervisor: None,
        }
    }

    /// The same, for a broker run by a supervisor (`--supervise`).
    #[cfg(unix)]
    pub fn supervised_by(self, supervisor: Option<crate::supervisor::Link>) -> Admin {
        Admin { supervisor, ..self }
    }

    /// Carries out `request` on behalf of `by` (`uid 1000`), and answers.
    pub async fn answer(&self, request: Request, by: &str) -> Answer {
        // `ctl` refuses these itself; a client of its own must be refused too.
        if let Request::Disable {
            reason: Some(reason),
            ..
        }
        | Request::Drain {
            reason: Some(reason),
            ..
        }
        | Request::Quarantine {
            reason: Some(reason),
            ..
        } = &request
            && let Some(problem) = crate::balancer::rules::overrides::reason_problem(reason)
        {
            return Answer::refused(problem);
        }
        if let Some((section, server)) = request.target() {
            let (balancer, server) = match self.find(section, server) {
                Ok(found) => found,
                Err(error) => return Answer::refused(error),
            };
            if let Request::Restart { force, .. } = request {
                return self.restart(&balancer, &server, force, by).await;
            }
            let answer = self.on_server(request, &balancer, &server, by).await;
            if answer.ok {
                self.save();
            }
            return answer;
        }
        match request {
            Request::Show { section } => self.show(section.as_deref()),
            Request::Reload => self.reload().await,
            Request::Ping if self.control.is_stopping() => {
                Answer::refused("the broker is shutting down")
            }
            Request::Ping => Answer::done("alive"),
            _ => Answer::refused("this request needs a section and a server"),
        }
    }

    /// The balancer `section` names and its server `name` names, or why not, in words.
    fn find(&self, section: &str, name: &str) -> Result<(Arc<Balancer>, Arc<Server>), String> {
        let balancers = self.control.balancers();
        let Some(balancer) = balancers
            .iter()
            .find(|b| names_section(section, b.kind().section()))
        else {
            return Err(no_balancer(section, &balancers));
        };
        let Some(server) = balancer.find_server(name) else {
            let known: Vec<String> = balancer
                .generation()
                .servers
                .iter()
                .map(|s| format!("{} ({})", s.id, s.address))
                .collect();
            return Err(format!(
                "{} has no server {name}; name one by id or host:port: {}",
                balancer.kind(),
                known.join(", ")
            ));
        };
        Ok((Arc::clone(balancer), server))
    }

    /// A request about one server: a `wait`, or an operation ([`Operation`]), applied as the
    /// status page's are.
    async fn on_server(
        &self,
        request: Request,
        balancer: &Balancer,
        server: &Server,
        by: &str,
    ) -> Answer {
        let operation = match request {
            Request::Disable { reason, .. } => Operation::Disable { reason },
            Request::Drain { reason, .. } => Operation::Drain { reason },
            Request::Enable { .. } => Operation::Enable,
            Request::Weight { weight, .. } => Operation::Weight(weight),
            Request::Quarantine {
                duration, reason, ..
            } => Operation::Quarantine { duration, reason },
            Request::Release { .. } => Operation::Release,
            Request::Cut { .. } => Operation::Cut,
            Request::Wait { timeout, .. } => {
                let name = format!("{} {}", balancer.kind(), server.address);
                return self.wait(server, &name, timeout.as_deref()).await;
            }
            Request::Restart { .. } | Request::Show { .. } | Request::Reload | Request::Ping => {
                return Answer::refused("this request names no server");
            }
        };
        match balancer.operate(server, operation, by) {
            Ok(done) => Answer {
                connections: done.connections,
                ..Answer::done(done.message)
            },
            Err(why) => Answer::refused(why),
        }
    }

    /// `RESTART_COMMAND` for `server` now, answered when it ends: done when it exited 0.
    async fn restart(
        &self,
        balancer: &Arc<Balancer>,
        server: &Arc<Server>,
        force: bool,
        by: &str,
    ) -> Answer {
        let name = format!("{} {} ({})", balancer.kind(), server.address, server.id);
        match self.control.restart(balancer, server, force, by).await {
            Err(why) => Answer::refused(format!("{name} not restarted: {why}")),
            Ok(run) => {
                let lines = if run.output.is_empty() {
                    String::new()
                } else {
                    format!("; its last lines: {}", run.output)
                };
                let words = format!("{name}: RESTART_COMMAND ran: {}{lines}", run.outcome);
                if run.exit == Some(0) {
                    Answer::done(words)
                } else {
                    Answer::refused(words)
                }
            }
        }
    }

    /// Answers once `server` has no connection left, or when the timeout is over.
    async fn wait(&self, server: &Server, name: &str, timeout: Option<&str>) -> Answer {
        let timeout = match timeout {
            None => DEFAULT_WAIT,
            Some(text) => match duration_within(text, Duration::ZERO, DAY) {
                Ok(d) => d,
                Err(e) => return Answer::refused(format!("timeout `{text}` {e}")),
            },
        };
        let end = Instant::now() + timeout;
        loop {
            let left = server.active();
            if left == 0 {
                return Answer {
                    connections: Some(0),
                    ..Answer::done(format!("{name} has no connection left"))
                };
            }
            if Instant::now() >= end {
                return Answer {
                    connections: Some(left),
                    ..Answer::refused(format!(
                        "{name} still has {} after {}",
                        plural(left as usize, "connection"),
                        show_duration(timeout)
                    ))
                };
            }
            tokio::time::sleep(WAIT_POLL.min(end - Instant::now())).await;
        }
    }

    /// Every balancer, or `section`'s, as `show` gives them.
    fn show(&self, section: Option<&str>) -> Answer {
        let running = self.control.balancers();
        let balancers: Vec<BalancerView> = running
            .iter()
            .filter(|b| section.is_none_or(|s| names_section(s, b.kind().section())))
            .map(|b| view(&b.state()))
            .collect();
        if let (Some(section), true) = (section, balancers.is_empty()) {
            return Answer::refused(no_balancer(section, &running));
        }
        Answer {
            ok: true,
            balancers,
            ..Answer::default()
        }
    }

    /// The configuration file read again and applied, as SIGHUP does. Under a supervisor,
    /// which must hold every port the file names, it is asked first: when the ports are the
    /// ones it holds the broker reloads in place, else the supervisor binds the new ones and
    /// a new broker on them replaces this one (what a SIGHUP to the supervisor does).
    async fn reload(&self) -> Answer {
        #[cfg(unix)]
        if let Some(supervisor) = &self.supervisor {
            use crate::supervisor::Supervised;
            match supervisor.reload().await {
                Some(Supervised::Replaced(line)) => return Answer::done(line),
                Some(Supervised::Refused(why)) => return Answer::refused(why),
                Some(Supervised::InPlace) | None => {}
            }
        }
        let answer = match self.control.reload_file().await {
            Ok(reloaded) if reloaded.errors.is_empty() => Answer {
                changes: reloaded.changes,
                ..Answer::done("configuration reloaded")
            },
            Ok(reloaded) => Answer {
                changes: reloaded.changes,
                errors: reloaded.errors,
                ..Answer::refused("configuration reloaded in part")
            },
            Err(ReloadError::Stopped) => Answer::refused("the broker is stopping"),
            Err(ReloadError::Refused(why)) => Answer::refused(format!("reload rejected: {why}")),
            Err(e) => Answer {
                errors: e.lines(),
                ..Answer::refused("reload rejected: the running configuration stays")
            },
        };
        // Servers a reload removed take their overrides with them.
        self.save();
        answer
    }

    /// Writes the state file (as every operation does: [`operation::keep`]).
    fn save(&self) {
        operation::keep(self.state_file.as_deref(), &self.control.balancers());
    }
}

/// Why `section` names no balancer, with the ones that run.
fn no_balancer(section: &str, running: &[Arc<Balancer>]) -> String {
    let known: Vec<&str> = running.iter().map(|b| b.kind().section()).collect();
    format!(
        "no balancer {section} is running; the balancers are {} (BALANCE_ may be left out)",
        known.join(", ")
    )
}

/// A balancer as `show` gives it.
fn view(state: &BalancerState) -> BalancerView {
    BalancerView {
        section: state.kind.section().to_string(),
        listen: state.listen.to_string(),
        connections: state.active,
        servers: state.servers.iter().map(server_view).collect(),
    }
}

/// A server as `show` gives it.
fn server_view(s: &ServerState) -> ServerView {
    let state = match s.state {
        Standing::Available => "available",
        Standing::Quarantined => "quarantined",
        Standing::Draining => "draining",
        Standing::Disabled => match &s.overrides.hold {
            Some(h) => h.mode.as_str(),
            None => "disabled",
        },
    };
    ServerView {
        id: s.id.clone(),
        address: s.address.clone(),
        state: state.to_string(),
        connections: s.active,
        sessions: s.sessions,
        weight: s.weight,
        file_weight: s.file_weight,
        overrides: s.overrides.clone(),
        quarantine: s.quarantine.map(|(since, until)| QuarantineView {
            since_epoch_ms: since,
            until_epoch_ms: until,
            reason: s.reason.map_or("", |r| r.as_str()).to_string(),
            forced: s.forced,
            asked: s.asked.clone(),
        }),
        restarted: s.restarted.as_ref().map(|r| RestartView {
            at_epoch_ms: r.at_wall_ms,
            exit: r.exit,
            outcome: r.outcome.clone(),
            output: r.output.clone(),
            why: r.why.clone(),
        }),
    }
}
