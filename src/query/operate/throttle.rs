//! Failed sign-ins, throttled per address: the first [`FREE`] in a minute are answered at
//! once (every attempt counts as a failure until it succeeds, so a burst in parallel is
//! counted as it arrives), then each further attempt from that address waits its turn, one every
//! [`step`] (growing with the failures, up to [`LONGEST_STEP`]), before its password is even
//! checked; past [`MOST_WAIT`] of turns queued it is refused at once, unchecked. The answer
//! stays what it would be (401): only its time changes. Addresses are counted apart (an IPv6
//! address by its /64, which one host holds whole), so an attacker slows only themself and the
//! user signs in from anywhere else; the table is bounded ([`MOST_ADDRESSES`]). Each episode
//! is logged once, when it starts.

use std::collections::HashMap;
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
/// table refuses to grow (a new address is then throttled from its first failure).
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
    table: Mutex<HashMap<IpAddr, Failures>>,
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
        let key = counted_as(ip);
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let over = |f: &Failures| now.duration_since(f.since) >= WINDOW && f.next <= now;
        if table.len() >= MOST_ADDRESSES && !table.contains_key(&key) {
            table.retain(|_, f| !over(f));
            if table.len() >= MOST_ADDRESSES {
                return Turn::After(LONGEST_STEP);
            }
        }
        let fresh = Failures {
            since: now,
            count: 0,
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
            warn!(
                client = %key,
                "ADMIN: more than {FREE} failed sign-ins from {key} within a minute; its further \
                 attempts are slowed (one every few seconds) until it stops for a minute; sign-ins \
                 from other addresses are not"
            );
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

    /// A sign-in from `ip` succeeded: its failures are forgotten.
    pub(super) fn succeeded(&self, ip: IpAddr) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.remove(&counted_as(ip));
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
        throttle.succeeded(B);
        assert_eq!(throttle.turn(B), Turn::After(Duration::ZERO));
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
