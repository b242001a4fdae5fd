//! A log line that could repeat for every client (an outage, a limit reached) is written at
//! most once per period, with the count of those left out since the last one.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::clock::wall_ms;

/// At most one line per `period_ms`.
#[derive(Debug)]
pub struct Throttle {
    period_ms: u64,
    /// Wall ms of the last line written (0: never).
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
        let now = wall_ms();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_with_the_count_left_out() {
        let throttle = Throttle::new(60_000);
        assert_eq!(throttle.allow(), Some(0));
        assert_eq!(throttle.allow(), None);
        assert_eq!(throttle.allow(), None);
        throttle.last_ms.store(1, Relaxed); // as if the period had passed
        assert_eq!(throttle.allow(), Some(2));
    }
}
