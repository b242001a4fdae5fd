//! `/TOTVS_BROKER_QUERY/ADMIN`: operating the balancer from the browser, signed in. Off unless
//! `ADMIN_USERS` names an htpasswd file (404). A request is checked in this order, each
//! refusal changing nothing: the transport (TLS, or plain HTTP from a loopback peer unless
//! `ADMIN_PLAIN_HTTP`: 403), the credentials (HTTP Basic; none is the browser's challenge,
//! a wrong one its 401 again, both with `WWW-Authenticate`; failures throttled per
//! address), then for an action the anti-forgery token and the request's origin (403), its
//! fields (400), and what the state allows (409). `QUERY_ALLOW` and the query place were
//! checked before any of it (`super::route`).
//!
//! A `GET` is the page of actions (the status of each server with a row of actions), or,
//! naming an action and a server, its confirmation: what will happen and a button. The
//! button's `POST` acts at once, through the same code path as `appbroker ctl`
//! ([`Balancer::operate`], the state file written, the alert sent with `who` =
//! `web:<user>@<address>`), and answers 303 back to the page, which shows the result.
//!
//! - `users`: the users file, Basic credentials, bcrypt on the blocking pool, the cache.
//! - `throttle`: failed sign-ins slowed per address.
//! - `token`: the anti-forgery token.
//! - `form`: the action's form, and the origin it came from.

mod form;
mod throttle;
mod token;
mod users;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use tokio::sync::Semaphore;
use tracing::{error, info, warn};

use super::commands::Query;
use super::page;
use super::reply::{closing, html, text};
use crate::balancer::operation::{self, Operation};
use crate::balancer::{Admission, Balancer, Restarted, Server};
use crate::config::General;
use crate::http::LocalAnswer;
use crate::process::clock::wall_ms;
use crate::tls::files::Passphrase;
use form::{Action, Form};
use throttle::{Throttle, Turn};
pub use users::{Users, UsersError};

/// The path of the page, as its links and redirects write it.
pub(super) const PATH: &str = "/TOTVS_BROKER_QUERY/ADMIN";

/// The protection space the browser is asked to sign in to.
const REALM: &str = "Basic realm=\"appbroker ADMIN\", charset=\"UTF-8\"";

/// `RESTART_COMMAND` for a server, asked by hand (`who`), within its cooldown: the alerts
/// machinery's, which runs `ctl restart`'s too; handed in by the broker, which starts it.
pub type Restarter = Arc<
    dyn Fn(
            Arc<Balancer>,
            Arc<Server>,
            String,
        ) -> Pin<Box<dyn Future<Output = Result<Restarted, String>> + Send>>
        + Send
        + Sync,
>;

/// Who may sign in, as the configuration says now.
#[derive(Debug)]
enum Door {
    /// `ADMIN_USERS` unset: the page answers 404.
    Off,
    /// The file cannot be used (logged); the page answers 503 saying why.
    Broken(UsersError),
    /// Its users.
    Open(Arc<Users>),
}

/// What the page of actions needs of the process: who may sign in (read again on reload),
/// the credentials verified, the throttle, the secret the tokens are signed with, where
/// operations are kept, and how a restart runs. One per broker, handed to every balancer's
/// query interface.
pub struct Operators {
    door: ArcSwap<Door>,
    verified: users::Verified,
    /// Verifications running at once on the blocking pool.
    turns: Semaphore,
    throttle: Throttle,
    /// The session secret in force (`SESSION_SECRET`, or the broker's own).
    secret: ArcSwap<Passphrase>,
    /// `ADMIN_PLAIN_HTTP`.
    plain: AtomicBool,
    /// The state file (`STATE_FILE`), written after every action as `ctl`'s.
    state_file: Option<PathBuf>,
    restarter: OnceLock<Restarter>,
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
            Door::Broken(e)
        }
    }
}

impl Operators {
    /// The page of actions as `general` configures it, its tokens signed with `secret`, its
    /// actions kept in `state_file`.
    pub fn new(general: &General, secret: Passphrase, state_file: Option<PathBuf>) -> Operators {
        Operators {
            door: ArcSwap::from_pointee(door(general)),
            verified: users::Verified::new(),
            turns: Semaphore::new(users::VERIFYING_AT_ONCE),
            throttle: Throttle::default(),
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

/// The 401 that asks the browser to sign in.
fn challenge() -> LocalAnswer {
    text(
        401,
        "401 Unauthorized: sign in with a user of ADMIN_USERS\n",
    )
    .with("WWW-Authenticate", REALM)
}

/// Why the transport is refused, or `None`: TLS always does; plain HTTP only from a loopback
/// peer (the socket's, not an address a proxy forwarded) unless `plain`.
fn transport_refusal(q: &Query<'_>, plain: bool) -> Option<&'static str> {
    let socket_peer = q.request.via.unwrap_or(q.peer.ip());
    let loopback = match socket_peer {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    };
    (!q.request.tls && !loopback && !plain).then_some(
        "403 Forbidden: /TOTVS_BROKER_QUERY/ADMIN is offered over TLS only (or over plain HTTP \
         from this host); sign in through the balancer's TLS port\n",
    )
}

/// The ADMIN command's answer.
pub(super) async fn answer(q: &Query<'_>, admission: &mut Admission) -> LocalAnswer {
    let operators = q.operators;
    let users = match &**operators.door.load() {
        Door::Off => {
            return text(
                404,
                "404 Not Found: acting from the browser is off (ADMIN_USERS is not set in [General])\n",
            );
        }
        Door::Broken(e) => return text(503, format!("503 Service Unavailable: {e}\n")),
        Door::Open(users) => Arc::clone(users),
    };
    if let Some(refusal) = transport_refusal(q, operators.plain.load(Relaxed)) {
        return closing(403, refusal);
    }
    let Some(header) = q.request.value("authorization") else {
        return challenge();
    };
    let user = match operators.verified.user(header) {
        Some(user) => user,
        None => match sign_in(operators, &users, header, q.peer, admission).await {
            Some(user) => user,
            None => return challenge(),
        },
    };
    let signed = Signed {
        who: format!("web:{user}@{}", q.peer.ip()),
        user,
    };
    if q.request.method() == b"POST" {
        act(q, &signed).await
    } else {
        show(q, &signed)
    }
}

/// Checks `header` with the throttle of `peer`'s address: its turn waited (the connection's
/// place given back first, so a throttled attempt holds no query or client place), then
/// bcrypt. The user when it is good.
async fn sign_in(
    operators: &Operators,
    users: &Arc<Users>,
    header: &[u8],
    peer: SocketAddr,
    admission: &mut Admission,
) -> Option<String> {
    match operators.throttle.turn(peer.ip()) {
        Turn::Refused => return None,
        Turn::After(wait) if !wait.is_zero() => {
            *admission = Admission::Unknown;
            tokio::time::sleep(wait).await;
        }
        Turn::After(_) => {}
    }
    let user = users::check(users, &operators.verified, &operators.turns, header).await;
    if user.is_some() {
        operators.throttle.succeeded(peer.ip());
    }
    user
}

/// A signed-in user: their name, and who they are in logs and alerts.
struct Signed {
    user: String,
    /// `web:<user>@<address>`.
    who: String,
}

/// `GET`: the page of actions, or the confirmation of the action the query names.
fn show(q: &Query<'_>, signed: &Signed) -> LocalAnswer {
    let operators = q.operators;
    let token = token::issue(&operators.secret.load(), &signed.user, wall_ms() / 1000);
    let snapshot = q.snapshot();
    let query = q.request.query().unwrap_or_default();
    let asked = form::asked(query);
    let plain = operators.plain.load(Relaxed) && !q.request.tls;
    let restarts = q.balancer.generation().config.restarts.command.is_some();
    let page = match asked {
        Some((action, name)) => {
            let found = snapshot
                .state
                .servers
                .iter()
                .find(|s| s.id == name || s.address.eq_ignore_ascii_case(&name));
            let Some(found) = found else {
                return text(400, format!("400 Bad Request: no server {name} here\n"));
            };
            page::confirm(&snapshot, found, action.name(), &token, &q.host)
        }
        None => page::operate(&page::Operating {
            snapshot: &snapshot,
            host: &q.host,
            user: &signed.user,
            done: form::done(query),
            plain,
            restarts,
        }),
    };
    html(page)
}

/// `POST`: the action, once its token, origin and fields hold; 303 back to the page.
async fn act(q: &Query<'_>, signed: &Signed) -> LocalAnswer {
    if let Some(refusal) = form::cross_site(q.request) {
        return text(403, refusal);
    }
    let form = match Form::read(&q.request.body) {
        Ok(form) => form,
        Err(why) => return text(400, format!("400 Bad Request: {why}\n")),
    };
    let secret = q.operators.secret.load();
    if !token::holds(&secret, &signed.user, &form.token, wall_ms() / 1000) {
        return text(
            403,
            "403 Forbidden: the form's token is missing, another user's or expired; open the \
             page again and repeat the action\n",
        );
    }
    let Some(server) = q.balancer.find_server(&form.server) else {
        return text(
            400,
            format!("400 Bad Request: no server {} here\n", form.server),
        );
    };
    let operation = match form.action {
        Action::Restart => return restart(q, signed, &server).await,
        Action::Disable => Operation::Disable { reason: None },
        Action::Drain => Operation::Drain { reason: None },
        Action::Enable => Operation::Enable,
        Action::Release => Operation::Release,
        Action::Cut => Operation::Cut,
        Action::Weight => Operation::Weight(form.weight),
    };
    match q.balancer.operate(&server, operation, &signed.who) {
        Ok(done) => {
            operation::keep(
                q.operators.state_file.as_deref(),
                &q.shared.balancers.load(),
            );
            info!(
                "ADMIN: {} {}: {}",
                signed.who,
                form.action.name(),
                done.message
            );
            see_page(form.action, &server)
        }
        Err(why) => text(400, format!("400 Bad Request: {why}\n")),
    }
}

/// `restart`: `RESTART_COMMAND` started (the page shows its run when it ends), or 409 when
/// its bounds refuse it now (the cooldown, saying until when).
async fn restart(q: &Query<'_>, signed: &Signed, server: &Arc<Server>) -> LocalAnswer {
    let Some(restarter) = q.operators.restarter.get() else {
        return text(
            409,
            "409 Conflict: restarts are not running on this broker\n",
        );
    };
    let balancer = q
        .shared
        .balancers
        .load()
        .iter()
        .find(|b| std::ptr::eq(b.as_ref(), q.balancer))
        .cloned();
    let Some(balancer) = balancer else {
        return text(
            409,
            "409 Conflict: the balancer is being replaced; try again\n",
        );
    };
    let mut run = restarter(balancer, Arc::clone(server), signed.who.clone());
    // Its bounds are checked before the command starts: a refusal comes at the first poll;
    // a command that runs is left to run, and the page shows how it ended.
    match tokio::time::timeout(std::time::Duration::ZERO, &mut run).await {
        Ok(Err(why)) => {
            info!(
                "ADMIN: {} restart of {} refused: {why}",
                signed.who, server.address
            );
            text(409, format!("409 Conflict: {why}\n"))
        }
        Ok(Ok(_)) => see_page(Action::Restart, server),
        Err(_) => {
            tokio::spawn(run);
            see_page(Action::Restart, server)
        }
    }
}

/// 303 to the page, saying what was done to which server.
fn see_page(action: Action, server: &Server) -> LocalAnswer {
    let location = format!(
        "{PATH}?done={}&server={}",
        action.name(),
        form::encode(server.id.as_str())
    );
    text(303, format!("done: {} {}\n", action.name(), server.address)).with("Location", location)
}
