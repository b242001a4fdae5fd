//! Log lines that could repeat for every client: a [`Throttle`] writes one at most once per
//! period, with the count of those left out; an [`Episode`] writes one when a condition starts
//! and one when it ends.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::support::clock::monotonic_ms;

/// At most one line per `period_ms`.
#[derive(Debug)]
pub struct Throttle {
    period_ms: u64,
    /// [`monotonic_ms`] of the last line written (0: never).
    last_ms: AtomicU64,
    /// Lines left out since the last one written.
    skipped: AtomicU64,
}

impl Throttle {
    /// A throttle letting one line through per `period_ms`.
    pub const fn new(period_ms: u64) -> Self {
        Throttle {
            period_ms,
            last_ms: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// `Some(left out since the last line)` when a line may be written now, else `None`.
    pub fn allow(&self) -> Option<u64> {
        let now = monotonic_ms();
        let last = self.last_ms.load(Relaxed);
        if last != 0 && now.saturating_sub(last) < self.period_ms {
            self.skipped.fetch_add(1, Relaxed);
            return None;
        }
        // Of several callers at the same instant, only the one that moves `last_ms` writes.
        if self
            .last_ms
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_err()
        {
            self.skipped.fetch_add(1, Relaxed);
            return None;
        }
        Some(self.skipped.swap(0, Relaxed))
    }
}

/// A condition that lasts a while (the limit reached, out of descriptors): logged when it
/// starts and when it ends, with how often it struck in between, instead of once per client.
/// It ends only after a quiet second: at the edge of a limit, successes and failures
/// alternate, and each alternation is not an episode of its own.
#[derive(Debug, Default)]
pub struct Episode {
    /// Strikes since the episode started (0: none running).
    strikes: AtomicU64,
    /// [`monotonic_ms`] of the last strike.
    last_strike_ms: AtomicU64,
}

/// How long an episode must go without a strike before a success ends it.
const QUIET_MS: u64 = 1000;

impl Episode {
    /// Counts a strike; true for the one that starts an episode (log it).
    pub fn strike(&self) -> bool {
        self.last_strike_ms.store(monotonic_ms(), Relaxed);
        self.strikes.fetch_add(1, Relaxed) == 0
    }

    /// A success: ends the episode when one runs and has been quiet for a second, returning
    /// `Some(strikes)` to log the recovery.
    pub fn end(&self) -> Option<u64> {
        // Read first: this runs for every client, and a write would bounce the cache line
        // between cores for nothing.
        if self.strikes.load(Relaxed) == 0
            || monotonic_ms().saturating_sub(self.last_strike_ms.load(Relaxed)) < QUIET_MS
        {
            return None;
        }
        Some(self.strikes.swap(0, Relaxed)).filter(|&n| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_period_with_the_count_left_out() {
        let throttle = Throttle::new(60_000);
        assert_eq!(throttle.allow(), Some(0));
        assert_eq!(throttle.allow(), None);
        assert_eq!(throttle.allow(), None);
        tokio::time::advance(std::time::Duration::from_secs(59)).await;
        assert_eq!(throttle.allow(), None);
        tokio::time::advance(std::time::Duration::from_secs(2)).await;
        assert_eq!(throttle.allow(), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn an_episode_is_logged_when_it_starts_and_ends_after_a_quiet_second() {
        let episode = Episode::default();
        assert_eq!(episode.end(), None);
        assert!(episode.strike());
        assert!(!episode.strike());
        assert_eq!(
            episode.end(),
            None,
            "a success right after a strike does not end it"
        );
        assert!(!episode.strike(), "still the same episode");
        tokio::time::advance(std::time::Duration::from_millis(900)).await;
        assert_eq!(episode.end(), None, "not quiet for a second yet");
        tokio::time::advance(std::time::Duration::from_millis(200)).await;
        assert_eq!(episode.end(), Some(3));
        assert_eq!(episode.end(), None);
        assert!(episode.strike(), "a new episode");
    }
}
