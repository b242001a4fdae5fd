//! The HTTP engine's figures for METRICS: answers by status class, a histogram of request
//! durations, and the retries and failures by kind. Atomics, updated once per request.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use hyper::StatusCode;

use super::ExchangeOutcome;

/// The histogram's upper bounds, Prometheus' default buckets: from a cached page (5 ms) to a
/// slow report (10 s); longer requests are counted in `+Inf` only.
pub const DURATION_BUCKETS: [Duration; 11] = [
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2500),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

/// Live figures of one HTTP balancer.
#[derive(Debug, Default)]
pub struct Stats {
    /// Answers by status class, 1xx to 5xx.
    classes: [AtomicU64; 5],
    /// Requests by the first bucket they fit in; the last is `+Inf`.
    buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
    duration_micros: AtomicU64,
    requests: AtomicU64,
    pub(crate) no_server: AtomicU64,
    pub(crate) server_failed: AtomicU64,
    pub(crate) server_timeout: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) client_body_timeout: AtomicU64,
    pub(crate) retried_stale: AtomicU64,
    pub(crate) retried_next: AtomicU64,
    pub(crate) upgrades: AtomicU64,
    pub(crate) spliced: AtomicU64,
}

/// A copy of [`Stats`] at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Figures {
    /// Answers sent by status class: `[1xx, 2xx, 3xx, 4xx, 5xx]`.
    pub classes: [u64; 5],
    /// Cumulative counts per bucket of [`DURATION_BUCKETS`] (Prometheus' `le`), then `+Inf`.
    pub buckets: Vec<u64>,
    /// The sum of every request's duration.
    pub duration_sum: Duration,
    /// Requests finished.
    pub requests: u64,
    /// Answered 503: no server could take them (or the broker itself could connect none).
    pub no_server: u64,
    /// Answered 502: the server failed after the request was sent.
    pub server_failed: u64,
    /// Answered 504, or cut midway: the server did not answer in time.
    pub server_timeout: u64,
    /// Refused by the broker itself (CONNECT, transfer coding, Host, target too long, a
    /// malformed body).
    pub refused: u64,
    /// Answered 408, or closed midway: the client's body stopped coming.
    pub client_body_timeout: u64,
    /// Sent again on a fresh connection after the server closed a pooled one as it was used.
    pub retried_stale: u64,
    /// Sent to the next server after a failure (`HTTP_RETRY_IDEMPOTENT`).
    pub retried_next: u64,
    /// Connections upgraded (WebSocket).
    pub upgrades: u64,
    /// Body bytes moved by splice(2) between plain sockets, without passing through user
    /// space.
    pub spliced: u64,
}

impl Stats {
    /// Counts a finished request.
    pub(crate) fn finished(
        &self,
        status: Option<StatusCode>,
        took: Duration,
        outcome: &ExchangeOutcome,
    ) {
        if let Some(class) = status.and_then(|s| (s.as_u16() / 100).checked_sub(1))
            && let Some(counter) = self.classes.get(usize::from(class))
        {
            counter.fetch_add(1, Relaxed);
        }
        let bucket = DURATION_BUCKETS
            .iter()
            .position(|bound| took <= *bound)
            .unwrap_or(DURATION_BUCKETS.len());
        if let Some(counter) = self.buckets.get(bucket) {
            counter.fetch_add(1, Relaxed);
        }
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.duration_micros.fetch_add(micros, Relaxed);
        self.requests.fetch_add(1, Relaxed);
        let counter = match outcome {
            ExchangeOutcome::NoServer | ExchangeOutcome::BrokerFault => &self.no_server,
            ExchangeOutcome::ServerFailed(_) => &self.server_failed,
            ExchangeOutcome::ServerTimeout => &self.server_timeout,
            ExchangeOutcome::Refused | ExchangeOutcome::ClientFailed => &self.refused,
            ExchangeOutcome::ClientTimeout => &self.client_body_timeout,
            // A tunnel's request is counted at its 101, as served.
            ExchangeOutcome::Served
            | ExchangeOutcome::Local
            | ExchangeOutcome::Incomplete
            | ExchangeOutcome::TunnelBroken(_) => return,
        };
        counter.fetch_add(1, Relaxed);
    }

    /// The figures now.
    pub fn figures(&self) -> Figures {
        let mut running = 0;
        let buckets = self
            .buckets
            .iter()
            .map(|b| {
                running += b.load(Relaxed);
                running
            })
            .collect();
        Figures {
            classes: self.classes.each_ref().map(|c| c.load(Relaxed)),
            buckets,
            duration_sum: Duration::from_micros(self.duration_micros.load(Relaxed)),
            requests: self.requests.load(Relaxed),
            no_server: self.no_server.load(Relaxed),
            server_failed: self.server_failed.load(Relaxed),
            server_timeout: self.server_timeout.load(Relaxed),
            refused: self.refused.load(Relaxed),
            client_body_timeout: self.client_body_timeout.load(Relaxed),
            retried_stale: self.retried_stale.load(Relaxed),
            retried_next: self.retried_next.load(Relaxed),
            upgrades: self.upgrades.load(Relaxed),
            spliced: self.spliced.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_cumulative_buckets() {
        let stats = Stats::default();
        let ok = Some(StatusCode::OK);
        stats.finished(ok, Duration::from_millis(3), &ExchangeOutcome::Served);
        stats.finished(ok, Duration::from_millis(5), &ExchangeOutcome::Served);
        stats.finished(
            Some(StatusCode::SERVICE_UNAVAILABLE),
            Duration::from_millis(7),
            &ExchangeOutcome::NoServer,
        );
        stats.finished(None, Duration::from_secs(60), &ExchangeOutcome::Incomplete);
        let f = stats.figures();
        assert_eq!(f.classes, [0, 2, 0, 0, 1]);
        assert_eq!(f.buckets.len(), DURATION_BUCKETS.len() + 1);
        assert_eq!(f.buckets[0], 2, "5 ms is within the 5 ms bucket");
        assert_eq!(f.buckets[1], 3);
        assert_eq!(f.buckets[DURATION_BUCKETS.len() - 1], 3);
        assert_eq!(f.buckets[DURATION_BUCKETS.len()], 4);
        assert_eq!(f.requests, 4);
        assert_eq!(f.no_server, 1);
        assert_eq!(f.duration_sum, Duration::from_millis(60_015));
    }
}
