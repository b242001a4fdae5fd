//! Query places: at most `QUERY_MAX_CONNECTIONS` query connections of a balancer at once, so
//! slow or never-finished requests cannot use up the broker's descriptors. A place is taken
//! only once a connection is known to be a query from an allowed address, and a connection
//! idle between two requests (a status page waiting for its next refresh) gives its place up
//! to a new query that finds none free: the only connections that can keep a query waiting
//! are ones whose request is being read or answered, each within the query timeouts.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::support::clock::monotonic_ms;
use crate::support::throttle::Episode;

/// The places of one balancer.
#[derive(Debug, Default)]
pub struct QueryPlaces {
    /// The places taken now.
    open: Mutex<Vec<Arc<PlaceState>>>,
    /// Queries refused since every place was last taken, logged per episode by the caller.
    pub exhausted: Episode,
}

/// A place's connection is reading or answering a request.
const BUSY: u8 = 0;
/// Its connection waits for its next request: the place may be given to another.
const IDLE: u8 = 1;
/// Its place went to another query: the connection is to close.
const GIVEN_UP: u8 = 2;

#[derive(Debug)]
struct PlaceState {
    state: AtomicU8,
    /// [`monotonic_ms`] when it last became idle: the longest idle gives its place up first.
    idle_since_ms: AtomicU64,
    /// [`monotonic_ms`] when it was taken: a query connection's life is bounded.
    taken_ms: u64,
}

impl QueryPlaces {
    /// Takes a place under `max`; when none is free, the place of the connection idle the
    /// longest is given to this one (that connection closes). `None` when every place is
    /// busy.
    pub fn take(self: &Arc<Self>, max: u32) -> Option<Place> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= max as usize {
            let (index, idlest) = open
                .iter()
                .enumerate()
                .filter(|(_, p)| p.state.load(Relaxed) == IDLE)
                .min_by_key(|(_, p)| p.idle_since_ms.load(Relaxed))?;
            // It may have just read the start of a request: then it keeps its place.
            idlest
                .state
                .compare_exchange(IDLE, GIVEN_UP, Relaxed, Relaxed)
                .ok()?;
            open.swap_remove(index);
        }
        let state = Arc::new(PlaceState {
            state: AtomicU8::new(BUSY),
            idle_since_ms: AtomicU64::new(0),
            taken_ms: monotonic_ms(),
        });
        open.push(Arc::clone(&state));
        Some(Place {
            places: Arc::clone(self),
            state,
        })
    }

    /// True when [`QueryPlaces::take`] could give a place now.
    pub fn has_room(&self, max: u32) -> bool {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.len() < max as usize || open.iter().any(|p| p.state.load(Relaxed) == IDLE)
    }

    /// Places taken now.
    pub fn taken(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// One query connection's place, held until dropped.
#[derive(Debug)]
pub struct Place {
    places: Arc<QueryPlaces>,
    state: Arc<PlaceState>,
}

impl Place {
    /// Its connection has a request to read (bytes came): the place is not to be given up.
    /// False when it was given up already: the connection is to close.
    pub fn busy(&self) -> bool {
        match self
            .state
            .state
            .compare_exchange(IDLE, BUSY, Relaxed, Relaxed)
        {
            Ok(_) => true,
            Err(now) => now == BUSY,
        }
    }

    /// How long ago it was taken: its query connection's age.
    pub fn age(&self) -> std::time::Duration {
        std::time::Duration::from_millis(monotonic_ms().saturating_sub(self.state.taken_ms))
    }

    /// Its connection has answered what it read and waits for the next request.
    pub fn idle(&self) {
        self.state.idle_since_ms.store(monotonic_ms(), Relaxed);
        let _ = self
            .state
            .state
            .compare_exchange(BUSY, IDLE, Relaxed, Relaxed);
    }

    /// True once the place has been given to another query.
    pub fn is_given_up(&self) -> bool {
        self.state.state.load(Relaxed) == GIVEN_UP
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.places.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(index) = open.iter().position(|p| Arc::ptr_eq(p, &self.state)) {
            open.swap_remove(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_capped_and_an_idle_one_is_given_to_a_new_query() {
        let places = Arc::new(QueryPlaces::default());
        let first = places.take(2).expect("a free place");
        let second = places.take(2).expect("a free place");
        assert!(places.take(2).is_none(), "both busy");
        assert!(!places.has_room(2));
        second.idle();
        assert!(places.has_room(2));
        let third = places.take(2).expect("the idle one's place");
        assert!(second.is_given_up());
        assert!(!second.busy(), "a given-up place stays given up");
        assert_eq!(places.taken(), 2);
        drop(second);
        assert_eq!(places.taken(), 2, "its place is the third's now");
        drop(first);
        drop(third);
        assert_eq!(places.taken(), 0);
    }

    #[test]
    fn a_place_that_became_busy_again_is_kept() {
        let places = Arc::new(QueryPlaces::default());
        let only = places.take(1).expect("a free place");
        only.idle();
        assert!(only.busy(), "bytes of a new request came");
        assert!(places.take(1).is_none());
        assert!(!only.is_given_up());
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_idle_gives_its_place_up_first() {
        let places = Arc::new(QueryPlaces::default());
        let older = places.take(2).expect("free");
        let newer = places.take(2).expect("free");
        older.idle();
        tokio::time::advance(std::time::Duration::from_millis(10)).await;
        newer.idle();
        let _third = places.take(2).expect("an idle one's place");
        assert!(older.is_given_up());
        assert!(!newer.is_given_up());
    }
}
