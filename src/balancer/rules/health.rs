//! Health: each server's quarantine state and check counts, changed only by pure transitions
//! that return what changed. The balancer applies them and writes the log lines; nothing here
//! logs, sleeps or reads a clock (the caller passes [`Now`]).
//!
//! The TOTVS semantics: a server that fails a check, or refuses a client's connection, is put
//! in quarantine until now + `QUARANTINE_TIME` (an existing quarantine has its end moved out);
//! a quarantined server that passes a check is released at once; a quarantine also ends when
//! its time is up. Quarantined servers get no new clients; their connections are left alone.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why a server was put in quarantine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// It failed a monitor check.
    Monitor,
    /// A client's connect to it failed.
    Connect,
    /// Its requests timed out `HTTP_TIMEOUTS_TO_QUARANTINE` times in a row (an HTTP
    /// balancer): it accepts connections but does not answer.
    Timeout,
    /// An operator asked for it (`appbroker ctl quarantine`): checks do not end it.
    Operator,
}

impl Reason {
    /// The word in the quarantine log line.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Monitor => "monitor",
            Reason::Connect => "connect",
            Reason::Timeout => "timeout",
            Reason::Operator => "operator",
        }
    }
}

/// Why a quarantine ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The monitor's checks passed (`MONITOR_RISE` of them in a row).
    CheckPassed,
    /// Every server was quarantined, and a client's connect to this one succeeded.
    ClientConnected,
    /// `QUARANTINE_TIME` ran out.
    TimeUp,
    /// An operator asked for it (`appbroker ctl release`).
    Operator,
}

impl Release {
    /// The words in the release log line and on the server's page.
    pub fn as_str(self) -> &'static str {
        match self {
            Release::CheckPassed => "monitor check passed",
            Release::ClientConnected => "a client connected to it",
            Release::TimeUp => "quarantine time is up",
            Release::Operator => "released by an operator",
        }
    }
}

/// The outcome of one monitor check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// Wall-clock time of the check, ms since the Unix epoch.
    pub at_wall_ms: u64,
    /// How long it took.
    pub duration: Duration,
    /// `None` when it passed, else the error in words.
    pub error: Option<String>,
}

/// One quarantine of a server, for its detail page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineEpisode {
    /// When it started (wall ms).
    pub start_wall_ms: u64,
    /// When it ended (wall ms); `None` while it lasts.
    pub end_wall_ms: Option<u64>,
    /// Why it started.
    pub reason: Reason,
    /// The error that started it, in words.
    pub error: String,
    /// Why it ended.
    pub released: Option<Release>,
}

/// Quarantines kept per server for its detail page.
const HISTORY: usize = 20;

/// The last failure that quarantined a server (or moved its quarantine's end): what, when,
/// who found it, and whether it still stands. Pages show it only while it does: a server
/// that has proved itself since is not shown with an old error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineCause {
    /// The error in words.
    pub words: String,
    /// When it came (wall ms).
    pub at_wall_ms: u64,
    /// Who found it: the monitor, or a client's connect.
    pub found_by: Reason,
    /// True until the server proves itself alive: a monitor check passes, or (for a
    /// client's connect that failed) a client's connect to it succeeds.
    pub current: bool,
}

/// Who asked for an operator's quarantine and why, shown instead of any error while it lasts:
/// a healthy server taken out on purpose must not read as failing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorAsk {
    /// `uid 1000` (the control socket's peer), or who restored it.
    pub by: String,
    /// The operator's reason (`ctl quarantine --reason`); empty when none was given.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl OperatorAsk {
    /// `asked by uid 0`, or `asked by uid 0: AppServer restart`: the quarantine's words in the
    /// log and its history.
    pub fn words(&self) -> String {
        if self.reason.is_empty() {
            format!("asked by {}", self.by)
        } else {
            format!("asked by {}: {}", self.by, self.reason)
        }
    }
}

/// Who asked, without a reason: what `force_quarantine(server, duration, "uid 0")` means.
impl From<&str> for OperatorAsk {
    fn from(by: &str) -> OperatorAsk {
        OperatorAsk {
            by: by.to_string(),
            reason: String::new(),
        }
    }
}

/// What is known of a server's quarantine beyond its deadline, for logs and pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Detail {
    /// When the current quarantine started (wall ms), 0 when not quarantined.
    pub since_wall_ms: u64,
    /// When the current quarantine ends (wall ms), 0 when not quarantined.
    pub until_wall_ms: u64,
    /// Why the current (or last) quarantine started.
    pub reason: Option<Reason>,
    /// The last failure (a check's or a client's connect), and whether it still stands.
    pub last_failure: Option<QuarantineCause>,
    /// Who asked for the current quarantine and why, while an operator's lasts.
    pub asked: Option<OperatorAsk>,
    /// Quarantines started since the broker started.
    pub quarantines: u64,
    /// The last monitor check.
    pub last_check: Option<CheckResult>,
    /// The last quarantines, oldest first.
    pub history: VecDeque<QuarantineEpisode>,
    /// Monitor checks failed in a row (for `MONITOR_FALL`).
    pub fails_in_a_row: u32,
    /// Monitor checks passed in a row since the last failure or quarantine (for `MONITOR_RISE`).
    pub passes_in_a_row: u32,
    /// The current quarantine was asked for by an operator: passing checks and clients'
    /// connects do not end it, only its time or an operator's release.
    pub forced: bool,
}

/// An instant as health records it: on the balancer's monotonic clock (deadlines, which a
/// change of the wall clock must not move) and on the wall clock (what logs and pages show).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The balancer's [`crate::support::clock::Clock`], in ms (never 0).
    pub ms: u64,
    /// Wall-clock ms since the Unix epoch.
    pub wall_ms: u64,
}

/// What a failure did: started a quarantine or moved its end out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quarantined {
    /// A quarantine whose time was up, not yet released, was closed first: this failure
    /// started a new one.
    pub expired_first: bool,
    /// True when this failure started the quarantine; false when it moved its end out.
    pub started: bool,
    /// When the failure came (wall ms): the `start=` of the TOTVS line.
    pub at_wall_ms: u64,
    /// When the quarantine ends now (wall ms).
    pub until_wall_ms: u64,
}

/// A monitor check that failed, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckFailed {
    /// Checks failed in a row, this one included.
    pub in_a_row: u32,
    /// The server was unavailable and its last check had failed the same way: nothing an
    /// operator needs told again.
    pub repeated: bool,
}

/// A server's quarantine state. The deadline is an atomic so selection reads it without a lock;
/// the rest changes rarely and sits behind a small mutex.
#[derive(Debug, Default)]
pub struct Health {
    /// Quarantine end on the balancer's clock, in ms; 0 when not in quarantine.
    until_ms: AtomicU64,
    /// True while the last failure is a client's connect that no connect has overruled yet:
    /// what [`Health::connected`] reads, so a client's connect costs one atomic read, not
    /// the lock.
    connect_failure_stands: AtomicBool,
    detail: Mutex<Detail>,
}

impl Health {
    /// True when the server may get new clients at `now_ms` (no quarantine, or it is over).
    pub fn is_available(&self, now_ms: u64) -> bool {
        let until = self.until_ms.load(Relaxed);
        until == 0 || until <= now_ms
    }

    /// True while an operator's quarantine lasts: no client is sent to it, even when every
    /// other server is quarantined too.
    pub fn is_forced(&self) -> bool {
        self.lock().forced
    }

    /// Why the current (or last) quarantine started.
    pub fn reason(&self) -> Option<Reason> {
        self.lock().reason
    }

    /// True while a quarantine is recorded (it may have run out and await its release).
    pub fn is_quarantined(&self) -> bool {
        self.until_ms.load(Relaxed) != 0
    }

    /// The quarantine deadline on the balancer's clock (0: none).
    pub fn until_ms(&self) -> u64 {
        self.until_ms.load(Relaxed)
    }

    /// While a quarantine is recorded: when it started (wall ms), and whether an operator
    /// asked for it.
    pub fn current(&self) -> Option<(u64, bool)> {
        if !self.is_quarantined() {
            return None;
        }
        // Under the lock, which a release takes to clear both.
        let detail = self.lock();
        (detail.since_wall_ms != 0 && self.is_quarantined())
            .then_some((detail.since_wall_ms, detail.forced))
    }

    /// A copy of the details.
    pub fn detail(&self) -> Detail {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A failure (`reason`, `error` in words): starts a quarantine until now + `duration`, or
    /// moves the end of the running one out. A quarantine whose time is up but that was not
    /// released yet is over: it is closed first, and this failure starts a new one.
    pub fn failed(&self, reason: Reason, error: &str, duration: Duration, now: Now) -> Quarantined {
        let mut detail = self.lock();
        self.quarantine(&mut detail, reason, error, duration, now)
    }

    /// An operator's quarantine (`asked`: who and why) until now + `duration`: as a failure of
    /// reason [`Reason::Operator`], with who asked shown instead of any error while it lasts.
    pub fn forced(&self, asked: OperatorAsk, duration: Duration, now: Now) -> Quarantined {
        let mut detail = self.lock();
        let q = self.quarantine(&mut detail, Reason::Operator, &asked.words(), duration, now);
        detail.asked = Some(asked);
        q
    }

    /// [`Health::failed`] under the lock.
    fn quarantine(
        &self,
        detail: &mut Detail,
        reason: Reason,
        error: &str,
        duration: Duration,
        now: Now,
    ) -> Quarantined {
        let expired_first = self.close(detail, Release::TimeUp, now, true);
        let until_wall_ms = now.wall_ms + duration.as_millis() as u64;
        let started = self.until_ms.load(Relaxed) == 0;
        if started {
            detail.since_wall_ms = now.wall_ms;
            detail.quarantines += 1;
            if detail.history.len() == HISTORY {
                detail.history.pop_front();
            }
            detail.history.push_back(QuarantineEpisode {
                start_wall_ms: now.wall_ms,
                end_wall_ms: None,
                reason,
                error: error.to_string(),
                released: None,
            });
        }
        let mut until_ms = now.ms + duration.as_millis() as u64;
        let mut until_wall_ms = until_wall_ms;
        if reason == Reason::Operator {
            // An operator's word sets the end, sooner or later than a running quarantine's.
            detail.forced = true;
        } else if detail.forced {
            // A failure never shortens what an operator asked for.
            until_ms = until_ms.max(self.until_ms.load(Relaxed));
            until_wall_ms = until_wall_ms.max(detail.until_wall_ms);
        }
        if reason == Reason::Operator || !detail.forced {
            detail.reason = Some(reason);
        }
        detail.until_wall_ms = until_wall_ms;
        // Any failure, a client's included, starts the count to MONITOR_RISE again.
        detail.passes_in_a_row = 0;
        if reason != Reason::Operator {
            detail.last_failure = Some(QuarantineCause {
                words: error.to_string(),
                at_wall_ms: now.wall_ms,
                found_by: reason,
                current: true,
            });
            self.connect_failure_stands
                .store(reason == Reason::Connect, Relaxed);
        }
        self.until_ms.store(until_ms, Relaxed);
        Quarantined {
            expired_first,
            started,
            at_wall_ms: now.wall_ms,
            until_wall_ms,
        }
    }

    /// The server proved itself alive (`why`): ends its quarantine, if it is in one. True when
    /// one ended.
    /// A quarantine an operator asked for ends only by an operator's release (or its time).
    pub fn passed(&self, why: Release, now: Now) -> bool {
        let mut detail = self.lock();
        if detail.forced && why != Release::Operator {
            return false;
        }
        if matches!(why, Release::CheckPassed | Release::ClientConnected) {
            self.proved(&mut detail);
        }
        self.close(&mut detail, why, now, false)
    }

    /// A client's connect to the server succeeded: a client's connect that failed before no
    /// longer stands (a monitor's finding waits for its next check). One atomic read when
    /// nothing stands, as on every connect of a healthy server.
    pub fn connected(&self) {
        if self.connect_failure_stands.swap(false, Relaxed) {
            let mut detail = self.lock();
            if let Some(f) = detail
                .last_failure
                .as_mut()
                .filter(|f| f.found_by == Reason::Connect)
            {
                f.current = false;
            }
        }
    }

    /// The server proved itself alive: its last failure no longer stands.
    fn proved(&self, detail: &mut Detail) {
        self.connect_failure_stands.store(false, Relaxed);
        if let Some(f) = &mut detail.last_failure {
            f.current = false;
        }
    }

    /// Ends the quarantine when its time is up at `now`. True when one ended.
    pub fn expired(&self, now: Now) -> bool {
        let mut detail = self.lock();
        self.close(&mut detail, Release::TimeUp, now, true)
    }

    /// Records a passed monitor check; returns the checks passed in a row.
    pub fn check_passed(&self, check: CheckResult) -> u32 {
        let mut detail = self.lock();
        detail.last_check = Some(check);
        self.proved(&mut detail);
        detail.fails_in_a_row = 0;
        detail.passes_in_a_row = detail.passes_in_a_row.saturating_add(1);
        detail.passes_in_a_row
    }

    /// Records a failed monitor check (its `error` is set) at `now`.
    pub fn check_failed(&self, check: CheckResult, now: Now) -> CheckFailed {
        let mut detail = self.lock();
        let repeated = !self.is_available(now.ms)
            && detail
                .last_check
                .as_ref()
                .is_some_and(|last| last.error == check.error);
        detail.last_check = Some(check);
        detail.passes_in_a_row = 0;
        detail.fails_in_a_row = detail.fails_in_a_row.saturating_add(1);
        CheckFailed {
            in_a_row: detail.fails_in_a_row,
            repeated,
        }
    }

    /// Ends the quarantine, if any, at `now` for `why`; with `only_when_up`, only when its time
    /// is up by then. True when one ended.
    fn close(&self, detail: &mut Detail, why: Release, now: Now, only_when_up: bool) -> bool {
        let until = self.until_ms.load(Relaxed);
        if until == 0 || (only_when_up && until > now.ms) {
            return false;
        }
        self.until_ms.store(0, Relaxed);
        detail.forced = false;
        detail.asked = None;
        detail.since_wall_ms = 0;
        detail.until_wall_ms = 0;
        if let Some(last) = detail
            .history
            .back_mut()
            .filter(|e| e.end_wall_ms.is_none())
        {
            last.end_wall_ms = Some(now.wall_ms);
            last.released = Some(why);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTES_2: Duration = Duration::from_secs(120);

    fn at(seconds: u64) -> Now {
        Now {
            ms: seconds * 1000 + 1,
            wall_ms: 1_800_000_000_000 + seconds * 1000,
        }
    }

    #[test]
    fn quarantine_ends_when_its_time_is_up_or_on_release() {
        let health = Health::default();
        assert!(health.is_available(at(0).ms));
        let q = health.failed(Reason::Monitor, "refused", MINUTES_2, at(0));
        assert!(q.started && !q.expired_first);
        assert_eq!(q.until_wall_ms - q.at_wall_ms, 120_000);
        assert!(!health.is_available(at(0).ms));
        assert!(!health.is_available(at(119).ms));
        assert!(!health.expired(at(119)));
        assert!(health.is_available(at(120).ms));
        assert!(
            health.is_quarantined(),
            "recorded until its release is logged"
        );
        assert!(health.expired(at(120)));
        assert!(!health.is_quarantined());
        assert!(
            !health.passed(Release::CheckPassed, at(121)),
            "nothing left to release"
        );
        let episode = &health.detail().history[0];
        assert_eq!(episode.released, Some(Release::TimeUp));
        assert!(episode.end_wall_ms.is_some());
    }

    #[test]
    fn a_second_failure_moves_the_end_out_and_keeps_the_start() {
        let health = Health::default();
        health.failed(Reason::Monitor, "refused", MINUTES_2, at(0));
        let since = health.detail().since_wall_ms;
        let q = health.failed(Reason::Connect, "timed out", MINUTES_2, at(60));
        assert!(!q.started, "moved out, not started");
        assert!(!health.is_available(at(179).ms), "end moved to 180 s");
        let detail = health.detail();
        assert_eq!(detail.quarantines, 1);
        assert_eq!(detail.since_wall_ms, since);
        assert_eq!(detail.reason, Some(Reason::Connect));
        assert!(health.is_available(at(180).ms));
    }

    #[test]
    fn release_makes_it_available_at_once() {
        let health = Health::default();
        health.failed(Reason::Connect, "refused", MINUTES_2, at(0));
        assert!(health.passed(Release::CheckPassed, at(1)));
        assert!(health.is_available(at(1).ms));
        assert_eq!(health.detail().since_wall_ms, 0);
    }

    #[test]
    fn a_failure_after_the_time_is_up_starts_a_new_quarantine() {
        let health = Health::default();
        health.failed(Reason::Monitor, "refused", MINUTES_2, at(0));
        // Its time is up, the release not yet applied; a client's connect fails.
        let q = health.failed(Reason::Connect, "timed out", MINUTES_2, at(121));
        assert!(q.expired_first && q.started);
        let detail = health.detail();
        assert_eq!(detail.quarantines, 2);
        assert_eq!(detail.history.len(), 2);
        assert_eq!(detail.history[0].released, Some(Release::TimeUp));
        assert_eq!(detail.history[1].reason, Reason::Connect);
        assert!(detail.history[1].end_wall_ms.is_none());
        assert!(!health.is_available(at(121).ms));
    }

    #[test]
    fn checks_count_in_a_row_and_a_failure_restarts_the_rise() {
        let check = |error: Option<&str>| CheckResult {
            at_wall_ms: 0,
            duration: Duration::ZERO,
            error: error.map(str::to_string),
        };
        let health = Health::default();
        assert_eq!(
            health.check_failed(check(Some("refused")), at(0)).in_a_row,
            1
        );
        let second = health.check_failed(check(Some("refused")), at(1));
        assert_eq!(second.in_a_row, 2);
        assert!(!second.repeated, "available: every failure is worth a line");
        health.failed(Reason::Monitor, "refused", MINUTES_2, at(1));
        let third = health.check_failed(check(Some("refused")), at(2));
        assert!(third.repeated, "quarantined, failing the same way");
        assert!(
            !health
                .check_failed(check(Some("timed out")), at(3))
                .repeated,
            "a new cause is told"
        );
        assert_eq!(health.check_passed(check(None)), 1);
        assert_eq!(health.check_passed(check(None)), 2);
        health.failed(Reason::Connect, "refused", MINUTES_2, at(4));
        assert_eq!(
            health.check_passed(check(None)),
            1,
            "a client's failure too"
        );
    }

    #[test]
    fn an_operators_quarantine_outlasts_checks_and_failures_until_released() {
        let health = Health::default();
        let q = health.failed(Reason::Operator, "asked by uid 0", MINUTES_2, at(0));
        assert!(q.started);
        assert!(health.is_forced());
        assert!(
            !health.passed(Release::CheckPassed, at(1)),
            "checks do not end it"
        );
        assert!(!health.passed(Release::ClientConnected, at(1)));
        // A failure with a shorter end leaves the operator's end alone.
        health.failed(Reason::Monitor, "refused", Duration::from_secs(10), at(5));
        assert!(!health.is_available(at(119).ms));
        assert_eq!(health.detail().reason, Some(Reason::Operator));
        assert!(health.passed(Release::Operator, at(20)));
        assert!(!health.is_forced() && health.is_available(at(20).ms));
        // And once over, an ordinary quarantine ends with checks again.
        health.failed(Reason::Monitor, "refused", MINUTES_2, at(30));
        assert!(health.passed(Release::CheckPassed, at(31)));
    }

    #[test]
    fn an_operators_quarantine_ends_when_its_time_is_up() {
        let health = Health::default();
        health.failed(Reason::Operator, "asked", Duration::from_secs(30), at(0));
        assert!(!health.expired(at(29)));
        assert!(health.expired(at(30)));
        assert!(!health.is_forced());
    }

    #[test]
    fn a_failure_stands_until_the_server_proves_itself() {
        let stands = |h: &Health| h.detail().last_failure.map(|f| (f.words, f.current));
        let check = |error: Option<&str>| CheckResult {
            at_wall_ms: 0,
            duration: Duration::ZERO,
            error: error.map(str::to_string),
        };
        // A client's connect failed; the quarantine's time ran out with nothing proved.
        let health = Health::default();
        health.failed(Reason::Connect, "refused", MINUTES_2, at(0));
        assert!(health.expired(at(120)));
        let failure = health.detail().last_failure.expect("kept");
        assert_eq!((failure.at_wall_ms, failure.current), (at(0).wall_ms, true));
        // A client's connect succeeds: that is what failed, so it no longer stands.
        health.connected();
        assert_eq!(stands(&health), Some(("refused".into(), false)));
        // The monitor's finding is not overruled by a connect, only by a check.
        health.failed(Reason::Monitor, "unexpected reply", MINUTES_2, at(200));
        health.connected();
        assert_eq!(stands(&health), Some(("unexpected reply".into(), true)));
        health.check_failed(check(Some("unexpected reply")), at(201));
        assert_eq!(stands(&health), Some(("unexpected reply".into(), true)));
        health.check_passed(check(None));
        assert_eq!(stands(&health), Some(("unexpected reply".into(), false)));
        // A release that proves it (a check, or a client when all were quarantined) too.
        health.failed(Reason::Monitor, "refused", MINUTES_2, at(400));
        assert!(health.passed(Release::ClientConnected, at(401)));
        assert_eq!(stands(&health), Some(("refused".into(), false)));
        // An operator's release proves nothing.
        health.failed(Reason::Connect, "timed out", MINUTES_2, at(500));
        assert!(health.passed(Release::Operator, at(501)));
        assert_eq!(stands(&health), Some(("timed out".into(), true)));
    }

    #[test]
    fn an_operators_quarantine_keeps_who_asked_and_why_while_it_lasts() {
        let health = Health::default();
        health.failed(Reason::Connect, "refused", MINUTES_2, at(0));
        let asked = OperatorAsk {
            by: "uid 0".into(),
            reason: "AppServer restart".into(),
        };
        assert_eq!(asked.words(), "asked by uid 0: AppServer restart");
        assert_eq!(OperatorAsk::from("uid 7").words(), "asked by uid 7");
        health.forced(asked.clone(), MINUTES_2, at(10));
        let detail = health.detail();
        assert_eq!(detail.asked, Some(asked));
        assert_eq!(detail.reason, Some(Reason::Operator));
        assert_eq!(
            detail.history.back().map(|e| e.error.as_str()),
            Some("refused"),
            "moved out, the episode the client's connect started"
        );
        // Nor does a failure meanwhile replace the operator's words.
        health.failed(Reason::Monitor, "timed out", MINUTES_2, at(20));
        assert!(health.detail().asked.is_some());
        assert!(health.passed(Release::Operator, at(30)));
        assert_eq!(health.detail().asked, None, "gone with its quarantine");
    }
}
