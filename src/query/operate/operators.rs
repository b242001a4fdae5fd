//! What the page of actions needs of the process ([`Operators`]): who may sign in (the users
//! file, read again on reload), the credentials verified, the throttle, the secret the tokens
//! are signed with, the state file, and how a restart runs; one per broker.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use tokio::sync::Semaphore;
use tracing::{error, info, warn};

use super::throttle::SignInThrottle;
use super::users::{self, Users, UsersError};
use crate::balancer::{Balancer, RestartRefusal, Restarted, Server};
use crate::config::General;
use crate::tls::files::Passphrase;

/// `RESTART_COMMAND` for a server, asked by hand (`who`), within its cooldown: the alerts
/// machinery's, which runs `ctl restart`'s too; handed in by the broker, which starts it. Its
/// refusal is told in the page's words, not ctl's.
pub type Restarter = Arc<
    dyn Fn(
            Arc<Balancer>,
            Arc<Server>,
            String,
        ) -> Pin<Box<dyn Future<Output = Result<Restarted, RestartRefusal>> + Send>>
        + Send
        + Sync,
>;

/// Who may sign in, as the configuration says now.
#[derive(Debug)]
pub(super) enum Door {
    /// `ADMIN_USERS` unset: the page answers 404.
    Off,
    /// The file cannot be used (logged); the page answers 503, pointing to the log.
    Broken,
    /// Its users.
    Open(Arc<Users>),
}

/// What the page of actions needs of the process: who may sign in (read again on reload),
/// the credentials verified, the throttle, the secret the tokens are signed with, where
/// operations are kept, and how a restart runs. One per broker, handed to every balancer's
/// query interface.
pub struct Operators {
    pub(super) door: ArcSwap<Door>,
    pub(super) verified: users::KnownCredentials,
    /// Verifications running at once on the blocking pool.
    pub(super) turns: Semaphore,
    /// Sign-ins waiting at once, for a throttled turn or a verification's.
    pub(super) signing_in: Semaphore,
    /// Those kept for addresses users signed in from lately, and their verifications' turn.
    pub(super) kept_signing_in: Semaphore,
    pub(super) kept_turns: Semaphore,
    pub(super) throttle: SignInThrottle,
    /// The session secret in force (`SESSION_SECRET`, or the broker's own).
    pub(super) secret: ArcSwap<Passphrase>,
    /// `ADMIN_PLAIN_HTTP`.
    pub(super) plain: AtomicBool,
    /// The state file (`STATE_FILE`), written after every action as `ctl`'s.
    pub(super) state_file: Option<PathBuf>,
    pub(super) restarter: OnceLock<Restarter>,
}

impl std::fmt::Debug for Operators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operators")
            .field("door", &self.door)
            .finish_non_exhaustive()
    }
}

/// Checks the users file `general` names, as `--check` does: nothing named is fine.
pub fn check(general: &General) -> Result<(), UsersError> {
    general
        .admin_users
        .as_deref()
        .map_or(Ok(()), |path| Users::read(path).map(|_| ()))
}

/// Who may sign in as `general` says, logged (the warning of a plain network included).
fn door(general: &General) -> Door {
    let Some(path) = general.admin_users.as_deref() else {
        return Door::Off;
    };
    match Users::read(path) {
        Ok(users) => {
            info!(
                "ADMIN: the users of {} may act on servers from /TOTVS_BROKER_QUERY/ADMIN",
                path.display()
            );
            if general.admin_plain_http {
                warn!(
                    "ADMIN_PLAIN_HTTP is set: /TOTVS_BROKER_QUERY/ADMIN is offered over plain \
                     HTTP to any address QUERY_ALLOW admits, and passwords cross the network in \
                     the clear; give the balancer TLS instead"
                );
            }
            Door::Open(Arc::new(users))
        }
        Err(e) => {
            error!("{e}; /TOTVS_BROKER_QUERY/ADMIN answers 503 until it is fixed and reloaded");
            Door::Broken
        }
    }
}

impl Operators {
    /// The page of actions as `general` configures it, its tokens signed with `secret`, its
    /// actions kept in `state_file`.
    pub fn new(general: &General, secret: Passphrase, state_file: Option<PathBuf>) -> Operators {
        Operators {
            door: ArcSwap::from_pointee(door(general)),
            verified: users::KnownCredentials::new(),
            turns: Semaphore::new(users::VERIFYING_AT_ONCE),
            signing_in: Semaphore::new(users::SIGNING_IN_AT_ONCE),
            kept_signing_in: Semaphore::new(users::KEPT_SIGNING_IN_AT_ONCE),
            kept_turns: Semaphore::new(1),
            throttle: SignInThrottle::default(),
            secret: ArcSwap::from_pointee(secret),
            plain: AtomicBool::new(general.admin_plain_http),
            state_file,
            restarter: OnceLock::new(),
        }
    }

    /// A reload's `[General]`: the users file read again, every remembered credential
    /// forgotten, the secret in force now.
    pub fn configure(&self, general: &General, secret: Passphrase) {
        self.door.store(Arc::new(door(general)));
        self.verified.forget();
        self.plain.store(general.admin_plain_http, Relaxed);
        self.secret.store(Arc::new(secret));
    }

    /// How restarts run, once the broker has started its alerts.
    pub fn restart_with(&self, restarter: Restarter) {
        let _ = self.restarter.set(restarter);
    }
}
