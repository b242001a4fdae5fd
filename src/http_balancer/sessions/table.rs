//! The table of live HTTP sessions: a value becomes a session when a request
//! brings it back; the table only counts and ages sessions (the cookie alone decides where a
//! request goes), so a session it forgot keeps its affinity. Only signed values reach it.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::ticket::Ticket;
use crate::config::ServerId;

/// What the table knows of one session.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Its last request (or the end of its last WebSocket).
    last: Instant,
    /// WebSocket connections open now: the session does not expire while any is.
    open: u32,
}

/// What [`Sessions::touch`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched {
    /// The value came back for the first time (or after it was forgotten): a new session.
    New,
    /// A live session.
    Known,
}

/// The live sessions of one balancer: expiry after `timeout` without a request (not while a
/// WebSocket of it is open), at most `max` (the oldest idle forgotten first), counts per
/// server. Expiry is applied lazily, at each call, in order of age.
#[derive(Debug)]
pub struct Sessions {
    entries: HashMap<Ticket, Entry>,
    /// Idle sessions by last request, oldest first (sessions with an open WebSocket are not
    /// here: they cannot expire or be evicted).
    idle: BTreeSet<(Instant, Ticket)>,
    /// Live sessions per server, and the most at once.
    per_server: HashMap<ServerId, (u64, u64)>,
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
            entries: HashMap::new(),
            idle: BTreeSet::new(),
            per_server: HashMap::new(),
            total: 0,
            peak: 0,
            moved: 0,
        }
    }

    /// A request brought `ticket` back at `now`: its session is refreshed, or made (the
    /// oldest idle ones forgotten to stay within `max`).
    pub fn touch(
        &mut self,
        ticket: Ticket,
        now: Instant,
        timeout: Duration,
        max: usize,
    ) -> Touched {
        self.expire(now, timeout);
        if let Some(entry) = self.entries.get_mut(&ticket) {
            if entry.open == 0 {
                self.idle.remove(&(entry.last, ticket));
                self.idle.insert((now, ticket));
            }
            entry.last = now;
            return Touched::Known;
        }
        if max == 0 {
            return Touched::New;
        }
        while self.entries.len() >= max {
            let Some((_, oldest)) = self.idle.pop_first() else {
                // Every session has a WebSocket open: none may be forgotten.
                return Touched::New;
            };
            self.forget(oldest);
        }
        self.entries.insert(ticket, Entry { last: now, open: 0 });
        self.idle.insert((now, ticket));
        let (live, peak) = self.per_server.entry(ticket.server).or_default();
        *live += 1;
        *peak = (*peak).max(*live);
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

    /// Removes `ticket` from the entries and its server's count (not from `idle`).
    fn forget(&mut self, ticket: Ticket) {
        if self.entries.remove(&ticket).is_some()
            && let Some((live, _)) = self.per_server.get_mut(&ticket.server)
        {
            *live = live.saturating_sub(1);
        }
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
        CookieKeys::new(b"the table tests' secret", None, None).sign(id(server), [n; 8])
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn sessions_expire_after_the_timeout_without_a_request() {
        let mut s = Sessions::new();
        let (a, b) = (ticket("01", 1), ticket("02", 2));
        assert_eq!(s.touch(a, Instant::now(), 10 * MINUTE, 10), Touched::New);
        tokio::time::advance(5 * MINUTE).await;
        assert_eq!(s.touch(b, Instant::now(), 10 * MINUTE, 10), Touched::New);
        assert_eq!(s.touch(a, Instant::now(), 10 * MINUTE, 10), Touched::Known);
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
        s.touch(a, Instant::now(), MINUTE, 10);
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
            s.touch(ticket("01", n), Instant::now(), MINUTE, 3);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // The oldest comes back: the second is now the oldest idle one.
        s.touch(ticket("01", 0), Instant::now(), MINUTE, 3);
        s.touch(ticket("02", 9), Instant::now(), MINUTE, 3);
        assert_eq!(s.len(), 3);
        assert_eq!(
            s.touch(ticket("01", 1), Instant::now(), MINUTE, 3),
            Touched::New
        );
        assert_eq!(
            s.touch(ticket("01", 0), Instant::now(), MINUTE, 3),
            Touched::Known
        );
        assert_eq!((s.count(id("01")), s.count(id("02"))), (2, 1));
        assert_eq!(s.peak(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_moved_session_is_counted_once() {
        let mut s = Sessions::new();
        let a = ticket("01", 1);
        assert!(!s.moved(a), "not a session yet");
        s.touch(a, Instant::now(), MINUTE, 10);
        assert!(s.moved(a));
        assert!(!s.moved(a));
        assert_eq!((s.moved_count(), s.len(), s.count(id("01"))), (1, 0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewed_session_keeps_its_age_and_count() {
        let mut s = Sessions::new();
        let (old, new) = (ticket("01", 1), ticket("01", 2));
        s.touch(old, Instant::now(), MINUTE, 10);
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
        s.touch(ticket("01", 1), Instant::now(), MINUTE, 10);
        tokio::time::advance(Duration::from_secs(5)).await;
        s.touch(ticket("01", 2), Instant::now(), MINUTE, 10);
        s.touch(ticket("02", 3), Instant::now(), MINUTE, 10);
        assert_eq!(
            s.ages(id("01"), Instant::now(), 10),
            vec![Duration::from_secs(5), Duration::ZERO]
        );
        assert_eq!(s.ages(id("01"), Instant::now(), 1).len(), 1);
        assert_eq!((s.peak_of(id("01")), s.peak_of(id("02"))), (2, 1));
    }
}
