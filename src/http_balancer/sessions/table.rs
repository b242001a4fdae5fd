//! The table of live HTTP sessions: a value becomes a session when a request
//! brings it back; the table only counts and ages sessions (the cookie alone decides where a
//! request goes), so a session it forgot, or never stored, keeps its affinity. Only signed
//! values reach it.
//!
//! A client (the address a request is from, as the PROXY protocol or `HTTP_TRUSTED_PROXIES`
//! resolve it) has at most `HTTP_MAX_SESSIONS_PER_CLIENT` sessions stored and counted at once:
//! a request without a cookie gets a valid one, so one client could otherwise mint thousands
//! for one server, bring each back once, and steer every new browser to the others for a
//! `SESSION_TIMEOUT`. Past the cap its new sessions still hold their server but count for
//! nothing.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use foldhash::HashMap;
use tokio::time::Instant;

use super::ticket::Ticket;
use crate::config::ServerId;

/// What the table knows of one session.
#[derive(Debug, Clone, Copy)]
struct SessionEntry {
    /// Its last request (or the end of its last WebSocket).
    last: Instant,
    /// WebSocket connections open now: the session does not expire while any is.
    open: u32,
    /// The client whose request made it, whose count it is in.
    client: IpAddr,
}

/// What [`Sessions::touch`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched {
    /// The value came back for the first time (or after it was forgotten): a new session.
    New,
    /// A live session.
    Known,
    /// A new session of a client that has `per_client` stored already: neither stored nor
    /// counted (its cookie still holds its server).
    OverClientCap,
}

/// The bounds a touch keeps to: a balancer's `SESSION_TIMEOUT`, `HTTP_MAX_SESSIONS` and
/// `HTTP_MAX_SESSIONS_PER_CLIENT`, as they are now (a reload may change them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A session ends after this long without a request.
    pub timeout: Duration,
    /// Sessions stored at most (0: none); the oldest idle is forgotten for a new one.
    pub max: usize,
    /// Sessions of one client stored at most (0: no cap); more are not stored.
    pub per_client: usize,
}

/// The live sessions of one balancer: expiry after `timeout` without a request (not while a
/// WebSocket of it is open), at most `max` (the oldest idle forgotten first), counts per
/// server. Expiry is applied lazily, at each call, in order of age.
#[derive(Debug)]
pub struct Sessions {
    entries: HashMap<Ticket, SessionEntry>,
    /// Idle sessions by last request, oldest first (sessions with an open WebSocket are not
    /// here: they cannot expire or be evicted).
    idle: BTreeSet<(Instant, Ticket)>,
    /// Live sessions per server, and the most at once.
    per_server: HashMap<ServerId, (u64, u64)>,
    /// Live sessions per client (those with one at least).
    per_client: HashMap<IpAddr, u32>,
    /// Sessions since start.
    total: u64,
    /// Most live sessions at once.
    peak: u64,
    /// Sessions moved to another server (redispatched).
    moved: u64,
}

impl Default for Sessions {
    fn default() -> Sessions {
        Sessions::new()
    }
}

impl Sessions {
    /// An empty table.
    pub fn new() -> Sessions {
        Sessions {
            entries: HashMap::default(),
            idle: BTreeSet::new(),
            per_server: HashMap::default(),
            per_client: HashMap::default(),
            total: 0,
            peak: 0,
            moved: 0,
        }
    }

    /// A request of `client` brought `ticket` back at `now`: its session is refreshed, or
    /// made (the oldest idle ones forgotten to stay within `limits.max`), unless `client` has
    /// `limits.per_client` stored already.
    pub fn touch(
        &mut self,
        ticket: Ticket,
        client: IpAddr,
        now: Instant,
        limits: &Limits,
    ) -> Touched {
        self.expire(now, limits.timeout);
        if let Some(entry) = self.entries.get_mut(&ticket) {
            if entry.open == 0 {
                self.idle.remove(&(entry.last, ticket));
                self.idle.insert((now, ticket));
            }
            entry.last = now;
            return Touched::Known;
        }
        if limits.max == 0 {
            return Touched::New;
        }
        let stored = self.per_client.get(&client).map_or(0, |&n| n as usize);
        if limits.per_client > 0 && stored >= limits.per_client {
            return Touched::OverClientCap;
        }
        while self.entries.len() >= limits.max {
            let Some((_, oldest)) = self.idle.pop_first() else {
                // Every session has a WebSocket open: none may be forgotten.
                return Touched::New;
            };
            self.forget(oldest);
        }
        let entry = SessionEntry {
            last: now,
            open: 0,
            client,
        };
        self.entries.insert(ticket, entry);
        self.idle.insert((now, ticket));
        let (live, peak) = self.per_server.entry(ticket.server).or_default();
        *live += 1;
        *peak = (*peak).max(*live);
        *self.per_client.entry(client).or_default() += 1;
        self.total += 1;
        self.peak = self.peak.max(self.entries.len() as u64);
        Touched::New
    }

    /// `ticket`'s server could not take it: the session ends here (its new value starts a
    /// new one when it comes back). True when it was a live session, to be logged and
    /// counted once.
    pub fn moved(&mut self, ticket: Ticket) -> bool {
        let Some(entry) = self.entries.get(&ticket) else {
            return false;
        };
        self.idle.remove(&(entry.last, ticket));
        self.forget(ticket);
        self.moved += 1;
        true
    }

    /// `old`'s session goes on as `new` (its cookie signed anew after a rotation): its age,
    /// WebSockets and count kept. Nothing when `old` is no live session.
    pub fn renew(&mut self, old: Ticket, new: Ticket) {
        if old == new || self.entries.contains_key(&new) {
            return;
        }
        let Some(entry) = self.entries.remove(&old) else {
            return;
        };
        if entry.open == 0 {
            self.idle.remove(&(entry.last, old));
            self.idle.insert((entry.last, new));
        }
        self.entries.insert(new, entry);
    }

    /// A WebSocket of `ticket`'s session opened: the session stays alive until it closes.
    pub fn opened(&mut self, ticket: Ticket) {
        if let Some(entry) = self.entries.get_mut(&ticket) {
            if entry.open == 0 {
                self.idle.remove(&(entry.last, ticket));
            }
            entry.open += 1;
        }
    }

    /// A WebSocket of `ticket`'s session closed at `now`: the session's idle time starts
    /// again from here once no other is open.
    pub fn closed(&mut self, ticket: Ticket, now: Instant) {
        if let Some(entry) = self.entries.get_mut(&ticket) {
            entry.open = entry.open.saturating_sub(1);
            entry.last = now;
            if entry.open == 0 {
                self.idle.insert((now, ticket));
            }
        }
    }

    /// Ends the sessions idle for `timeout` or more at `now`.
    pub fn expire(&mut self, now: Instant, timeout: Duration) {
        while let Some(&(last, ticket)) = self.idle.first() {
            if now.saturating_duration_since(last) < timeout {
                break;
            }
            self.idle.pop_first();
            self.forget(ticket);
        }
    }

    /// Removes `ticket` from the entries, its server's count and its client's (not from
    /// `idle`).
    fn forget(&mut self, ticket: Ticket) {
        let Some(entry) = self.entries.remove(&ticket) else {
            return;
        };
        if let Some((live, _)) = self.per_server.get_mut(&ticket.server) {
            *live = live.saturating_sub(1);
        }
        if let Some(stored) = self.per_client.get_mut(&entry.client) {
            *stored = stored.saturating_sub(1);
            if *stored == 0 {
                self.per_client.remove(&entry.client);
            }
        }
    }

    /// Live sessions stored for `client`.
    pub fn of_client(&self, client: IpAddr) -> u64 {
        self.per_client.get(&client).map_or(0, |&n| u64::from(n))
    }

    /// True when `ticket` is a live session.
    pub fn knows(&self, ticket: Ticket) -> bool {
        self.entries.contains_key(&ticket)
    }

    /// Live sessions bound to `server`.
    pub fn count(&self, server: ServerId) -> u64 {
        self.per_server.get(&server).map_or(0, |(live, _)| *live)
    }

    /// Most live sessions bound to `server` at once.
    pub fn peak_of(&self, server: ServerId) -> u64 {
        self.per_server.get(&server).map_or(0, |(_, peak)| *peak)
    }

    /// Live sessions.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no session is live.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sessions since start.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Most live sessions at once.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Sessions moved to another server since start.
    pub fn moved_count(&self) -> u64 {
        self.moved
    }

    /// How long each of `server`'s live sessions has been idle at `now` (0 while a
    /// WebSocket of it is open), longest first, at most `limit` of them.
    pub fn ages(&self, server: ServerId, now: Instant, limit: usize) -> Vec<Duration> {
        let mut ages: Vec<Duration> = self
            .entries
            .iter()
            .filter(|(t, _)| t.server == server)
            .map(|(_, e)| {
                if e.open > 0 {
                    Duration::ZERO
                } else {
                    now.saturating_duration_since(e.last)
                }
            })
            .collect();
        ages.sort_unstable_by(|a, b| b.cmp(a));
        ages.truncate(limit);
        ages
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_balancer::sessions::CookieKeys;

    fn id(text: &str) -> ServerId {
        ServerId::parse(text).expect("an id")
    }

    fn ticket(server: &str, n: u8) -> Ticket {
        CookieKeys::new(b"the table tests' secret", None, None).sign(
            "BALANCE_HTTP",
            id(server),
            [n; 8],
        )
    }

    const MINUTE: Duration = Duration::from_secs(60);

    /// A client of the tests.
    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

    /// `SESSION_TIMEOUT` `timeout`, `HTTP_MAX_SESSIONS` `max`, no cap per client.
    fn limits(timeout: Duration, max: usize) -> Limits {
        Limits {
            timeout,
            max,
            per_client: 0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_expire_after_the_timeout_without_a_request() {
        let mut s = Sessions::new();
        let (a, b) = (ticket("01", 1), ticket("02", 2));
        assert_eq!(
            s.touch(a, CLIENT, Instant::now(), &limits(10 * MINUTE, 10)),
            Touched::New
        );
        tokio::time::advance(5 * MINUTE).await;
        assert_eq!(
            s.touch(b, CLIENT, Instant::now(), &limits(10 * MINUTE, 10)),
            Touched::New
        );
        assert_eq!(
            s.touch(a, CLIENT, Instant::now(), &limits(10 * MINUTE, 10)),
            Touched::Known
        );
        tokio::time::advance(10 * MINUTE - Duration::from_millis(1)).await;
        s.expire(Instant::now(), 10 * MINUTE);
        assert_eq!(s.len(), 2);
        tokio::time::advance(Duration::from_millis(1)).await;
        s.expire(Instant::now(), 10 * MINUTE);
        assert_eq!(s.len(), 0);
        assert_eq!((s.count(id("01")), s.count(id("02"))), (0, 0));
        assert_eq!((s.total(), s.peak()), (2, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_websocket_keeps_its_session_alive() {
        let mut s = Sessions::new();
        let a = ticket("01", 1);
        s.touch(a, CLIENT, Instant::now(), &limits(MINUTE, 10));
        s.opened(a);
        tokio::time::advance(10 * MINUTE).await;
        s.expire(Instant::now(), MINUTE);
        assert_eq!(s.len(), 1, "alive while its WebSocket is open");
        s.closed(a, Instant::now());
        tokio::time::advance(MINUTE - Duration::from_millis(1)).await;
        s.expire(Instant::now(), MINUTE);
        assert_eq!(s.len(), 1, "idle time counts from the WebSocket's end");
        tokio::time::advance(Duration::from_millis(1)).await;
        s.expire(Instant::now(), MINUTE);
        assert!(s.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_forgets_the_oldest_idle_first() {
        let mut s = Sessions::new();
        for n in 0..3 {
            s.touch(ticket("01", n), CLIENT, Instant::now(), &limits(MINUTE, 3));
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // The oldest comes back: the second is now the oldest idle one.
        s.touch(ticket("01", 0), CLIENT, Instant::now(), &limits(MINUTE, 3));
        s.touch(ticket("02", 9), CLIENT, Instant::now(), &limits(MINUTE, 3));
        assert_eq!(s.len(), 3);
        assert_eq!(
            s.touch(ticket("01", 1), CLIENT, Instant::now(), &limits(MINUTE, 3)),
            Touched::New
        );
        assert_eq!(
            s.touch(ticket("01", 0), CLIENT, Instant::now(), &limits(MINUTE, 3)),
            Touched::Known
        );
        assert_eq!((s.count(id("01")), s.count(id("02"))), (2, 1));
        assert_eq!(s.peak(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_past_its_cap_makes_no_session_and_its_count_follows_its_sessions() {
        let mut s = Sessions::new();
        let capped = Limits {
            timeout: MINUTE,
            max: 100,
            per_client: 2,
        };
        let other = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 1));
        let touch =
            |s: &mut Sessions, n, client| s.touch(ticket("01", n), client, Instant::now(), &capped);
        assert_eq!(touch(&mut s, 1, CLIENT), Touched::New);
        assert_eq!(touch(&mut s, 2, CLIENT), Touched::New);
        // A thousand more from the same client: none stored, none counted.
        for n in 3..=200 {
            assert_eq!(touch(&mut s, n, CLIENT), Touched::OverClientCap);
        }
        assert_eq!(
            (s.count(id("01")), s.of_client(CLIENT), s.total()),
            (2, 2, 2)
        );
        // Its live sessions go on; another client is not held back.
        assert_eq!(touch(&mut s, 1, CLIENT), Touched::Known);
        assert_eq!(touch(&mut s, 201, other), Touched::New);
        // One of its sessions ends: room for one more.
        assert!(s.moved(ticket("01", 2)));
        assert_eq!(s.of_client(CLIENT), 1);
        assert_eq!(touch(&mut s, 3, CLIENT), Touched::New);
        // All expire: nothing is left counted for it.
        tokio::time::advance(MINUTE).await;
        s.expire(Instant::now(), MINUTE);
        assert_eq!(
            (s.of_client(CLIENT), s.of_client(other), s.len()),
            (0, 0, 0)
        );
        // No cap: as many as HTTP_MAX_SESSIONS allows.
        for n in 0..50 {
            let limits = limits(MINUTE, 100);
            assert_eq!(
                s.touch(ticket("02", n), CLIENT, Instant::now(), &limits),
                Touched::New
            );
        }
        assert_eq!(s.of_client(CLIENT), 50);
    }

    #[tokio::test(start_paused = true)]
    async fn a_moved_session_is_counted_once() {
        let mut s = Sessions::new();
        let a = ticket("01", 1);
        assert!(!s.moved(a), "not a session yet");
        s.touch(a, CLIENT, Instant::now(), &limits(MINUTE, 10));
        assert!(s.moved(a));
        assert!(!s.moved(a));
        assert_eq!((s.moved_count(), s.len(), s.count(id("01"))), (1, 0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewed_session_keeps_its_age_and_count() {
        let mut s = Sessions::new();
        let (old, new) = (ticket("01", 1), ticket("01", 2));
        s.touch(old, CLIENT, Instant::now(), &limits(MINUTE, 10));
        tokio::time::advance(Duration::from_secs(30)).await;
        s.renew(old, new);
        assert!(!s.knows(old) && s.knows(new));
        assert_eq!((s.len(), s.count(id("01")), s.total()), (1, 1, 1));
        tokio::time::advance(Duration::from_secs(30)).await;
        s.expire(Instant::now(), MINUTE);
        assert!(
            s.is_empty(),
            "its idle time counts from the old cookie's last request"
        );
        s.renew(old, new);
        assert!(s.is_empty(), "no session, nothing renewed");
    }

    #[tokio::test(start_paused = true)]
    async fn ages_are_listed_per_server() {
        let mut s = Sessions::new();
        s.touch(ticket("01", 1), CLIENT, Instant::now(), &limits(MINUTE, 10));
        tokio::time::advance(Duration::from_secs(5)).await;
        s.touch(ticket("01", 2), CLIENT, Instant::now(), &limits(MINUTE, 10));
        s.touch(ticket("02", 3), CLIENT, Instant::now(), &limits(MINUTE, 10));
        assert_eq!(
            s.ages(id("01"), Instant::now(), 10),
            vec![Duration::from_secs(5), Duration::ZERO]
        );
        assert_eq!(s.ages(id("01"), Instant::now(), 1).len(), 1);
        assert_eq!((s.peak_of(id("01")), s.peak_of(id("02"))), (2, 1));
    }
}
