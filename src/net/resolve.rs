//! Where a server is: the addresses its host name resolves to, and whether one of them is the
//! broker itself.
//!
//! The system resolver (getaddrinfo) blocks a thread per lookup, and a hung DNS server can
//! hold that thread for tens of seconds; a lookup per client would then pile up threads and
//! descriptors faster than they are given back. So answers are kept for `DNS_CACHE_TIME`, at
//! most one lookup per name is in flight (everyone who asks meanwhile waits for that one), and
//! at most `DNS_MAX_LOOKUPS` are in flight in the whole process: a client that would need one
//! more is sent to another server, as after a connect timeout, and no server is blamed for
//! it. A name's failures, and running out of lookups, are logged once per episode.
//!
//! Every destination is also checked against the broker's own listening addresses
//! ([`crate::config::self_loop`]) before it is connected to.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::self_loop::{LocalAddresses, reaches};
use crate::config::show_duration;
use crate::support::throttle::Episode;

/// The system's name lookup, or a stand-in for tests: a name to its addresses. It blocks.
pub type Lookup = Arc<dyn Fn(&str) -> io::Result<Vec<IpAddr>> + Send + Sync>;

/// Why a name gave no address to connect to.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The resolver answered with an error (no such name, or a system failure).
    #[error("{0}")]
    Failed(io::Error),
    /// No answer within the time allowed (`CONNECT_TIMEOUT`).
    #[error("resolving {name} took longer than {}", show_duration(*after))]
    TimedOut {
        /// The name.
        name: String,
        /// The time allowed.
        after: Duration,
    },
    /// `DNS_MAX_LOOKUPS` lookups are in flight: not tried.
    #[error("not tried: DNS_MAX_LOOKUPS ({limit}) name lookups are in flight")]
    Busy {
        /// `DNS_MAX_LOOKUPS`.
        limit: usize,
    },
}

/// One name's answer and its lookup in flight.
#[derive(Debug, Default)]
struct Name {
    /// The last answer and when it came.
    answer: Option<(Instant, Arc<[IpAddr]>)>,
    /// The lookup in flight: its outcome is sent here.
    pending: Option<watch::Receiver<Option<LookupOutcome>>>,
    /// The error of the episode of failures running, if one runs.
    failing: Option<String>,
}

/// A lookup's outcome, shared by everyone who waited for it.
type LookupOutcome = Result<Arc<[IpAddr]>, LookupFailure>;

/// A failed lookup, kept so that each waiter can have its own `io::Error`.
#[derive(Debug, Clone)]
struct LookupFailure {
    raw_os_error: Option<i32>,
    message: String,
}

impl LookupFailure {
    fn of(name: &str, error: &io::Error) -> LookupFailure {
        LookupFailure {
            raw_os_error: error.raw_os_error(),
            message: format!(
                "cannot resolve {name}: {}",
                crate::support::os_error::words(error)
            ),
        }
    }

    fn to_error(&self) -> io::Error {
        match self.raw_os_error {
            // A system failure (out of descriptors, say): the code says whose fault it is.
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(io::ErrorKind::NotFound, self.message.clone()),
        }
    }
}

/// What changed about a name's lookups, for the caller to log.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// Its lookups started failing (or hanging): the first error of the episode.
    Failing(String),
    /// It resolves again after failing.
    Recovered(String),
}

impl Name {
    /// Records a lookup's outcome; returns the change to log, if any.
    fn record(&mut self, outcome: &LookupOutcome, at: Instant) -> Option<Change> {
        match outcome {
            Ok(addresses) => {
                self.answer = Some((at, Arc::clone(addresses)));
                self.failing.take().map(Change::Recovered)
            }
            Err(failure) => self.failed(&failure.message),
        }
    }

    /// A failure (or a lookup too slow); `Some` when it starts an episode.
    fn failed(&mut self, message: &str) -> Option<Change> {
        if self.failing.is_some() {
            return None;
        }
        self.failing = Some(message.to_string());
        Some(Change::Failing(message.to_string()))
    }
}

/// The process's resolver, shared by every balancer and monitor.
pub struct Resolver {
    lookup: Lookup,
    /// `DNS_MAX_LOOKUPS`; a reload may change it.
    max_lookups: AtomicUsize,
    in_flight: AtomicUsize,
    names: Mutex<HashMap<String, Name>>,
    /// Clients turned away since `DNS_MAX_LOOKUPS` was last reached.
    busy: Episode,
    /// The broker's listening addresses (a reload may change them).
    listening: ArcSwap<Vec<SocketAddr>>,
    machine: LocalAddresses,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("max_lookups", &self.max_lookups)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// The system resolver: getaddrinfo, as the standard library calls it.
fn system_lookup(name: &str) -> io::Result<Vec<IpAddr>> {
    Ok((name, 0).to_socket_addrs()?.map(|a| a.ip()).collect())
}

/// Names whose answer is older than this are forgotten when a new one is stored, so a name
/// removed by a reload does not stay for ever: longer than any `DNS_CACHE_TIME`.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600 + 60);

impl Resolver {
    /// A resolver over the system's lookup, with at most `max_lookups` in flight.
    pub fn new(max_lookups: usize) -> Self {
        Resolver::with_lookup(max_lookups, Arc::new(system_lookup))
    }

    /// The same over `lookup` (tests give one that hangs or counts).
    pub fn with_lookup(max_lookups: usize, lookup: Lookup) -> Self {
        Resolver {
            lookup,
            max_lookups: AtomicUsize::new(max_lookups),
            in_flight: AtomicUsize::new(0),
            names: Mutex::default(),
            busy: Episode::default(),
            listening: ArcSwap::from_pointee(Vec::new()),
            machine: LocalAddresses::default(),
        }
    }

    /// Applies a (re)loaded `DNS_MAX_LOOKUPS`.
    pub fn set_max_lookups(&self, max: usize) {
        self.max_lookups.store(max, Relaxed);
    }

    /// Records the broker's listening addresses (at start and after each reload).
    pub fn set_listening(&self, addresses: Vec<SocketAddr>) {
        self.listening.store(Arc::new(addresses));
    }

    /// The broker's own listening address that `destination` reaches, if any.
    pub fn own_listener(&self, destination: SocketAddr) -> Option<SocketAddr> {
        self.listening
            .load()
            .iter()
            .copied()
            .find(|listen| reaches(destination, *listen, |ip| self.machine.contains(ip)))
    }

    /// Lookups in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Relaxed)
    }

    /// The addresses `name` resolves to: from an answer younger than `cache_time`, else from
    /// the lookup in flight for it, else from a new lookup; waiting at most `timeout`.
    pub async fn resolve(
        self: &Arc<Self>,
        name: &str,
        cache_time: Duration,
        timeout: Duration,
    ) -> Result<Arc<[IpAddr]>, ResolveError> {
        let key = name.to_ascii_lowercase();
        let mut pending = {
            let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
            let entry = names.entry(key.clone()).or_default();
            if let Some((at, addresses)) = &entry.answer
                && at.elapsed() < cache_time
            {
                return Ok(Arc::clone(addresses));
            }
            match &entry.pending {
                Some(pending) => pending.clone(),
                None => {
                    let receiver = self.start_lookup(&key)?;
                    entry.pending = Some(receiver.clone());
                    receiver
                }
            }
        };
        let outcome = match tokio::time::timeout(timeout, pending.wait_for(Option::is_some)).await {
            Ok(Ok(outcome)) => outcome.clone(),
            Ok(Err(_)) => None, // the lookup's thread went away without an answer
            Err(_) => {
                let error = ResolveError::TimedOut {
                    name: name.to_string(),
                    after: timeout,
                };
                let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
                let change = names.get_mut(&key).and_then(|n| {
                    n.failed(&format!(
                        "{error}: the system's resolver (DNS) answers slowly or not at all"
                    ))
                });
                drop(names);
                log(name, change);
                return Err(error);
            }
        };
        match outcome {
            Some(Ok(addresses)) => Ok(addresses),
            Some(Err(failure)) => Err(ResolveError::Failed(failure.to_error())),
            None => Err(ResolveError::Failed(io::Error::other(format!(
                "cannot resolve {name}: the lookup ended without an answer"
            )))),
        }
    }

    /// Starts a lookup of `key` on a blocking thread, unless `DNS_MAX_LOOKUPS` are in flight.
    fn start_lookup(
        self: &Arc<Self>,
        key: &str,
    ) -> Result<watch::Receiver<Option<LookupOutcome>>, ResolveError> {
        let limit = self.max_lookups.load(Relaxed);
        if self
            .in_flight
            .fetch_update(Relaxed, Relaxed, |n| (n < limit).then_some(n + 1))
            .is_err()
        {
            if self.busy.strike() {
                warn!(
                    "DNS_MAX_LOOKUPS ({limit}) name lookups in flight: the system's resolver is \
                     slow; clients of servers given by name go to other servers meanwhile, and \
                     no server is blamed"
                );
            }
            return Err(ResolveError::Busy { limit });
        }
        if let Some(turned_away) = self.busy.end() {
            info!(
                "name lookups below DNS_MAX_LOOKUPS again: {turned_away} clients were sent to \
                 other servers meanwhile"
            );
        }
        let (sender, receiver) = watch::channel(None);
        // Counted out when the lookup ends, or when its closure is dropped unrun (a runtime
        // shutting down).
        let counted = InFlight(Arc::clone(self));
        let name = key.to_string();
        tokio::task::spawn_blocking(move || {
            let outcome = (counted.0.lookup)(&name)
                .and_then(|addresses| {
                    if addresses.is_empty() {
                        Err(io::Error::new(
                            io::ErrorKind::NotFound,
                            "it resolves to no address",
                        ))
                    } else {
                        Ok(addresses)
                    }
                })
                .map(Arc::from)
                .map_err(|e| LookupFailure::of(&name, &e));
            counted.0.finish(&name, outcome, &sender);
        });
        Ok(receiver)
    }

    /// Stores a lookup's outcome, tells whoever waits, logs what changed.
    fn finish(
        &self,
        name: &str,
        outcome: LookupOutcome,
        sender: &watch::Sender<Option<LookupOutcome>>,
    ) {
        let now = Instant::now();
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        let change = names.get_mut(name).and_then(|entry| {
            entry.pending = None;
            entry.record(&outcome, now)
        });
        if outcome.is_ok() {
            names.retain(|_, n| {
                n.pending.is_some()
                    || n.answer
                        .as_ref()
                        .is_some_and(|(at, _)| now.duration_since(*at) < FORGET_AFTER)
            });
        }
        drop(names);
        let _ = sender.send(Some(outcome));
        log(name, change);
    }
}

/// Logs what changed about a name's lookups.
fn log(name: &str, change: Option<Change>) {
    match change {
        Some(Change::Failing(error)) => warn!(
            "{error}; servers given as {name} are not reached until it resolves (logged once \
             until then)"
        ),
        Some(Change::Recovered(error)) => info!("{name} resolves again (it failed: {error})"),
        None => {}
    }
}

/// A lookup counted in flight until dropped.
struct InFlight(Arc<Resolver>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Condvar, Mutex as StdMutex};

    /// A lookup that blocks until released, counting its calls.
    #[derive(Default)]
    struct Gate {
        open: StdMutex<bool>,
        opened: Condvar,
        calls: AtomicUsize,
    }

    /// Opens its gate when dropped: a test that fails while lookups wait on the gate then
    /// fails, rather than hanging as the runtime waits for their blocking threads at its end.
    struct OpenAtEnd(Arc<Gate>);

    impl Drop for OpenAtEnd {
        fn drop(&mut self) {
            self.0.release();
        }
    }

    impl Gate {
        /// A closed gate, and its opening at the end of the test.
        fn closed() -> (Arc<Gate>, OpenAtEnd) {
            let gate = Arc::new(Gate::default());
            (Arc::clone(&gate), OpenAtEnd(gate))
        }

        fn lookup(self: &Arc<Self>) -> Lookup {
            let gate = Arc::clone(self);
            Arc::new(move |name: &str| {
                gate.calls.fetch_add(1, Relaxed);
                let mut open = gate.open.lock().unwrap();
                while !*open {
                    open = gate.opened.wait(open).unwrap();
                }
                if name.starts_with("bad") {
                    return Err(io::Error::new(io::ErrorKind::NotFound, "no such name"));
                }
                Ok(vec!["127.0.0.1".parse().unwrap()])
            })
        }

        fn release(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }

        fn calls(&self) -> usize {
            self.calls.load(Relaxed)
        }
    }

    const LONG: Duration = Duration::from_secs(30);

    async fn until(what: &str, condition: impl Fn() -> bool) {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while !condition() {
            assert!(
                std::time::Instant::now() < end,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_lookup_per_name_however_many_ask() {
        let (gate, _open_at_end) = Gate::closed();
        let resolver = Arc::new(Resolver::with_lookup(32, gate.lookup()));
        let askers: Vec<_> = (0..200)
            .map(|_| {
                let resolver = Arc::clone(&resolver);
                tokio::spawn(async move { resolver.resolve("app.example", LONG, LONG).await })
            })
            .collect();
        until("the lookup started", || gate.calls() == 1).await;
        assert_eq!(resolver.in_flight(), 1);
        gate.release();
        for asker in askers {
            let addresses = asker.await.unwrap().unwrap();
            assert_eq!(addresses[0], "127.0.0.1".parse::<IpAddr>().unwrap());
        }
        assert_eq!(gate.calls(), 1, "200 clients, one lookup");
        until("the lookup counted out", || resolver.in_flight() == 0).await;
        // Then the answer is cached: no lookup at all.
        resolver.resolve("APP.example", LONG, LONG).await.unwrap();
        assert_eq!(gate.calls(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lookups_in_flight_are_capped_and_the_others_are_turned_away_at_once() {
        let (gate, _open_at_end) = Gate::closed();
        let resolver = Arc::new(Resolver::with_lookup(4, gate.lookup()));
        let mut waiting = Vec::new();
        let mut busy = 0;
        for i in 0..10 {
            let resolver = Arc::clone(&resolver);
            let name = format!("app{i}.example");
            // Each asks with a short timeout, as a client would; the lookups go on.
            match resolver
                .resolve(&name, LONG, Duration::from_millis(20))
                .await
            {
                Err(ResolveError::Busy { limit: 4 }) => busy += 1,
                Err(ResolveError::TimedOut { .. }) => waiting.push(name),
                other => panic!("{name}: {other:?}"),
            }
        }
        assert_eq!(busy, 6);
        assert_eq!(waiting.len(), 4);
        // Each lookup's thread may start after its asker gave up (a loaded machine).
        until("four lookups started", || gate.calls() == 4).await;
        assert_eq!(resolver.in_flight(), 4);
        // Asking again for a name in flight joins its lookup: no new one, no thread.
        let again = resolver
            .resolve(&waiting[0], LONG, Duration::from_millis(20))
            .await;
        assert!(
            matches!(again, Err(ResolveError::TimedOut { .. })),
            "{again:?}"
        );
        assert_eq!(gate.calls(), 4);
        gate.release();
        until("every lookup counted out", || resolver.in_flight() == 0).await;
        for name in &waiting {
            resolver.resolve(name, LONG, LONG).await.unwrap();
        }
        assert_eq!(gate.calls(), 4, "their answers were kept");
        resolver.resolve("app9.example", LONG, LONG).await.unwrap();
        assert_eq!(gate.calls(), 5);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cache_time_of_0_looks_up_every_time_and_a_failure_is_never_cached() {
        let (gate, _open_at_end) = Gate::closed();
        gate.release();
        let resolver = Arc::new(Resolver::with_lookup(32, gate.lookup()));
        for n in 1..=3 {
            resolver
                .resolve("app.example", Duration::ZERO, LONG)
                .await
                .unwrap();
            assert_eq!(gate.calls(), n);
        }
        for n in 4..=5 {
            let failed = resolver.resolve("bad.example", LONG, LONG).await;
            match failed {
                Err(ResolveError::Failed(e)) => {
                    assert!(e.to_string().contains("cannot resolve bad.example"), "{e}");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(gate.calls(), n);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_kept_for_the_cache_time() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let lookup: Lookup = Arc::new(move |_: &str| {
            counted.fetch_add(1, Relaxed);
            Ok(vec!["10.0.0.7".parse().unwrap()])
        });
        let resolver = Arc::new(Resolver::with_lookup(32, lookup));
        let cache = Duration::from_secs(30);
        resolver.resolve("app.example", cache, LONG).await.unwrap();
        tokio::time::advance(Duration::from_secs(29)).await;
        resolver.resolve("app.example", cache, LONG).await.unwrap();
        assert_eq!(calls.load(Relaxed), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        resolver.resolve("app.example", cache, LONG).await.unwrap();
        assert_eq!(calls.load(Relaxed), 2);
    }

    #[test]
    fn failures_are_logged_once_per_episode() {
        let mut name = Name::default();
        let now = Instant::now();
        let failed = |m: &str| -> LookupOutcome {
            Err(LookupFailure {
                raw_os_error: None,
                message: m.into(),
            })
        };
        assert_eq!(
            name.record(&failed("no such name"), now),
            Some(Change::Failing("no such name".into()))
        );
        assert_eq!(name.record(&failed("no such name"), now), None);
        assert_eq!(name.failed("took longer than 5s"), None);
        let ok: LookupOutcome = Ok(Arc::from(vec!["10.0.0.1".parse::<IpAddr>().unwrap()]));
        assert_eq!(
            name.record(&ok, now),
            Some(Change::Recovered("no such name".into()))
        );
        assert_eq!(name.record(&ok, now), None);
        assert!(name.failed("again").is_some(), "a new episode");
    }

    #[test]
    fn the_brokers_own_listeners_are_recognised() {
        let resolver = Resolver::new(32);
        resolver.set_listening(vec!["0.0.0.0:5000".parse().unwrap()]);
        assert_eq!(
            resolver.own_listener("127.0.0.1:5000".parse().unwrap()),
            Some("0.0.0.0:5000".parse().unwrap())
        );
        assert_eq!(
            resolver.own_listener("127.0.0.1:5001".parse().unwrap()),
            None
        );
        resolver.set_listening(vec!["127.0.0.1:5001".parse().unwrap()]);
        assert_eq!(
            resolver.own_listener("127.0.0.1:5000".parse().unwrap()),
            None
        );
    }
}
