//! `/TOTVS_BROKER_QUERY/ADMIN`: operating the balancer from the browser, signed in. Off unless
//! `ADMIN_USERS` names an htpasswd file (404). A request is checked in this order, each
//! refusal changing nothing: the transport (TLS, or plain HTTP from a loopback peer unless
//! `ADMIN_PLAIN_HTTP`: 403), the credentials (HTTP Basic; none is the browser's challenge,
//! a wrong one its 401 again, both with `WWW-Authenticate`; failures throttled per
//! address; a sign-in past those waiting at once, or whose verification's turn does not come,
//! answered 503 with `Retry-After`), then for an action the anti-forgery token and the request's origin (403), its
//! fields (400), and what the state allows (409). `QUERY_ALLOW` and the query place were
//! checked before any of it (`super::route`). Every answer is unframeable and unstored
//! ([`guarded`]): the public pages are not touched.
//!
//! A `GET` is the page of actions (the status of each server with a row of actions), or,
//! naming an action and a server, its confirmation: what will happen and a button. The
//! button's `POST` acts at once, through the same code path as `appbroker ctl`
//! ([`Balancer::operate`](crate::balancer::Balancer::operate), the state file written, the alert sent with `who` =
//! `web:<user>@<address>`), and answers 303 back to the page, which shows the result.
//!
//! - `operators`: what the page needs of the process, one per broker: who may sign in and
//!   the rest below, the secret, the state file, how a restart runs.
//! - `users`: the users file, Basic credentials, bcrypt on the blocking pool, the cache.
//! - `throttle`: failed sign-ins slowed per address.
//! - `token`: the anti-forgery token.
//! - `form`: the action's form, and the origin it came from.

mod form;
mod operators;
mod throttle;
mod token;
mod users;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use tracing::info;

use super::asking::Query;
use super::page;
use super::reply::{closing, guarded, html, text};
use crate::balancer::operation::{self, Operation};
use crate::balancer::{Admission, Server};
use crate::config::Language;
use crate::http::LocalAnswer;
use crate::support::clock::wall_ms;
use form::{Action, Form};
use operators::Door;
pub use operators::{Operators, Restarter, check};
use throttle::Turn;
use users::Checked;
pub use users::{Users, UsersError};

/// The path of the page, as its links, forms and redirects write it (the page's).
pub(super) use super::page::ADMIN_PATH as PATH;

/// The protection space the browser is asked to sign in to.
const REALM: &str = "Basic realm=\"appbroker ADMIN\", charset=\"UTF-8\"";

/// The 401 that asks the browser to sign in.
fn challenge() -> LocalAnswer {
    text(
        401,
        "401 Unauthorized: sign in with a user of ADMIN_USERS\n",
    )
    .with("WWW-Authenticate", REALM)
}

/// Why the transport is refused, or `None`: TLS always does; plain HTTP only from a loopback
/// peer (the socket's: a trusted proxy that forwarded the request, or a front whose PROXY
/// protocol header named the client, must be on loopback too, and so must the client they
/// name: a front on another host relaying its own loopback client carried the password over
/// the network in the clear) unless `plain`.
fn transport_refusal(q: &Query<'_>, plain: bool) -> Option<&'static str> {
    let loopback = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    };
    let request = q.request;
    let local =
        loopback(q.peer.ip()) && request.via.is_none_or(loopback) && !request.front_off_host;
    (!q.request.tls && !local && !plain).then_some(
        "403 Forbidden: /TOTVS_BROKER_QUERY/ADMIN is offered over TLS only (or over plain HTTP \
         from this host); sign in through the balancer's TLS port\n",
    )
}

/// The ADMIN command's answer, every one of them unframed and unstored
/// ([`guarded`]).
pub(super) async fn answer(q: &Query<'_>, acting: Acting<'_>) -> LocalAnswer {
    guarded(unguarded(q, acting).await)
}

/// The ADMIN command's answer, before its guarding lines.
async fn unguarded(q: &Query<'_>, acting: Acting<'_>) -> LocalAnswer {
    let Acting {
        operators,
        admission,
    } = acting;
    let users = match &**operators.door.load() {
        Door::Off => {
            return text(
                404,
                "404 Not Found: acting from the browser is off (ADMIN_USERS is not set in [General])\n",
            );
        }
        // Its words name a path of the host: they are the log's, not a client's.
        Door::Broken => {
            return text(
                503,
                "503 Service Unavailable: the users file (ADMIN_USERS) cannot be used; the \
                 broker's log says why\n",
            );
        }
        Door::Open(users) => Arc::clone(users),
    };
    if let Some(refusal) = transport_refusal(q, operators.plain.load(Relaxed)) {
        return closing(403, refusal);
    }
    let Some(header) = q.request.value("authorization") else {
        return challenge();
    };
    // A credential verified already never waits among the sign-ins.
    let user = match operators.verified.user(header) {
        Some(user) => user,
        None => match sign_in(operators, &users, header, q.peer, admission).await {
            Ok(user) => user,
            Err(refusal) => return refusal,
        },
    };
    let signed = SignedIn {
        who: format!("web:{user}@{}", q.peer.ip()),
        user,
        operators,
    };
    if q.request.method() == b"POST" {
        act(q, &signed).await
    } else {
        show(q, &signed)
    }
}

/// Checks `header`, one of the [`users::SIGNING_IN_AT_ONCE`] sign-ins waiting at once (or, from
/// an address users signed in from lately, of the [`users::KEPT_SIGNING_IN_AT_ONCE`] kept for
/// them, verified on a turn of their own; past them answered busy at once), with the throttle of `peer`'s address: its turn waited (the
/// connection's place given back first, so a throttled attempt holds no query or client
/// place; a client stays counted as accepted once), then bcrypt. The user when it is good,
/// else the answer: the challenge again, or busy.
async fn sign_in(
    operators: &Operators,
    users: &Arc<Users>,
    header: &[u8],
    peer: SocketAddr,
    admission: &mut Admission,
) -> Result<String, LocalAnswer> {
    // An address users signed in from lately waits and is verified apart from the others,
    // so a flood from elsewhere never queues ahead of it.
    let (places, turns) = if operators.throttle.signed_in_from(peer.ip()) {
        (&operators.kept_signing_in, &operators.kept_turns)
    } else {
        (&operators.signing_in, &operators.turns)
    };
    let Ok(_waiting) = places.try_acquire() else {
        return Err(busy());
    };
    match operators.throttle.turn(peer.ip()) {
        Turn::Refused => return Err(challenge()),
        Turn::After(wait) if !wait.is_zero() => {
            admission.give_back();
            tokio::time::sleep(wait).await;
        }
        Turn::After(_) => {}
    }
    match users::check(users, &operators.verified, turns, header).await {
        Checked::Good(user) => {
            operators.throttle.succeeded(peer.ip());
            Ok(user)
        }
        Checked::Wrong => Err(challenge()),
        Checked::Busy => Err(busy()),
    }
}

/// The 503 of a sign-in not checked: too many wait already.
fn busy() -> LocalAnswer {
    text(
        503,
        "503 Service Unavailable: too many sign-ins are being checked; try again in a few \
         seconds\n",
    )
    .with("Retry-After", "5")
}

/// A signed-in user: their name, and who they are in logs and alerts; and the process's
/// operators they act through.
struct SignedIn<'a> {
    user: String,
    /// `web:<user>@<address>`.
    who: String,
    operators: &'a Operators,
}

/// What ADMIN's answer has beside the query: the process's operators, and the connection's
/// admission, given back while a throttled sign-in waits.
pub(super) struct Acting<'a> {
    pub(super) operators: &'a Operators,
    pub(super) admission: &'a mut Admission,
}

/// `GET`: the page of actions, or the confirmation of the action the query names.
fn show(q: &Query<'_>, signed: &SignedIn<'_>) -> LocalAnswer {
    let operators = signed.operators;
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
async fn act(q: &Query<'_>, signed: &SignedIn<'_>) -> LocalAnswer {
    if let Some(refusal) = form::cross_site(q.request) {
        return text(403, refusal);
    }
    // The token before the fields: a forged form learns nothing of what they may be.
    let secret = signed.operators.secret.load();
    let sent = form::token(&q.request.body);
    if !token::holds(&secret, &signed.user, &sent, wall_ms() / 1000) {
        return text(
            403,
            "403 Forbidden: the form's token is missing, another user's or expired; open the \
             page again and repeat the action\n",
        );
    }
    let form = match Form::read(&q.request.body) {
        Ok(form) => form,
        Err(why) => return text(400, format!("400 Bad Request: {why}\n")),
    };
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
                signed.operators.state_file.as_deref(),
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
/// its bounds refuse it now (the cooldown, saying until when), in the page's language.
async fn restart(q: &Query<'_>, signed: &SignedIn<'_>, server: &Arc<Server>) -> LocalAnswer {
    let Some(restarter) = signed.operators.restarter.get() else {
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
        Ok(Err(refusal)) => {
            info!(
                "ADMIN: {} restart of {} refused: {}",
                signed.who,
                server.address,
                page::restart_refused(Language::English, &refusal)
            );
            let words = page::restart_refused(q.language().language, &refusal);
            text(409, format!("409 Conflict: {words}\n"))
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
