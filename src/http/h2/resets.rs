//! Streams a client resets on one connection, counted over the last ten seconds: the rapid
//! reset attack (CVE-2023-44487) opens and cancels streams in a loop, each one making the
//! broker start a request, while the concurrent-stream limit never binds. The `h2` crate
//! bounds only the streams reset before they are accepted; this counts every stream the
//! client reset before its answer was whole, whenever it did. Past [`MOST_RESETS`] within
//! [`WINDOW_SECONDS`], the connection ends with `GOAWAY ENHANCE_YOUR_CALM`. A browser
//! cancelling a few dozen requests as its user navigates away is far below it.
//!
//! Ten one-second buckets: 20 bytes per connection, exact to the second.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use tokio::time::Instant;

/// Resets within [`WINDOW_SECONDS`] that a connection may make; one more ends it (nginx and
/// HAProxy's mitigations count on the same order).
pub(super) const MOST_RESETS: u32 = 1000;

/// The window the resets are counted over.
pub(super) const WINDOW_SECONDS: u64 = 10;

/// What a connection's streams tell it.
#[derive(Debug, Default)]
pub(crate) struct ResetTally {
    /// Streams the client reset before their answer was whole, not yet counted in [`Resets`].
    resets: AtomicU32,
}

impl ResetTally {
    /// One more stream reset by the client.
    pub(super) fn reset_by_client(&self) {
        self.resets.fetch_add(1, Relaxed);
    }

    /// The streams reset since last taken.
    pub(super) fn take(&self) -> u32 {
        self.resets.swap(0, Relaxed)
    }
}

/// A connection's recent resets.
#[derive(Debug)]
pub(super) struct Resets {
    /// When the connection began: seconds are counted from it.
    since: Instant,
    /// The second of the newest bucket.
    newest: u64,
    /// Resets per second, the bucket of second `s` at `s % WINDOW_SECONDS`.
    buckets: [u16; WINDOW_SECONDS as usize],
}

impl Resets {
    /// None yet, counting from `now`.
    pub(super) fn new(now: Instant) -> Resets {
        Resets {
            since: now,
            newest: 0,
            buckets: [0; WINDOW_SECONDS as usize],
        }
    }

    /// `count` more streams reset at `now`: whether the last [`WINDOW_SECONDS`] now hold more
    /// than [`MOST_RESETS`].
    pub(super) fn add(&mut self, now: Instant, count: u32) -> bool {
        let second = now.saturating_duration_since(self.since).as_secs();
        if second > self.newest {
            // The seconds passed since the newest bucket start empty (all of them, after a
            // quiet window).
            let passed = (second - self.newest).min(WINDOW_SECONDS);
            for s in second + 1 - passed..=second {
                self.buckets[(s % WINDOW_SECONDS) as usize] = 0;
            }
            self.newest = second;
        }
        let bucket = &mut self.buckets[(second % WINDOW_SECONDS) as usize];
        *bucket = bucket.saturating_add(u16::try_from(count).unwrap_or(u16::MAX));
        self.total() > MOST_RESETS
    }

    /// The resets within the window.
    fn total(&self) -> u32 {
        self.buckets.iter().map(|&n| u32::from(n)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn more_than_a_thousand_within_ten_seconds_is_too_many() {
        let start = Instant::now();
        let mut resets = Resets::new(start);
        assert!(!resets.add(start, MOST_RESETS));
        assert!(resets.add(start + Duration::from_millis(9_900), 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_browser_cancelling_dozens_now_and_then_is_never_too_many() {
        let start = Instant::now();
        let mut resets = Resets::new(start);
        // 60 cancelled at each navigation, one a second, for an hour.
        for second in 0..3600 {
            let now = start + Duration::from_secs(second);
            assert!(!resets.add(now, 60), "at second {second}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn old_resets_leave_the_window() {
        let start = Instant::now();
        let mut resets = Resets::new(start);
        assert!(!resets.add(start, 900));
        // Ten seconds later the first second's resets are gone.
        assert!(!resets.add(start + Duration::from_secs(10), 900));
        assert!(resets.add(start + Duration::from_secs(11), 101));
        // After a quiet minute, none are left.
        assert!(!resets.add(start + Duration::from_secs(80), 1000));
    }
}
