//! The watchdog's judgement, pure: when each worker runtime of a broker last sent its
//! heartbeat, and which have been silent for `WATCHDOG_TIMEOUT`. A stopped process (SIGSTOP,
//! a debugger) silences them all; a deadlocked runtime, its own. The lifeline's reader
//! (`child`) feeds it and acts on its verdict.

use std::time::{Duration, Instant};

/// The most worker runtimes a broker may announce (`WORKERS` goes to 256): a line claiming
/// more is not a broker's and is ignored.
pub const MAX_RUNTIMES: usize = 1024;

/// The heartbeats of one broker that announced them.
#[derive(Debug, Clone)]
pub struct Beats {
    /// When each runtime was last heard from (or the announcement, before its first beat).
    last: Vec<Instant>,
}

impl Beats {
    /// A broker that said, at `now`, it sends heartbeats from `runtimes` runtimes; `None` for
    /// a count no broker would announce.
    pub fn announced(runtimes: usize, now: Instant) -> Option<Beats> {
        (1..=MAX_RUNTIMES).contains(&runtimes).then(|| Beats {
            last: vec![now; runtimes],
        })
    }

    /// Runtime `index` beat at `now`; an index out of range is ignored.
    pub fn beat(&mut self, index: usize, now: Instant) {
        if let Some(last) = self.last.get_mut(index) {
            *last = (*last).max(now);
        }
    }

    /// How many runtimes send heartbeats.
    pub fn runtimes(&self) -> usize {
        self.last.len()
    }

    /// When the runtime heard from longest ago will have been silent for `limit`: the next
    /// moment worth judging at.
    pub fn deadline(&self, limit: Duration) -> Instant {
        let oldest = self.last.iter().min().copied().unwrap_or_else(Instant::now);
        oldest + limit
    }

    /// The runtimes silent for `limit` or longer at `now` (by index); empty while every one
    /// beats.
    pub fn silent(&self, now: Instant, limit: Duration) -> Vec<usize> {
        self.last
            .iter()
            .enumerate()
            .filter(|(_, last)| now.saturating_duration_since(**last) >= limit)
            .map(|(index, _)| index)
            .collect()
    }
}

/// The verdict on a broker whose heartbeats stopped, for the log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Silence {
    /// The broker.
    pub pid: u32,
    /// Its runtimes that went silent.
    pub runtimes: Vec<usize>,
    /// How many it has.
    pub of: usize,
    /// `WATCHDOG_TIMEOUT`.
    pub limit: Duration,
}

impl Silence {
    /// What went silent, in words: `sent no heartbeat for 10s (stopped or hung)`, or which
    /// worker threads did.
    pub fn words(&self) -> String {
        let limit = crate::config::show_duration(self.limit);
        if self.runtimes.len() == self.of {
            return format!("sent no heartbeat for {limit} (stopped, hung or being debugged)");
        }
        let which: Vec<String> = self.runtimes.iter().map(usize::to_string).collect();
        let threads = if self.runtimes.len() == 1 {
            "worker thread"
        } else {
            "worker threads"
        };
        format!(
            "sent no heartbeat from {threads} {} of {} for {limit} (a deadlocked or busy event \
             loop)",
            which.join(", "),
            self.of
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_silent_for_the_limit_is_named_and_the_others_are_not() {
        let start = Instant::now();
        let limit = Duration::from_secs(10);
        let mut beats = Beats::announced(3, start).unwrap();
        assert_eq!(beats.deadline(limit), start + limit);
        assert!(
            beats
                .silent(start + Duration::from_secs(9), limit)
                .is_empty()
        );
        for second in 1..=12 {
            let now = start + Duration::from_secs(second);
            beats.beat(0, now);
            beats.beat(2, now);
        }
        // Runtime 1 never beat: silent since the announcement.
        let at = start + Duration::from_secs(12);
        assert_eq!(beats.silent(at, limit), [1]);
        assert_eq!(beats.deadline(limit), start + limit);
        // It comes back: nothing is silent, and the next look is due when the oldest ages.
        beats.beat(1, at);
        assert!(beats.silent(at, limit).is_empty());
        assert_eq!(beats.deadline(limit), at + limit);
        // A beat from a runtime it does not have changes nothing; a beat from the past
        // does not move one back.
        beats.beat(7, at);
        beats.beat(1, start);
        assert_eq!(beats.deadline(limit), at + limit);
    }

    #[test]
    fn every_runtime_silent_reads_as_stopped_and_only_real_counts_are_announced() {
        let start = Instant::now();
        let limit = Duration::from_secs(2);
        let beats = Beats::announced(2, start).unwrap();
        let silence = Silence {
            pid: 42,
            runtimes: beats.silent(start + limit, limit),
            of: beats.runtimes(),
            limit,
        };
        assert_eq!(
            silence.words(),
            "sent no heartbeat for 2s (stopped, hung or being debugged)"
        );
        let one = Silence {
            runtimes: vec![1],
            of: 4,
            ..silence
        };
        assert!(
            one.words().contains("worker thread 1 of 4 for 2s"),
            "{}",
            one.words()
        );
        assert!(Beats::announced(0, start).is_none());
        assert!(Beats::announced(MAX_RUNTIMES + 1, start).is_none());
    }
}
