//! Failed sign-ins, throttled per address: the first [`FREE`] in a minute are answered at
//! once (every attempt counts as a failure until it succeeds, so a burst in parallel is
//! counted as it arrives), then each further attempt from that address waits its turn, one every
//! [`step`] (growing with the failures, up to [`LONGEST_STEP`]), before its password is even
//! checked; past [`MOST_WAIT`] of turns queued it is refused at once, unchecked. The answer
//! stays what it would be (401): only its time changes. Addresses are counted apart (an IPv6
//! address by its /64, which one host holds whole), so an attacker slows only themself and the
//! user signs in from anywhere else; the table is bounded ([`MOST_ADDRESSES`]): past it, every
//! address it has no room for is counted under one shared entry, throttled from its first
//! attempt, so an attacker with more addresses than that (an IPv6 /48 holds 65,536 /64s)
//! reserves turns and is refused past [`MOST_WAIT`] as one address would be. Each episode is
//! logged once, when it starts.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

/// Failures from one address answered without delay in a [`WINDOW`]: a person mistyping.
pub(super) const FREE: u32 = 5;

/// The window failures are counted in.
const WINDOW: Duration = Duration::from_secs(60);

/// The longest step between two attempts of a throttled address: a guess every 8 seconds is
/// ten thousand a day, where bcrypt alone would allow millions.
const LONGEST_STEP: Duration = Duration::from_secs(8);

/// The longest an attempt may wait for its turn; more queued than that is refused at once
/// (the attacker's own parallel attempts, which would otherwise queue without end). Within a
/// browser's or a script's patience for an answer.
const MOST_WAIT: Duration = Duration::from_secs(10);

/// Addresses remembered at once; past it those whose window is over are forgotten, then the
/// table refuses to grow (a new address is then counted under [`FailureKey::Overflow`], throttled
/// from its first failure).
const MOST_ADDRESSES: usize = 4096;

/// One address's failures.
#[derive(Debug, Clone, Copy)]
struct Failures {
    /// When its window began.
    since: Instant,
    /// Failures in it.
    count: u32,
    /// When its next attempt may be checked.
    next: Instant,
}

impl Failures {
    /// Whether its episode is over at `now`: a [`WINDOW`] without attempts, its last turn
    /// past.
    fn over(&self, now: Instant) -> bool {
        now.duration_since(self.since) >= WINDOW && self.next <= now
    }
}

/// What an attempt from an address may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// Be checked after this wait (zero while the address is under [`FREE`]).
    After(Duration),
    /// Be refused at once, unchecked: too many of its attempts wait already.
    Refused,
}

/// The throttle of failed sign-ins.
#[derive(Debug, Default)]
pub(super) struct SignInThrottle {
    table: Mutex<HashMap<FailureKey, Failures>>,
    /// The addresses users signed in from lately, the latest last.
    good: Mutex<VecDeque<IpAddr>>,
}

/// Addresses users signed in from remembered: a team's workstations, with room to spare;
/// past it the oldest is forgotten.
const SIGNED_IN_FROM: usize = 64;

/// What an attempt's failures are counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum FailureKey {
    /// Its address (an IPv6 one by its /64).
    Address(IpAddr),
    /// Every address the full table has no room for, together: one more entry past
    /// [`MOST_ADDRESSES`].
    Overflow,
}

/// The step between attempts after `count` failures: a second at the first past [`FREE`],
/// doubling with each up to [`LONGEST_STEP`].
fn step(count: u32) -> Duration {
    let over = count.saturating_sub(FREE).min(8);
    Duration::from_millis(500 << over).min(LONGEST_STEP)
}

/// The address an attempt is counted under: IPv6 by its /64.
fn counted_as(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        IpAddr::V6(v6) => IpAddr::V4(
            v6.to_ipv4_mapped()
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
        ),
        v4 => v4,
    }
}

impl SignInThrottle {
    /// The turn of a sign-in from `ip` now, counted (as a failure until
    /// [`SignInThrottle::succeeded`] says otherwise); the first of an episode's throttled attempts
    /// is logged. When the table is full of addresses still counted, a new one is throttled
    /// from its first attempt.
    pub(super) fn turn(&self, ip: IpAddr) -> Turn {
        let now = Instant::now();
        let mut key = FailureKey::Address(counted_as(ip));
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let over = |f: &Failures| f.over(now);
        if table.len() >= MOST_ADDRESSES && !table.contains_key(&key) {
            table.retain(|_, f| !over(f));
            if table.len() >= MOST_ADDRESSES {
                key = FailureKey::Overflow;
            }
        }
        // The overflow's attempts come from addresses it knows nothing of: none goes free.
        let fresh = Failures {
            since: now,
            count: if key == FailureKey::Overflow { FREE } else { 0 },
            next: now,
        };
        let failures = table.entry(key).or_insert(fresh);
        if over(failures) {
            *failures = fresh;
        }
        failures.count = failures.count.saturating_add(1);
        if failures.count <= FREE {
            return Turn::After(Duration::ZERO);
        }
        if failures.count == FREE + 1 {
            log_episode(key);
        }
        // Its turn comes a step after the last one reserved (or after now).
        let at = failures.next.max(now) + step(failures.count);
        let wait = at - now;
        if wait > MOST_WAIT {
            return Turn::Refused;
        }
        failures.next = at;
        // The episode lasts while the attempts come.
        failures.since = now;
        Turn::After(wait)
    }

    /// Whether a user signed in from `ip` (by its /64) lately: its sign-in may take a place
    /// kept for such addresses, which no flood's address can have without a password.
    pub(super) fn signed_in_from(&self, ip: IpAddr) -> bool {
        let good = self.good.lock().unwrap_or_else(|p| p.into_inner());
        good.contains(&counted_as(ip))
    }

    /// A sign-in from `ip` succeeded: its failures are forgotten.
    pub(super) fn succeeded(&self, ip: IpAddr) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.remove(&FailureKey::Address(counted_as(ip)));
        drop(table);
        let mut good = self.good.lock().unwrap_or_else(|p| p.into_inner());
        let ip = counted_as(ip);
        good.retain(|&known| known != ip);
        good.push_back(ip);
        if good.len() > SIGNED_IN_FROM {
            good.pop_front();
        }
    }
}

/// The start of an episode of `key`'s, logged (once: its attempts are slowed from now on).
fn log_episode(key: FailureKey) {
    match key {
        FailureKey::Address(ip) => warn!(
            client = %ip,
            "ADMIN: more than {FREE} failed sign-ins from {ip} within a minute; its further \
             attempts are slowed (one every few seconds) until it stops for a minute; sign-ins \
             from other addresses are not"
        ),
        FailureKey::Overflow => warn!(
            "ADMIN: failed sign-ins from more than {MOST_ADDRESSES} addresses within a minute; \
             those from addresses past them are slowed together (one every few seconds) until \
             they stop for a minute; a signed-in browser is not"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[tokio::test(start_paused = true)]
    async fn the_first_five_go_free_then_each_waits_its_turn_and_others_do_not() {
        let throttle = SignInThrottle::default();
        for _ in 0..FREE {
            assert_eq!(throttle.turn(A), Turn::After(Duration::ZERO));
        }
        // Queued one after the other: attempts in parallel do not go faster.
        let first = throttle.turn(A);
        let second = throttle.turn(A);
        assert_eq!(first, Turn::After(Duration::from_secs(1)));
        assert_eq!(second, Turn::After(Duration::from_secs(3)));
        let mut refused = false;
        for _ in 0..100 {
            refused |= throttle.turn(A) == Turn::Refused;
        }
        assert!(refused, "queued turns are bounded");
        assert_eq!(throttle.turn(B), Turn::After(Duration::ZERO));
        // A minute of silence past its last turn ends the episode.
        tokio::time::advance(MOST_WAIT + WINDOW + Duration::from_secs(1)).await;
        assert_eq!(throttle.turn(A), Turn::After(Duration::ZERO));
        // A success forgets the address's count.
        for _ in 0..10 {
            throttle.turn(B);
        }
        assert!(!throttle.signed_in_from(B));
        throttle.succeeded(B);
        assert_eq!(throttle.turn(B), Turn::After(Duration::ZERO));
        // Remembered as an address users sign in from, a bounded few.
        assert!(throttle.signed_in_from(B) && !throttle.signed_in_from(A));
        for n in 0..SIGNED_IN_FROM {
            throttle.succeeded(IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + n as u32)));
        }
        assert!(!throttle.signed_in_from(B));
    }

    #[tokio::test(start_paused = true)]
    async fn past_a_full_table_new_addresses_share_one_entry_and_are_refused_past_its_wait() {
        let throttle = SignInThrottle::default();
        let address = |n: usize| IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + n as u32));
        for n in 0..MOST_ADDRESSES {
            assert_eq!(throttle.turn(address(n)), Turn::After(Duration::ZERO));
        }
        // New addresses, one attempt each: they reserve turns together, none free, and the
        // queue is bounded as one address's is.
        let turns: Vec<Turn> = (0..5)
            .map(|n| throttle.turn(address(MOST_ADDRESSES + n)))
            .collect();
        assert_eq!(turns[0], Turn::After(Duration::from_secs(1)));
        assert_eq!(turns[1], Turn::After(Duration::from_secs(3)));
        assert_eq!(turns[4], Turn::Refused, "{turns:?}");
        // An address the table holds is still counted on its own.
        assert_eq!(throttle.turn(address(0)), Turn::After(Duration::ZERO));
        // Once their windows are over, a new address has an entry of its own again.
        tokio::time::advance(MOST_WAIT + WINDOW + Duration::from_secs(1)).await;
        let late = address(MOST_ADDRESSES + 9);
        assert_eq!(throttle.turn(late), Turn::After(Duration::ZERO));
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_slash_64() {
        let one: IpAddr = "2001:db8::1".parse().expect("ip");
        let other: IpAddr = "2001:db8::ffff:2".parse().expect("ip");
        assert_eq!(counted_as(one), counted_as(other));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
        assert_eq!(counted_as(mapped), A);
    }
}
