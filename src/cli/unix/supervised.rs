//! The broker's side when a supervisor runs it (`--supervise`): the listeners it hands down,
//! the heartbeats its watchdog waits for, READY, and SIGHUP passed through it, since it holds
//! every port the file names.

use std::net::TcpListener;

use appbroker::admin::Admin;
use appbroker::broker::Control;
use appbroker::config::Config;
use appbroker::net::workers::WorkerThreads;
use appbroker::supervisor::{self, Link, Supervised};
use appbroker::support::shutdown::Shutdown;
use tracing::info;

/// The broker a supervisor started this one to replace on its ports (an upgrade, or a reload
/// that moved them), when it did.
pub fn takes_over() -> Option<u32> {
    std::env::var(supervisor::TAKES_OVER_ENV).ok()?.parse().ok()
}

/// The listeners a supervisor handed down, one set per balancer; `None` when there is none.
pub fn inherited(config: &Config) -> anyhow::Result<Option<Vec<Vec<TcpListener>>>> {
    Ok(supervisor::inherited_listeners(config)?)
}

/// The broker's link to its supervisor, when one runs it: each step of the start that tells
/// it something does nothing without one.
pub struct Supervision(Option<Link>);

impl Supervision {
    /// The link the supervisor handed down, if any. Inside the runtime.
    pub fn take() -> Supervision {
        Supervision(Link::take())
    }

    /// Heartbeats from each worker thread of `threads`, from now on: before READY, so that
    /// the supervisor's watchdog knows this broker lives from then.
    pub async fn send_heartbeats(&self, threads: &WorkerThreads) {
        if let Some(supervisor) = &self.0 {
            let workers = threads.workers();
            let ticks = workers.ticks(supervisor::HEARTBEAT);
            supervisor
                .send_heartbeats(workers.handles().len(), ticks)
                .await;
        }
    }

    /// `admin`, with `ctl reload` passing through the supervisor.
    pub fn admin(&self, admin: Admin) -> Admin {
        admin.supervised_by(self.0.clone())
    }

    /// Tells the supervisor this broker serves; its end then asks for `shutdown`.
    pub async fn ready(&self, shutdown: &Shutdown) {
        if let Some(supervisor) = &self.0 {
            supervisor.ready(shutdown).await;
        }
    }

    /// What a SIGHUP does: under a supervisor, which holds every port the file names, a
    /// SIGHUP sent to the broker itself goes through it as `ctl reload` does; else `control`
    /// reloads the file.
    pub fn on_sighup(&self, control: Control) -> impl Fn() + Send + 'static {
        let supervisor = self.0.clone();
        move || match supervisor.clone() {
            Some(supervisor) => {
                let control = control.clone();
                tokio::spawn(async move {
                    match supervisor.reload().await {
                        Some(Supervised::Replaced(line)) => info!("received SIGHUP: {line}"),
                        Some(Supervised::Refused(why)) => {
                            tracing::error!("received SIGHUP: reload refused: {why}")
                        }
                        Some(Supervised::InPlace) | None => control.reload_file_later(),
                    }
                });
            }
            None => control.reload_file_later(),
        }
    }
}
