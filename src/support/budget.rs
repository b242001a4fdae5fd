//! A process-wide budget of memory for work in progress that a peer controls the pace of
//! (`HTTP_HEAD_MEMORY`: request heads still arriving): each piece claims what it holds, and
//! when the claims pass the limit the oldest are evicted first, each told through its waker,
//! so many slow peers together can never hold more than the limit, and the newest (most
//! likely a live user) are the last to go.
//!
//! Claims are made only by work that did not finish at once (a head that came whole in its
//! first read claims nothing), so the common path costs nothing. One small lock, held for a
//! claim, a growth, a release or an eviction.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Waker};

use crate::support::throttle::Episode;

/// One budget.
#[derive(Debug)]
pub struct Budget {
    limit: AtomicUsize,
    claims: Mutex<Claims>,
    /// Evictions since the budget was last found with room, logged per episode by the caller.
    pub evictions: Episode,
}

/// The live claims, oldest first.
#[derive(Debug, Default)]
struct Claims {
    used: usize,
    next: u64,
    live: BTreeMap<u64, (usize, Arc<Told>)>,
}

/// What an evicted claim is told.
#[derive(Debug, Default)]
struct Told {
    evicted: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

/// A piece of work's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Claim {
    budget: Arc<Budget>,
    id: u64,
    told: Arc<Told>,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit: AtomicUsize::new(limit),
            claims: Mutex::default(),
            evictions: Episode::default(),
        })
    }

    /// A new limit (a reload): the next claim or growth holds to it.
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Relaxed);
    }

    /// Bytes claimed now.
    pub fn used(&self) -> usize {
        self.lock().used
    }

    fn lock(&self) -> MutexGuard<'_, Claims> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims `bytes` for a new piece of work; the oldest claims are evicted while the total
    /// passes the limit (this one too, when it alone does). The claim, and how many were
    /// evicted to make room.
    pub fn claim(self: &Arc<Self>, bytes: usize) -> (Claim, usize) {
        let told = Arc::new(Told::default());
        let mut claims = self.lock();
        let id = claims.next;
        claims.next += 1;
        claims.live.insert(id, (bytes, Arc::clone(&told)));
        claims.used += bytes;
        let evicted = self.evict(&mut claims);
        drop(claims);
        let claim = Claim {
            budget: Arc::clone(self),
            id,
            told,
        };
        (claim, evicted)
    }

    /// Evicts the oldest claims while the total passes the limit; how many.
    fn evict(&self, claims: &mut Claims) -> usize {
        let limit = self.limit.load(Relaxed);
        let mut evicted = 0;
        while claims.used > limit {
            let Some((_, (bytes, told))) = claims.live.pop_first() else {
                break;
            };
            claims.used -= bytes;
            told.evicted.store(true, Relaxed);
            if let Some(waker) = told.waker.lock().unwrap_or_else(|p| p.into_inner()).take() {
                waker.wake();
            }
            evicted += 1;
        }
        evicted
    }
}

impl Claim {
    /// The work now holds `bytes` (its buffer grew): the oldest claims are evicted while the
    /// total passes the limit (this one too, when it is the oldest left); how many were.
    pub fn grow(&mut self, bytes: usize) -> usize {
        let budget = &self.budget;
        let mut claims = budget.lock();
        let Some((held, _)) = claims.live.get_mut(&self.id) else {
            return 0;
        };
        let before = std::mem::replace(held, bytes);
        claims.used = claims.used - before + bytes;
        budget.evict(&mut claims)
    }

    /// Whether the claim was evicted: the work is to give up. Until it is, `cx` is woken when
    /// it is.
    pub fn evicted(&self, cx: &mut Context<'_>) -> bool {
        if self.told.evicted.load(Relaxed) {
            return true;
        }
        *self.told.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
        // Evicted between the look and the waker's storing: told now.
        self.told.evicted.load(Relaxed)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claims = self.budget.lock();
        if let Some((bytes, _)) = claims.live.remove(&self.id) {
            claims.used -= bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evicted(claim: &Claim) -> bool {
        claim.evicted(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn past_the_limit_the_oldest_claims_go_first() {
        let budget = Budget::new(100);
        let (a, none) = budget.claim(40);
        let (mut b, _) = budget.claim(40);
        assert_eq!((none, budget.used()), (0, 80));
        let (c, gone) = budget.claim(40);
        assert_eq!(gone, 1);
        assert!(evicted(&a) && !evicted(&b) && !evicted(&c));
        assert_eq!(budget.used(), 80);
        // A growth past the limit evicts the oldest left: the grower itself here.
        assert_eq!(b.grow(70), 1);
        assert!(evicted(&b) && !evicted(&c));
        assert_eq!(budget.used(), 40);
        drop((a, b));
        assert_eq!(budget.used(), 40, "evicted claims were given back already");
        drop(c);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn an_evicted_claim_wakes_its_work() {
        let budget = Budget::new(10);
        let (old, _) = budget.claim(10);
        let woken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Relaxed);
            }
        }
        let waker = Waker::from(Arc::new(Flag(Arc::clone(&woken))));
        assert!(!old.evicted(&mut Context::from_waker(&waker)));
        let (_new, gone) = budget.claim(5);
        assert_eq!(gone, 1);
        assert!(woken.load(Relaxed) && evicted(&old));
    }
}
