//! `MAX_CONNECTIONS_PER_CLIENT` as pure logic: the connections each client address has open,
//! whether one more is admitted, and the episodes of refusals to log (one line when a client's
//! refusals start, one when they are over, not one per connection). The caller gives the
//! limit (read from its generation, so a reload applies at the next connection) and the time;
//! nothing here reads a clock, logs or locks, so either engine (a TCP balancer closes the
//! connection, an HTTP one answers 503) can use it behind its own lock.
//!
//! Memory is bounded by the connections open: an address is forgotten when its last
//! connection closes (its episode, if any, ends then), and the table gives back the room a
//! burst of clients took once they have gone.

use std::collections::HashMap;
use std::net::IpAddr;

/// How long a client must go without a refusal before an admission ends its episode: at the
/// edge of its limit, admissions and refusals alternate, and each alternation is not an
/// episode of its own (as [`crate::support::throttle::Episode`]).
pub const QUIET_MS: u64 = 1000;

/// The fewest entries the table keeps room for, however few clients remain: below this,
/// giving room back is not worth its reallocation.
const KEPT_ROOM: usize = 64;

/// One client address's connections and refusals.
#[derive(Debug, Clone, Copy, Default)]
struct ClientEntry {
    /// Connections admitted and not yet released.
    open: u32,
    /// Connections refused since its episode began (0: none running).
    refused: u64,
    /// When the last was refused, on the caller's clock.
    last_refused_ms: u64,
    /// Refused connections being answered (an HTTP 503 waits for their first head), until
    /// [`ClientCounts::answered`].
    answering: u32,
}

/// What became of a connection asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Admitted: count it until [`ClientCounts::release`]. `episode_over`: the refusals of
    /// an episode this admission ends (log that the client is served again).
    Admitted {
        /// Refusals of the episode that ended, if one did.
        episode_over: Option<u64>,
    },
    /// Refused: the client has `open` connections, at least the limit.
    Refused {
        /// The client's connections open now.
        open: u32,
        /// True for the refusal that starts an episode (log it).
        first: bool,
    },
}

/// The connections open per client address, for one balancer (or one shard of it).
#[derive(Debug, Default)]
pub struct ClientCounts {
    entries: HashMap<IpAddr, ClientEntry>,
}

/// A client's address as counted: an IPv4 client seen as IPv4-mapped IPv6 (on a `::`
/// listener) is the same client as over IPv4.
fn key(client: IpAddr) -> IpAddr {
    client.to_canonical()
}

impl ClientCounts {
    /// Asks for one more connection of `client` under `limit` (at least 1) at `now_ms`.
    pub fn admit(&mut self, client: IpAddr, limit: u32, now_ms: u64) -> Decision {
        let entry = self.entries.entry(key(client)).or_default();
        if entry.open >= limit {
            entry.refused += 1;
            entry.last_refused_ms = now_ms;
            return Decision::Refused {
                open: entry.open,
                first: entry.refused == 1,
            };
        }
        entry.open += 1;
        let quiet = now_ms.saturating_sub(entry.last_refused_ms) >= QUIET_MS;
        let episode_over = (entry.refused > 0 && quiet).then(|| std::mem::take(&mut entry.refused));
        Decision::Admitted { episode_over }
    }

    /// Gives back a connection [`ClientCounts::admit`] admitted. Returns the refusals of an
    /// episode that ends because the client's last connection closed.
    pub fn release(&mut self, client: IpAddr) -> Option<u64> {
        let client = key(client);
        let entry = self.entries.get_mut(&client)?;
        entry.open = entry.open.saturating_sub(1);
        self.forget_if_gone(client)
    }

    /// A connection of `client` just refused is to be answered (an HTTP 503 said once its
    /// first head comes), holding nothing a client needs: true while fewer than `most` of the
    /// client's are answered now, counted until [`ClientCounts::answered`]; false: close it at
    /// once, so the refusals of one client never pile up.
    pub fn answer_refusal(&mut self, client: IpAddr, most: u32) -> bool {
        let Some(entry) = self.entries.get_mut(&key(client)) else {
            return false;
        };
        if entry.answering >= most {
            return false;
        }
        entry.answering += 1;
        true
    }

    /// A refusal [`ClientCounts::answer_refusal`] counted was answered (or given up).
    pub fn answered(&mut self, client: IpAddr) -> Option<u64> {
        let client = key(client);
        let entry = self.entries.get_mut(&client)?;
        entry.answering = entry.answering.saturating_sub(1);
        self.forget_if_gone(client)
    }

    /// Forgets `client` (the key) once nothing of it is counted: its episode's refusals, if
    /// one ran.
    fn forget_if_gone(&mut self, client: IpAddr) -> Option<u64> {
        let entry = self.entries.get(&client)?;
        if entry.open > 0 || entry.answering > 0 {
            return None;
        }
        let refused = self.entries.remove(&client).map_or(0, |e| e.refused);
        let room = self.entries.capacity();
        if room > KEPT_ROOM * 2 && self.entries.len() * 4 < room {
            self.entries
                .shrink_to((self.entries.len() * 2).max(KEPT_ROOM));
        }
        (refused > 0).then_some(refused)
    }

    /// The connections `client` has open now.
    pub fn open(&self, client: IpAddr) -> u32 {
        self.entries.get(&key(client)).map_or(0, |e| e.open)
    }

    /// Client addresses with connections open now.
    pub fn clients(&self) -> usize {
        self.entries.len()
    }

    /// The entries the table has room for (what its memory holds).
    pub fn room(&self) -> usize {
        self.entries.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn past_the_limit_a_client_is_refused_and_others_are_not() {
        let mut counts = ClientCounts::default();
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        for _ in 0..3 {
            assert_eq!(
                counts.admit(a, 3, 0),
                Decision::Admitted { episode_over: None }
            );
        }
        assert_eq!(
            counts.admit(a, 3, 10),
            Decision::Refused {
                open: 3,
                first: true
            }
        );
        assert_eq!(
            counts.admit(a, 3, 20),
            Decision::Refused {
                open: 3,
                first: false
            }
        );
        assert_eq!(
            counts.admit(b, 3, 20),
            Decision::Admitted { episode_over: None }
        );
        assert_eq!((counts.open(a), counts.open(b)), (3, 1));
    }

    #[test]
    fn an_episode_ends_with_its_count_once_quiet_or_when_the_client_leaves() {
        let mut counts = ClientCounts::default();
        let a = ip("10.0.0.1");
        counts.admit(a, 1, 0);
        assert!(matches!(
            counts.admit(a, 1, 100),
            Decision::Refused { first: true, .. }
        ));
        assert_eq!(counts.release(a), Some(1), "its last connection closed");
        assert_eq!(counts.clients(), 0, "forgotten");
        // At the edge: one closes, another is admitted within the quiet second.
        counts.admit(a, 2, 1000);
        counts.admit(a, 2, 1000);
        assert!(matches!(
            counts.admit(a, 2, 1100),
            Decision::Refused { first: true, .. }
        ));
        assert_eq!(counts.release(a), None);
        assert_eq!(
            counts.admit(a, 2, 1500),
            Decision::Admitted { episode_over: None },
            "not quiet for a second yet"
        );
        assert!(matches!(
            counts.admit(a, 2, 1600),
            Decision::Refused { first: false, .. }
        ));
        assert_eq!(counts.release(a), None);
        assert_eq!(
            counts.admit(a, 2, 2600),
            Decision::Admitted {
                episode_over: Some(2)
            }
        );
    }

    #[test]
    fn a_client_has_a_few_refusals_answered_at_once_and_is_remembered_meanwhile() {
        let mut counts = ClientCounts::default();
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        assert!(
            !counts.answer_refusal(b, 8),
            "a client with nothing counted"
        );
        counts.admit(a, 1, 0);
        for n in 0..8 {
            assert!(counts.answer_refusal(a, 8), "refusal {n}");
        }
        assert!(!counts.answer_refusal(a, 8), "the ninth is closed at once");
        assert_eq!(counts.release(a), None, "its refusals are being answered");
        assert_eq!(counts.clients(), 1);
        for _ in 0..7 {
            assert_eq!(counts.answered(a), None);
        }
        assert!(counts.answer_refusal(a, 8), "room again");
        assert_eq!(counts.answered(a), None);
        assert_eq!(counts.answered(a), None);
        assert_eq!(
            counts.clients(),
            0,
            "forgotten with its last refusal answered"
        );
    }

    #[test]
    fn an_ipv4_client_is_one_client_over_ipv4_and_mapped_ipv6() {
        let mut counts = ClientCounts::default();
        counts.admit(ip("192.0.2.7"), 1, 0);
        assert!(matches!(
            counts.admit(ip("::ffff:192.0.2.7"), 1, 0),
            Decision::Refused { open: 1, .. }
        ));
        assert_eq!(counts.release(ip("::ffff:192.0.2.7")), Some(1));
        assert_eq!(counts.clients(), 0);
    }

    #[test]
    fn memory_follows_the_clients_connected() {
        let mut counts = ClientCounts::default();
        let clients: Vec<IpAddr> = (0..10_000u32)
            .map(|n| IpAddr::from(n.to_be_bytes()))
            .collect();
        for &client in &clients {
            counts.admit(client, 1, 0);
        }
        assert_eq!(counts.clients(), 10_000);
        let burst = counts.room();
        for &client in &clients[..9_990] {
            counts.release(client);
        }
        assert_eq!(counts.clients(), 10);
        assert!(
            counts.room() <= KEPT_ROOM * 2,
            "{} of {burst}",
            counts.room()
        );
        // A release of a client never admitted changes nothing.
        assert_eq!(counts.release(ip("10.9.9.9")), None);
        assert_eq!(counts.clients(), 10);
    }
}
