//! Times as certificates hold them (seconds since the epoch) and as operators read them in a
//! line (`2026-03-01 12:00:00 UTC`, `3 days`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the epoch as a time (certificates before 1970 are treated as of 1970).
pub(super) fn time(seconds: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// A time as operators read it in a log: `2026-03-01 12:00:00 UTC`.
pub(crate) fn utc(at: SystemTime) -> String {
    let seconds = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    chrono::DateTime::from_timestamp(seconds, 0).map_or_else(
        || format!("{seconds}s after 1970"),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

/// A span in days (or hours, under a day).
pub(super) fn days(span: Duration) -> String {
    let hours = span.as_secs() / 3600;
    match hours {
        0..24 => format!("{hours} hour{}", if hours == 1 { "" } else { "s" }),
        _ => {
            let days = hours / 24;
            format!("{days} day{}", if days == 1 { "" } else { "s" })
        }
    }
}
