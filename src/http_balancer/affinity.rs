//! Where an HTTP request goes: the server its signed `TOTVS_BROKER_SH_001` cookie names while
//! that server can take it, a cookie of the upgrade window honoured and signed anew, or the
//! balancer's pick with a new cookie; a live session moved off its server logged once per
//! server and episode, a client past `HTTP_MAX_SESSIONS_PER_CLIENT` likewise; and the
//! broker's cookie taken out of what the server is sent.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tracing::{info, warn};

use crate::balancer::{Generation, Lease, Server};
use crate::config::BalancerConfig;
use crate::http::h1::{Editor, FieldName};
use crate::http::{Choice, ClientHead, Downstream};
use crate::http_balancer::sessions::{
    Affinity, CookieKeys, Limits, Sessions, Ticket, Touched, mentions_broker_cookie,
    without_broker_cookie,
};
use crate::http_balancer::{HttpBalancer, RequestHold, ServerTarget, client_key, client_named};
use crate::support::clock::wall_ms;
use crate::support::throttle::Episode;

/// Where a signed cookie's session goes.
enum Sticky {
    /// To its server (or, `None`, a 503: its server has no room to count the request).
    Served(Option<Choice<HttpBalancer>>),
    /// Elsewhere: the live session moving (`Some`), or a cookie of no live session whose
    /// server cannot take it, balanced as none (`None`).
    Moving(Option<Ticket>),
}

impl HttpBalancer {
    /// A request's server: the one its `TOTVS_BROKER_SH_001` cookie names while that server
    /// can take it (disabled, draining or weight 0 included: only new sessions avoid those),
    /// when the broker signed that cookie; else the balancer's pick among the servers not
    /// tried yet, up to `MAX_ATTEMPTS`, with a new cookie set on the answer (every server
    /// quarantined, they are tried anyway: a quarantine may be stale). A live session whose
    /// server is in quarantine, removed or failed this request is moved (logged once per
    /// server and episode, counted), or refused with a 503 under `HTTP_STICKY_STRICT=1`. A
    /// cookie that does not verify is no session: see [`HttpBalancer::unsigned`].
    pub(super) fn choose_server(
        &self,
        request: &ClientHead<'_>,
        client: &Downstream,
        tried: &[ServerTarget],
    ) -> Option<Choice<HttpBalancer>> {
        let generation = self.balancer.generation();
        if tried.len() >= generation.config.max_attempts as usize {
            return None;
        }
        let keys = self.session_secrets.keys();
        let section = self.balancer.kind().section();
        let mut affinity = Affinity::of(request.values(FieldName::Cookie), &keys, section);
        if let Affinity::Unbound(ticket) = affinity {
            // The earlier form: a session in its upgrade window, no cookie after it.
            let timeout = generation.config.http.session_timeout;
            affinity = if keys.honours_unbound(wall_ms(), timeout) {
                Affinity::Previous(ticket)
            } else {
                Affinity::None
            };
        }
        let moving = match affinity {
            Affinity::Signed(ticket) | Affinity::Previous(ticket) => {
                // Signed with SESSION_SECRET_PREVIOUS, or of the earlier form: the same
                // session, signed anew (bound to this balancer).
                let renewed =
                    matches!(affinity, Affinity::Previous(_)).then(|| keys.renew(section, &ticket));
                let upgrade = request.asks_upgrade();
                match self.session(&generation, ticket, renewed, tried, upgrade, client) {
                    Sticky::Served(choice) => return choice,
                    Sticky::Moving(moving) => moving,
                }
            }
            Affinity::Unsigned(ticket) => {
                if let Some(choice) = self.unsigned(&generation, &keys, ticket, tried, client) {
                    return choice;
                }
                None
            }
            Affinity::Unbound(_) | Affinity::None => None,
        };
        if moving.is_some() && generation.config.http.sticky_strict {
            return None;
        }
        self.balance(&generation, &keys, moving, tried, client)
    }

    /// The broker's cookie is the broker's: the server sees the client's other cookies only,
    /// byte for byte (whatever their encoding).
    pub(super) fn without_broker_cookie(&self, request: &ClientHead<'_>, head: &mut Editor) {
        for (id, value) in request.lines(FieldName::Cookie) {
            if !mentions_broker_cookie(value) {
                continue;
            }
            // The bytes left are bytes of a valid value: the editor takes them.
            match without_broker_cookie(value) {
                Some(kept) if head.set(id, &[&kept]).is_ok() => {}
                _ => head.remove(id),
            }
        }
    }

    /// A signed cookie: its session refreshed and the request on its server, while that
    /// server is configured, available and has not failed this request. `renewed`: the
    /// cookie signed anew after a rotation (or bound, from the earlier form), which the
    /// session goes on as (and the answer sets). A new session of a client past
    /// `HTTP_MAX_SESSIONS_PER_CLIENT` goes to its server all the same, uncounted.
    fn session(
        &self,
        generation: &Generation,
        ticket: Ticket,
        renewed: Option<Ticket>,
        tried: &[ServerTarget],
        upgrade: bool,
        client: &Downstream,
    ) -> Sticky {
        let index = generation
            .servers
            .iter()
            .position(|s| s.id == ticket.server);
        let mut table = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = match renewed {
            Some(new) => {
                table.renew(ticket, new);
                new
            }
            None => ticket,
        };
        if let Some(index) = index {
            let server = &generation.servers[index];
            let failed = tried.iter().any(|t| Arc::ptr_eq(&t.0, server));
            if !failed && server.is_available(self.balancer.clock_ms()) {
                // Unknown clients (a trusted chain naming no usable address) share one count.
                let client_ip = client_key(client.peer);
                let limits = limits(&generation.config);
                let touched = table.touch(ticket, client_ip, Instant::now(), &limits);
                if touched == Touched::OverClientCap {
                    self.over_cap(client_ip, limits.per_client);
                }
                // A WebSocket pins its session: it does not expire while the WebSocket lives.
                let pinned = upgrade.then(|| {
                    table.opened(ticket);
                    (ticket, Arc::clone(&self.sessions))
                });
                self.count_sessions(&table, &generation.servers);
                drop(table);
                let cookie = renewed.map(|new| new.set_cookie(client.tls));
                let choice = generation
                    .lease(index, false)
                    .map(|lease| chosen(lease, pinned, cookie));
                return Sticky::Served(choice);
            }
        }
        // A cookie naming a server that is not configured is a live session's only while
        // the table knows it (the server was removed); else it is no cookie at all.
        Sticky::Moving(Some(ticket).filter(|t| index.is_some() || table.knows(*t)))
    }

    /// A cookie of the right form that does not verify: forged, issued by a version that
    /// did not sign cookies, or issued by another balancer. In the upgrade window (one
    /// `SESSION_TIMEOUT` after the first start that signed them, which opens only where an
    /// earlier state file was found) it is honoured when it names a server that takes new
    /// clients and no other balancer issued it, and signed anew for the same server, so
    /// upgrading moves no session; it never becomes a session (forged ones would fill the
    /// table and skew the spread). Otherwise, and always for a server an operator took out,
    /// it is no cookie (`None`).
    fn unsigned(
        &self,
        generation: &Generation,
        keys: &CookieKeys,
        ticket: Ticket,
        tried: &[ServerTarget],
        client: &Downstream,
    ) -> Option<Option<Choice<Self>>> {
        if !keys.honours_unsigned(wall_ms(), generation.config.http.session_timeout) {
            return None;
        }
        // A cookie another balancer of the file issued names another balancer's server: no
        // window honours it.
        let config = self.ctx.config.load();
        let own = self.balancer.kind();
        let others = config
            .balancers
            .iter()
            .filter(|b| b.kind.is_http() && b.kind != own)
            .map(|b| b.kind.section());
        if keys.bound_elsewhere(others, &ticket) {
            return None;
        }
        let index = generation
            .servers
            .iter()
            .position(|s| s.id == ticket.server)?;
        let server = &generation.servers[index];
        let failed = tried.iter().any(|t| Arc::ptr_eq(&t.0, server));
        if failed || !server.takes_new_clients(self.balancer.clock_ms()) {
            return None;
        }
        let cookie = keys
            .issue(own.section(), ticket.server)
            .set_cookie(client.tls);
        Some(
            generation
                .lease(index, false)
                .map(|lease| chosen(lease, None, Some(cookie))),
        )
    }

    /// The balancer's pick for a request without a session (or whose session `moving` moves
    /// off its server), with a new cookie for the server picked.
    fn balance(
        &self,
        generation: &Generation,
        keys: &CookieKeys,
        moving: Option<Ticket>,
        tried: &[ServerTarget],
        client: &Downstream,
    ) -> Option<Choice<Self>> {
        let now = self.balancer.clock_ms();
        let mut table = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        table.expire(Instant::now(), generation.config.http.session_timeout);
        // The pick below reads the counts: without the sessions just ended.
        self.count_sessions(&table, &generation.servers);
        let tried: Vec<usize> = generation
            .servers
            .iter()
            .enumerate()
            .filter(|(_, s)| tried.iter().any(|t| Arc::ptr_eq(&t.0, s)))
            .map(|(i, _)| i)
            .collect();
        let lease = generation.pick_with_fallback(now, &tried)?;
        // Every server in quarantine, the pick may be its own server again: no move.
        if let Some(old) = moving
            && old.server != lease.server.id
            && table.moved(old)
        {
            self.session_moved(generation, old, &lease.server, client);
        }
        self.count_sessions(&table, &generation.servers);
        drop(table);
        let section = self.balancer.kind().section();
        let cookie = keys.issue(section, lease.server.id).set_cookie(client.tls);
        Some(chosen(lease, None, Some(cookie)))
    }

    /// A live session moved off its server (`old` names it) to `to`: the first of an episode
    /// of its server is logged, the others counted (see [`HttpBalancer::moves_ended`]), so a
    /// server in quarantine with thousands of sessions writes one line, not thousands.
    fn session_moved(
        &self,
        generation: &Generation,
        old: Ticket,
        to: &Server,
        client: &Downstream,
    ) {
        let mut moves = self.moves.lock().unwrap_or_else(|p| p.into_inner());
        let (episode, from) = moves.entry(old.server).or_insert_with(|| {
            let from = generation
                .servers
                .iter()
                .find(|s| s.id == old.server)
                .map_or_else(
                    || format!("{} (no longer configured)", old.server),
                    |s| format!("{} ({})", old.server, s.address),
                );
            (Episode::default(), from)
        });
        if episode.strike() {
            self.span.in_scope(|| {
                warn!(client = %client.peer, from = %from, server = %to.address, "session moved: its server cannot take it; cookie set anew")
            });
        }
    }

    /// The episodes of moved sessions that have been quiet for a second: each ends, with a
    /// line counting its moves when there was more than the one logged.
    pub(super) fn moves_ended(&self) {
        let mut moves = self.moves.lock().unwrap_or_else(|p| p.into_inner());
        moves.retain(|_, (episode, from)| {
            let Some(moved) = episode.end() else {
                return true;
            };
            if moved > 1 {
                self.span.in_scope(|| {
                    info!(from = %from, moved, "sessions moved off their server: {moved} in this episode, the first one logged")
                });
            }
            false
        });
    }

    /// A new session of `client` was neither stored nor counted, the client having `cap`
    /// stored: the first of an episode of that client is logged, the others counted (see
    /// [`HttpBalancer::over_cap_ended`]).
    fn over_cap(&self, key: IpAddr, cap: usize) {
        let mut clients = self.over_cap.lock().unwrap_or_else(|p| p.into_inner());
        if clients.entry(key).or_default().strike() {
            let client = client_named(key);
            self.span.in_scope(|| {
                warn!(
                    client = %client,
                    "HTTP_MAX_SESSIONS_PER_CLIENT ({cap}) reached by client {client}: its new \
                     sessions keep their server (their cookie names it) but are neither stored \
                     nor counted, so it cannot move the balance of new sessions; users behind \
                     one address (a NAT, a terminal server, a front balancer without the PROXY \
                     protocol) need a higher cap, or their own addresses passed on"
                )
            });
        }
    }

    /// The episodes of clients over their cap that have been quiet for a second: each ends,
    /// with a line counting its sessions not counted when there was more than the one logged.
    pub(super) fn over_cap_ended(&self, cap: u32) {
        let mut clients = self.over_cap.lock().unwrap_or_else(|p| p.into_inner());
        clients.retain(|key, episode| {
            let Some(refused) = episode.end() else {
                return true;
            };
            if refused > 1 {
                let client = client_named(*key);
                self.span.in_scope(|| {
                    info!(client = %client, refused, "client {client}: {refused} new sessions past HTTP_MAX_SESSIONS_PER_CLIENT ({cap}) were not counted in this episode, the first one logged")
                });
            }
            false
        });
    }
}

/// The bounds of a balancer's table of sessions, from its keys as they are now.
fn limits(config: &BalancerConfig) -> Limits {
    Limits {
        timeout: config.http.session_timeout,
        max: config.http.max_sessions as usize,
        per_client: config.http.max_sessions_per_client as usize,
    }
}

/// The request goes to `lease`'s server, holding `lease` (and the session `pinned`), with
/// `set_cookie` (handing a session's ticket to the browser) added to the answer.
fn chosen(
    lease: Lease,
    pinned: Option<(Ticket, Arc<Mutex<Sessions>>)>,
    set_cookie: Option<String>,
) -> Choice<HttpBalancer> {
    Choice {
        server: ServerTarget(Arc::clone(&lease.server)),
        lease: RequestHold { lease, pinned },
        set_cookie,
    }
}
