//! The query interface's own limits, the same on every port (docs/operations.md, "Queries
//! and their limits"): a query's request line and head are short (monitors send a few
//! hundred bytes), a query connection's wait for its next head is short, and its life is
//! bounded, so that slow or never-finished queries cannot keep the few query places
//! (`QUERY_MAX_CONNECTIONS`, the longest idle given up first) from those who ask now.

use std::time::Duration;

use super::reply::closing;
use crate::balancer::Admission;
use crate::http::{LocalAnswer, LocalRequest, NewStream};

/// Longest request line of a query (beyond it: 414). TOTVS monitors send short ones.
pub(super) const MAX_REQUEST_LINE: usize = 8 * 1024;

/// Largest head of a query (beyond it: 431).
pub(super) const MAX_HEAD: usize = 16 * 1024;

/// How long a query connection's head may take: the first on a TCP port (counted from its
/// first bytes), and every next one on either kind of port, the wait while it idles included.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// A query connection older than this answers the request in hand and closes, so no one
/// keeps a place for long however busy; a browser or a monitor simply reconnects.
pub(super) const MAX_QUERY_CONNECTION: Duration = Duration::from_secs(60);

/// The refusal of a query whose request line or head is over the limits; `None` within them.
pub(super) fn refusal(request: &LocalRequest) -> Option<LocalAnswer> {
    if request.line_len > MAX_REQUEST_LINE {
        return Some(closing(414, "request line too long\n"));
    }
    if request.head_len > MAX_HEAD {
        return Some(closing(431, "request head too large\n"));
    }
    None
}

/// The connection of `admission` waits for its next request: a query connection's place may
/// go to a new query meanwhile, and its wait is bounded by [`HEAD_TIMEOUT`] and what is left
/// of its life. `None` for any other connection: its port's own timeout holds.
pub fn waiting(admission: &Admission) -> Option<Duration> {
    admission.waiting();
    match admission {
        Admission::Query(place) | Admission::Counted(Some(place)) => {
            Some(HEAD_TIMEOUT.min(MAX_QUERY_CONNECTION.saturating_sub(place.age())))
        }
        // A stream's (HTTP/2) wait is its connection's, asked of the connection's own.
        Admission::Unknown
        | Admission::Client(_)
        | Admission::Counted(None)
        | Admission::Stream(_) => None,
    }
}

/// A new request (an HTTP/2 stream) on the connection of `admission`, which carries several
/// at once and so has no next head to wait for: held to what an HTTP/1.1 query connection is
/// at its next request. Closed unanswered when its place went to another query while it
/// idled (the client asks again on a new connection); past its life, the request answered and
/// the connection closed.
pub fn resumed(admission: &Admission) -> NewStream {
    if !admission.resumed() {
        NewStream::Refuse
    } else if past_life(admission) {
        NewStream::ServeLast
    } else {
        NewStream::Serve
    }
}

/// Whether the connection of `admission` is a query connection past its life: it closes
/// after the answer in hand.
pub(super) fn past_life(admission: &Admission) -> bool {
    matches!(admission, Admission::Query(place) | Admission::Counted(Some(place))
        if place.age() >= MAX_QUERY_CONNECTION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ClientAddr;

    #[test]
    fn a_query_over_its_line_or_head_is_refused_and_closed() {
        let mut request =
            LocalRequest::new(b"GET", b"/TOTVS_BROKER_QUERY", ClientAddr::Unknown, false);
        request.line_len = MAX_REQUEST_LINE;
        request.head_len = MAX_HEAD;
        assert_eq!(refusal(&request), None);
        request.head_len = MAX_HEAD + 1;
        let large = refusal(&request).map(|a| (a.status, a.close));
        assert_eq!(large, Some((431, true)));
        request.line_len = MAX_REQUEST_LINE + 1;
        assert_eq!(refusal(&request).map(|a| a.status), Some(414));
    }

    #[tokio::test(start_paused = true)]
    async fn a_query_connection_waits_at_most_its_head_timeout_and_the_rest_of_its_life() {
        let places = std::sync::Arc::new(crate::balancer::rules::places::QueryPlaces::default());
        let admission = Admission::Query(places.take(1).unwrap_or_else(|| unreachable!()));
        assert_eq!(waiting(&admission), Some(HEAD_TIMEOUT));
        assert!(!past_life(&admission));
        tokio::time::advance(MAX_QUERY_CONNECTION - Duration::from_secs(3)).await;
        assert_eq!(waiting(&admission), Some(Duration::from_secs(3)));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(waiting(&admission), Some(Duration::ZERO));
        assert!(past_life(&admission));
        assert_eq!(waiting(&Admission::Unknown), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_stream_is_refused_once_the_place_went_and_is_the_last_past_the_life() {
        let places = std::sync::Arc::new(crate::balancer::rules::places::QueryPlaces::default());
        let admission = Admission::Query(places.take(1).unwrap_or_else(|| unreachable!()));
        let _ = waiting(&admission);
        assert_eq!(resumed(&admission), NewStream::Serve);
        assert!(places.take(1).is_none(), "held again by the new stream");
        tokio::time::advance(MAX_QUERY_CONNECTION).await;
        assert_eq!(resumed(&admission), NewStream::ServeLast);
        let _ = waiting(&admission);
        let _newcomer = places.take(1).unwrap_or_else(|| unreachable!());
        assert_eq!(resumed(&admission), NewStream::Refuse);
        assert_eq!(resumed(&Admission::Unknown), NewStream::Serve);
    }
}
