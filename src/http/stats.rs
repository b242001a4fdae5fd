//! The HTTP engine's figures for METRICS: answers by status class, a histogram of request
//! durations, and the retries and failures by kind. Atomics, updated once per request.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use hyper::StatusCode;

use super::{ExchangeOutcome, Protocol};

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
    /// Client connections by protocol ([`Protocol::ALL`]): opened since start, open now.
    connections: [AtomicU64; 2],
    connections_open: [AtomicU64; 2],
    /// Requests finished, by protocol.
    by_protocol: [AtomicU64; 2],
    /// HTTP/2 streams accepted since start, in hand now, reset by their clients before
    /// their answer was whole; connections ended for resetting too many.
    h2_streams: AtomicU64,
    h2_streams_open: AtomicU64,
    h2_resets: AtomicU64,
    h2_calmed: AtomicU64,
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
    /// Client connections opened since start, by protocol ([`Protocol::ALL`]).
    pub connections: [u64; 2],
    /// Client connections open now, by protocol.
    pub connections_open: [u64; 2],
    /// Requests finished, by protocol.
    pub by_protocol: [u64; 2],
    /// HTTP/2 streams since start.
    pub h2_streams: u64,
    /// HTTP/2 streams in hand now.
    pub h2_streams_open: u64,
    /// HTTP/2 streams their clients reset before their answer was whole.
    pub h2_resets: u64,
    /// HTTP/2 connections ended (`GOAWAY ENHANCE_YOUR_CALM`) for resetting too many streams.
    pub h2_calmed: u64,
}

impl Stats {
    /// Counts a finished request, that came in `protocol`.
    pub(crate) fn finished(
        &self,
        protocol: Protocol,
        status: Option<StatusCode>,
        took: Duration,
        outcome: &ExchangeOutcome,
    ) {
        self.by_protocol[protocol.index()].fetch_add(1, Relaxed);
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
            connections: self.connections.each_ref().map(|c| c.load(Relaxed)),
            connections_open: self.connections_open.each_ref().map(|c| c.load(Relaxed)),
            by_protocol: self.by_protocol.each_ref().map(|c| c.load(Relaxed)),
            h2_streams: self.h2_streams.load(Relaxed),
            h2_streams_open: self.h2_streams_open.load(Relaxed),
            h2_resets: self.h2_resets.load(Relaxed),
            h2_calmed: self.h2_calmed.load(Relaxed),
        }
    }

    /// A client connection of `protocol` opened: counted until [`Stats::closed`].
    pub(crate) fn opened(&self, protocol: Protocol) {
        self.connections[protocol.index()].fetch_add(1, Relaxed);
        self.connections_open[protocol.index()].fetch_add(1, Relaxed);
    }

    /// A client connection of `protocol` closed.
    pub(crate) fn closed(&self, protocol: Protocol) {
        self.connections_open[protocol.index()].fetch_sub(1, Relaxed);
    }

    /// An HTTP/2 stream accepted: in hand until [`Stats::h2_streams_ended`].
    pub(crate) fn h2_stream(&self) {
        self.h2_streams.fetch_add(1, Relaxed);
        self.h2_streams_open.fetch_add(1, Relaxed);
    }

    /// `count` HTTP/2 streams are no longer in hand.
    pub(crate) fn h2_streams_ended(&self, count: u64) {
        self.h2_streams_open.fetch_sub(count, Relaxed);
    }

    /// `count` HTTP/2 streams reset by their clients.
    pub(crate) fn h2_reset(&self, count: u32) {
        self.h2_resets.fetch_add(u64::from(count), Relaxed);
    }

    /// An HTTP/2 connection ended for resetting too many streams.
    pub(crate) fn h2_calmed(&self) {
        self.h2_calmed.fetch_add(1, Relaxed);
    }
}

/// A client connection counted open in the figures while this lives.
pub(crate) struct Open<'s> {
    stats: &'s Stats,
    protocol: Protocol,
}

impl<'s> Open<'s> {
    /// `protocol`'s connection, counted open.
    pub(crate) fn new(stats: &'s Stats, protocol: Protocol) -> Open<'s> {
        stats.opened(protocol);
        Open { stats, protocol }
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.stats.closed(self.protocol);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_cumulative_buckets() {
        let stats = Stats::default();
        let ok = Some(StatusCode::OK);
        let h1 = Protocol::Http1;
        stats.finished(h1, ok, Duration::from_millis(3), &ExchangeOutcome::Served);
        stats.finished(
            Protocol::H2,
            ok,
            Duration::from_millis(5),
            &ExchangeOutcome::Served,
        );
        stats.finished(
            h1,
            Some(StatusCode::SERVICE_UNAVAILABLE),
            Duration::from_millis(7),
            &ExchangeOutcome::NoServer,
        );
        stats.finished(
            h1,
            None,
            Duration::from_secs(60),
            &ExchangeOutcome::Incomplete,
        );
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
        assert_eq!(f.by_protocol, [3, 1]);
    }
}
