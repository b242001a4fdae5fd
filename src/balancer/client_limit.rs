//! `MAX_CONNECTIONS_PER_CLIENT` applied to a balancer's clients: each client address's
//! connections (and, behind a trusted HTTP proxy, its requests in hand and its WebSockets) counted in a table ([`ClientCounts`], the pure rule) split in shards, each
//! behind its own lock held for one lookup, so clients of different addresses seldom wait on
//! one another and a balancer without the limit takes no lock at all; the hold a connection
//! keeps until it ends, however its task ends; the refusals counted (METRICS) and logged once
//! per episode per client, with the client's count.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::balancer::Balancer;
use crate::balancer::events::Event;
use crate::balancer::generation::Generation;
use crate::balancer::rules::per_client::{ClientCounts, Decision};

/// Shards of the table: enough that the worker threads (one per core) seldom meet on one
/// lock, few enough that an idle balancer's tables cost nothing to speak of.
const SHARDS: usize = 16;

/// Refused connections of one client answered at once (an HTTP 503 waits for the first
/// head, within `HTTP_REQUEST_TIMEOUT`): a browser opens six or so, and the rest of a flood is
/// closed at once.
const MOST_ANSWERED_PER_CLIENT: u32 = 8;

/// Refused connections of all clients answered at once, per balancer.
const MOST_ANSWERED: u32 = 256;

/// Each client address's connections, for one balancer, in shards by address.
#[derive(Debug)]
pub(super) struct ClientTable {
    shards: Vec<Mutex<ClientCounts>>,
    /// Refused connections being answered now, every client's.
    answering: AtomicU32,
}

impl Default for ClientTable {
    fn default() -> Self {
        ClientTable {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            answering: AtomicU32::new(0),
        }
    }
}

impl ClientTable {
    /// The shard `client`'s count is in, locked.
    fn shard(&self, client: IpAddr) -> std::sync::MutexGuard<'_, ClientCounts> {
        let bits = match client.to_canonical() {
            IpAddr::V4(ip) => u128::from(u32::from(ip)),
            IpAddr::V6(ip) => u128::from(ip) ^ (u128::from(ip) >> 64),
        };
        self.shards[(bits % SHARDS as u128) as usize]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Client addresses with connections counted now, in all shards.
    pub(super) fn clients(&self) -> usize {
        (0..SHARDS)
            .map(|i| {
                self.shards[i]
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clients()
            })
            .sum()
    }
}

/// A client's connection counted against `MAX_CONNECTIONS_PER_CLIENT` until dropped, however
/// its task ends; an empty one when the limit is off (nothing was counted).
#[derive(Debug)]
pub struct ClientHold(Option<(Arc<Balancer>, IpAddr)>);

impl ClientHold {
    /// Whether it counts anything (the limit is on): one that does not need not be kept.
    pub fn counts(&self) -> bool {
        self.0.is_some()
    }
}

/// A connection refused under `MAX_CONNECTIONS_PER_CLIENT` that is being answered (an HTTP
/// 503 once its first head comes), counted until dropped: it holds no `MAX_CONNECTIONS` place,
/// and at most a few of one client's, and a few hundred of all, are answered at once.
#[derive(Debug)]
pub struct RefusalHold {
    balancer: Arc<Balancer>,
    client: IpAddr,
}

/// What a hold counts against `MAX_CONNECTIONS_PER_CLIENT`, for the words of a refusal's
/// log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    /// A connection of the client's own, held while it is open.
    Connection,
    /// A request of the client's that came through a trusted HTTP proxy, held while in hand.
    ProxiedRequest,
}

impl Balancer {
    /// Counts a connection of `client` against `generation`'s `MAX_CONNECTIONS_PER_CLIENT`
    /// until the returned hold is dropped; `None` when the client has that many open already,
    /// the refusal counted and, the first of an episode, logged with the client's count.
    /// With the limit off (0) nothing is counted and no lock taken: connections opened then
    /// are not counted if a reload sets a limit later.
    pub fn hold_for_client(
        self: &Arc<Self>,
        generation: &Generation,
        client: IpAddr,
    ) -> Option<ClientHold> {
        self.count_client(generation, client, Counted::Connection)
    }

    /// Counts a request of `client` that came through a trusted HTTP proxy
    /// (`HTTP_TRUSTED_PROXIES`) against `MAX_CONNECTIONS_PER_CLIENT`, in the same table as its
    /// own connections, until the returned hold is dropped (the request's answer is over);
    /// `None`, counted and logged as for a connection, when the client has its fill.
    pub fn hold_for_proxied_request(
        self: &Arc<Self>,
        generation: &Generation,
        client: IpAddr,
    ) -> Option<ClientHold> {
        self.count_client(generation, client, Counted::ProxiedRequest)
    }

    /// A hold of `counted` for `client`, or its refusal counted and logged.
    fn count_client(
        self: &Arc<Self>,
        generation: &Generation,
        client: IpAddr,
        counted: Counted,
    ) -> Option<ClientHold> {
        let limit = generation.config.max_connections_per_client;
        if limit == 0 {
            return Some(ClientHold(None));
        }
        let now = self.clock.now_ms();
        let admission = self.clients.shard(client).admit(client, limit, now);
        match admission {
            Decision::Admitted { episode_over } => {
                if let Some(refused) = episode_over {
                    served_again(client, refused);
                }
                Some(ClientHold(Some((Arc::clone(self), client))))
            }
            Decision::Refused { open, first } => {
                self.stats.client_limited.fetch_add(1, Relaxed);
                self.events.emit(|| Event::ClientLimited {
                    balancer: self.kind(),
                    client,
                    open,
                });
                if first {
                    refused(client, open, limit, counted);
                }
                None
            }
        }
    }

    /// Client addresses with connections counted against `MAX_CONNECTIONS_PER_CLIENT` now.
    pub fn clients_counted(&self) -> usize {
        self.clients.clients()
    }

    /// A connection of `client` that [`Balancer::hold_for_client`] just refused, to be
    /// answered: a hold while at most [`MOST_ANSWERED_PER_CLIENT`] of the client's and
    /// [`MOST_ANSWERED`] of all are answered now; `None`: close it at once.
    pub fn answer_refusal(self: &Arc<Self>, client: IpAddr) -> Option<RefusalHold> {
        let total = &self.clients.answering;
        total
            .fetch_update(Relaxed, Relaxed, |n| (n < MOST_ANSWERED).then_some(n + 1))
            .ok()?;
        if !self
            .clients
            .shard(client)
            .answer_refusal(client, MOST_ANSWERED_PER_CLIENT)
        {
            total.fetch_sub(1, Relaxed);
            return None;
        }
        Some(RefusalHold {
            balancer: Arc::clone(self),
            client,
        })
    }
}

impl Drop for RefusalHold {
    fn drop(&mut self) {
        let table = &self.balancer.clients;
        table.answering.fetch_sub(1, Relaxed);
        let over = table.shard(self.client).answered(self.client);
        if let Some(refused) = over {
            let client = self.client;
            self.balancer
                .span()
                .in_scope(|| served_again(client, refused));
        }
    }
}

/// A client as the per-client lines name it: its address, or `unknown` for the one count the
/// HTTP balancer keeps for every client a trusted proxy's `X-Forwarded-For` left unknown (the
/// unspecified address, which no client connects from).
struct Named(IpAddr);

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_unspecified() {
            f.write_str("unknown")
        } else {
            self.0.fmt(f)
        }
    }
}

/// The line that begins a client's episode of refusals.
fn refused(client: IpAddr, open: u32, limit: u32, counted: Counted) {
    let client = Named(client);
    match counted {
        Counted::Connection => warn!(
            client = %client,
            open,
            "MAX_CONNECTIONS_PER_CLIENT ({limit}) reached by client {client} ({open} \
             connections open): its new connections are closed at once until some end; other \
             clients are served"
        ),
        Counted::ProxiedRequest => warn!(
            client = %client,
            open,
            "MAX_CONNECTIONS_PER_CLIENT ({limit}) reached by client {client} behind a trusted \
             proxy ({open} connections, and requests and WebSockets in hand): its requests are \
             answered 503 until some end; the proxy's other clients are served"
        ),
    }
}

/// The line that ends a client's episode of refusals.
fn served_again(client: IpAddr, refused: u64) {
    let client = Named(client);
    info!(
        client = %client,
        "client {client} is below MAX_CONNECTIONS_PER_CLIENT again; {refused} of its \
         connections were refused"
    );
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        let Some((balancer, client)) = self.0.take() else {
            return;
        };
        let over = balancer.clients.shard(client).release(client);
        if let Some(refused) = over {
            balancer.span().in_scope(|| served_again(client, refused));
        }
    }
}
