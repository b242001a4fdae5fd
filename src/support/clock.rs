//! Time as the broker counts it: a monotonic millisecond clock for quarantine deadlines (read
//! lock-free on the hot path; tokio's clock, so tests can pause it) and wall-clock helpers for
//! the epoch times operators read in logs and pages.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{Local, TimeZone};
use tokio::time::Instant;

/// Milliseconds since the clock was made, never 0 (0 means "no deadline" in atomics).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Self {
        Clock {
            base: Instant::now(),
        }
    }

    /// Milliseconds since the clock started, plus one.
    pub fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64 + 1
    }

    /// The instant `ms` on this clock stands for, to sleep until it.
    pub fn instant(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms.saturating_sub(1))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Milliseconds on one monotonic clock for the whole process, never 0: for intervals kept in
/// atomics (log throttles), which a change of the wall clock must not stretch or cut short.
/// Tokio's clock, so tests can pause it.
pub fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| Instant::now().into_std());
    Instant::now()
        .into_std()
        .saturating_duration_since(start)
        .as_millis() as u64
        + 1
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Local time of day of a wall-clock instant (ms since the Unix epoch), `HH:MM:SS`; `-` when
/// it cannot be shown.
pub fn time_of_day(wall_ms: u64) -> String {
    local(wall_ms).map_or_else(|| "-".into(), |t| t.format("%H:%M:%S").to_string())
}

/// Local date of a wall-clock instant, `DD/MM/YYYY` (the TOTVS pages' order); `-` when it
/// cannot be shown.
pub fn local_date(wall_ms: u64) -> String {
    local(wall_ms).map_or_else(|| "-".into(), |t| t.format("%d/%m/%Y").to_string())
}

/// Local date of a wall-clock instant, `YYYY-MM-DD` (ISO 8601, which no reader takes for
/// another day); `-` when it cannot be shown.
pub fn local_date_iso(wall_ms: u64) -> String {
    local(wall_ms).map_or_else(|| "-".into(), |t| t.format("%Y-%m-%d").to_string())
}

/// A wall-clock instant as RFC 3339 in local time with its offset, to the second
/// (`2025-03-04T18:04:05-03:00`); `-` when it cannot be shown.
pub fn rfc3339(wall_ms: u64) -> String {
    local(wall_ms).map_or_else(
        || "-".into(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, false),
    )
}

fn local(wall_ms: u64) -> Option<chrono::DateTime<Local>> {
    Local
        .timestamp_millis_opt(i64::try_from(wall_ms).ok()?)
        .single()
}
