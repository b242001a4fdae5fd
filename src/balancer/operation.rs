//! An operator's action on one server as one value ([`Operation`]), applied and kept: the one
//! code path of `appbroker ctl` (the control socket) and of the status page's actions (the
//! query interface's `ADMIN`). Both sit above the balancer and neither may import the other,
//! so what they share lives here: the action applied through the balancer's method for it
//! (which logs it with who asked and sends its alert), its words, and the state file written
//! after it ([`keep`]) so a restart keeps the change.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use super::Balancer;
use super::rules::health::OperatorAsk;
use super::rules::overrides::{Hold, MAX_WEIGHT, Mode};
use super::server::Server;
use crate::config::keys::DAY;
use crate::config::{connections_stay, duration_within, plural, show_duration};
use crate::support::clock::wall_ms;

/// An operator's action on one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// No new clients; its connections stay.
    Disable {
        /// Why, for logs and pages.
        reason: Option<String>,
    },
    /// As disable, named so while its connections end.
    Drain {
        /// Why, for logs and pages.
        reason: Option<String>,
    },
    /// Ends disable or drain.
    Enable,
    /// A weight for now (0 to [`MAX_WEIGHT`]); `None` gives the file's back.
    Weight(Option<u32>),
    /// Quarantine now, for `duration` (`QUARANTINE_TIME` without one).
    Quarantine {
        /// `30s`, `10m`, `500ms` or seconds.
        duration: Option<String>,
        /// Why, shown instead of the server's last error.
        reason: Option<String>,
    },
    /// Ends a quarantine now, whoever started it.
    Release,
    /// Closes the server's open connections now.
    Cut,
}

/// What an operation did, in words; the connections it concerns (`drain`'s left, `cut`'s
/// cut) where it has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operated {
    /// What was done (`[BALANCE_X] 10.0.0.1:1234 disabled; its 3 open connections stay`).
    pub message: String,
    /// Connections open (`drain`) or cut (`cut`).
    pub connections: Option<u64>,
}

impl Operated {
    fn said(message: String) -> Operated {
        Operated {
            message,
            connections: None,
        }
    }
}

impl Balancer {
    /// Applies `operation` to `server` on behalf of `by` (`uid 1000`, `web:ana@10.0.0.5`):
    /// what it did, or why it was refused (a weight out of range, a bad duration). The
    /// caller keeps the change ([`keep`]).
    pub fn operate(
        &self,
        server: &Server,
        operation: Operation,
        by: &str,
    ) -> Result<Operated, String> {
        let name = format!("{} {}", self.kind(), server.address);
        let hold = |mode, reason: Option<String>| Hold {
            mode,
            reason: reason.unwrap_or_default(),
            by: by.to_string(),
            since_wall_ms: wall_ms(),
        };
        let open = || connections_stay(server.active() as usize);
        Ok(match operation {
            Operation::Disable { reason } => {
                self.hold(server, hold(Mode::Disabled, reason));
                Operated::said(format!("{name} disabled; {}", open()))
            }
            Operation::Drain { reason } => {
                self.hold(server, hold(Mode::Drain, reason));
                Operated {
                    connections: Some(server.active()),
                    ..Operated::said(format!("{name} draining; {}", open()))
                }
            }
            Operation::Enable => Operated::said(match self.enable(server, by) {
                true => format!("{name} enabled"),
                false => format!("{name} was not disabled"),
            }),
            Operation::Weight(Some(w)) if w > MAX_WEIGHT => {
                return Err(format!(
                    "weight {w} is out of range; expected 0 to {MAX_WEIGHT}"
                ));
            }
            Operation::Weight(weight) => {
                let now = self.set_weight(server, weight, by);
                Operated::said(format!("{name} weight {now}"))
            }
            Operation::Quarantine { duration, reason } => {
                let asked = OperatorAsk {
                    by: by.to_string(),
                    reason: reason.unwrap_or_default(),
                };
                let duration = self.quarantine_duration(duration.as_deref())?;
                self.force_quarantine(server, duration, asked);
                Operated::said(format!(
                    "{name} in quarantine for {} (until released)",
                    show_duration(duration)
                ))
            }
            Operation::Release => Operated::said(match self.release_by_operator(server, by) {
                true => format!("{name} released from quarantine"),
                false => format!("{name} was not in quarantine"),
            }),
            Operation::Cut => {
                let cut = self.cut(server, by);
                Operated {
                    connections: Some(cut),
                    ..Operated::said(format!(
                        "{name}: {} cut",
                        plural(cut as usize, "connection")
                    ))
                }
            }
        })
    }

    /// An operator's quarantine's duration: `text` read, or `QUARANTINE_TIME`.
    fn quarantine_duration(&self, text: Option<&str>) -> Result<Duration, String> {
        match text {
            None => Ok(self.generation().config.quarantine_time),
            Some(text) => duration_within(text, Duration::from_millis(1), DAY)
                .map_err(|e| format!("duration `{text}` {e}")),
        }
    }
}

/// Writes the state file `path` (none: `STATE_FILE=0`) after an operation on one of
/// `balancers`; a failure is logged (the change holds until a restart).
pub fn keep(path: Option<&Path>, balancers: &[Arc<Balancer>]) {
    let Some(path) = path else {
        return;
    };
    if let Err(e) = super::state_file::save(path, balancers) {
        warn!(
            "cannot write the state file {}: {}; the change holds until appbroker restarts",
            path.display(),
            crate::support::os_error::words(&e)
        );
    }
}
