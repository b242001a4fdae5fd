//! Two brokers behind one virtual address held by keepalived (docs/high-availability.md),
//! tested for real: network namespaces stand in for the two broker hosts, a client host and a
//! server host on one LAN (tests/netns), each broker host runs the real appbroker and
//! keepalived with contrib/keepalived/'s files, and a client connects to the virtual address
//! every 50 ms. Each test breaks the active host one way (its broker killed, its cable pulled,
//! the two hosts cut from each other, its broker stopped) and checks that clients are served
//! again, by the other host, with no wrong answer, and that the host coming back takes nothing
//! back; each prints the takeover time it measured, for docs/high-availability.md. A browser
//! with the `[BALANCE_HTTP]` session cookie goes through a takeover and a split brain: through
//! either broker its requests reach the server the cookie names, and no broker sets it anew
//! while that server lives.
//!
//! They need root (namespaces), iproute2 and keepalived: `#[ignore]`d with that, run by
//! `.ci/run`, and failing (not passing untried) where namespaces cannot be made. They run one
//! at a time, so the times they print are not those of two pairs sharing the machine's cores.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod netns;

use std::net::Ipv4Addr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use netns::pair::{
    Attempt, Clients, HTTP_PORT, Outcome, PORT, Pair, Settings, WEB_SERVERS, web_server_id,
};
use nix::sys::signal::Signal;

/// One pair at a time (see the top of the file).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    // A test that failed holding it poisons it; the next one is no less valid.
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// contrib/keepalived's own settings.
const SHIPPED: Settings = Settings { advert_int: None };
/// The sub-second advert interval measured against the shipped 1 s.
const HALF_SECOND_ADVERTS: Settings = Settings {
    advert_int: Some("0.5"),
};

/// Seconds from `from` to `to`, signed, for printing.
fn secs(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64()
    } else {
        -(from - to).as_secs_f64()
    }
}

/// What the clients saw of one takeover, from the fault to the first client served again.
struct Takeover {
    /// When the fault was made.
    at: Instant,
    /// From the fault to the first answer relayed by the new host.
    served_again: Duration,
    /// The clients started after the fault that got no answer, with when they started.
    failed: Vec<(f64, String)>,
}

impl Takeover {
    /// Checks what the clients saw around a fault at `fault` that moved the address from the
    /// host at `old` to the one at `new`: no wrong answer ever; before the fault, clients
    /// served through `old`; from the first answer through `new` on, every client served
    /// through `new`. Call once clients have run a while after that first answer.
    fn check(attempts: &[Attempt], fault: Instant, old: Ipv4Addr, new: Ipv4Addr) -> Takeover {
        let wrong: Vec<_> = attempts
            .iter()
            .filter(|a| matches!(a.outcome, Outcome::Wrong(_)))
            .collect();
        assert!(wrong.is_empty(), "wrong answers: {wrong:#?}");
        assert!(
            attempts
                .iter()
                .any(|a| a.ended < fault && a.outcome.served_via(old)),
            "no client was served through {old} before the fault: {attempts:#?}"
        );
        let back = attempts
            .iter()
            .filter(|a| a.started > fault && a.outcome.served_via(new))
            .map(|a| a.ended)
            .min()
            .expect("a client served through the new host");
        let after: Vec<_> = attempts.iter().filter(|a| a.started > back).collect();
        assert!(
            after.len() >= 10,
            "too few clients after the takeover to judge it"
        );
        let strays: Vec<_> = after
            .iter()
            .filter(|a| !a.outcome.served_via(new))
            .collect();
        assert!(
            strays.is_empty(),
            "after the first client served through {new} (+{:.2}s), clients not served \
             through it: {strays:#?}",
            secs(fault, back)
        );
        let failed = attempts
            .iter()
            .filter(|a| a.started > fault)
            .filter_map(|a| match &a.outcome {
                Outcome::Failed(why) => Some((secs(fault, a.started), why.clone())),
                _ => None,
            })
            .collect();
        Takeover {
            at: fault,
            served_again: back - fault,
            failed,
        }
    }

    /// One line for the closing note: the time, and the clients that failed meanwhile.
    fn summary(&self) -> String {
        let mut kinds: Vec<(String, usize)> = Vec::new();
        for (_, why) in &self.failed {
            match kinds.iter_mut().find(|(k, _)| k == why) {
                Some((_, n)) => *n += 1,
                None => kinds.push((why.clone(), 1)),
            }
        }
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let last = self.failed.last().map_or(String::new(), |(at, _)| {
            format!("; the last failed client started at +{at:.2}s")
        });
        format!(
            "served again after {:.2}s; {} clients failed meanwhile ({}){last}",
            self.served_again.as_secs_f64(),
            self.failed.len(),
            if kinds.is_empty() {
                "none".to_owned()
            } else {
                kinds.join(", ")
            }
        )
    }
}

/// Lets a pseudo-random 0 to 19 clients (0 to 1 s) go by, so that the fault that follows falls
/// at any point of keepalived's 1 s check and advert periods: the pair's start aligns those
/// with the test's steps, which would otherwise measure the same point every run.
fn at_a_random_phase(clients: &Clients) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    clients.wait_count((nanos % 20) as usize, Instant::now());
}

/// Waits until a client started after `since` is served through `via`.
fn wait_served_via(pair: &Pair, clients: &Clients, since: Instant, via: Ipv4Addr) -> Attempt {
    clients.wait_for(
        &format!("a client served through {via}"),
        since,
        |a| a.outcome.served_via(via),
        || {
            format!(
                "clients since:\n{:#?}\n{}",
                clients
                    .attempts()
                    .iter()
                    .filter(|a| a.started > since)
                    .collect::<Vec<_>>(),
                pair.explain()
            )
        },
    )
}

/// Where every test starts: a pair, clients flowing every 50 ms, served through the active
/// host (`old`, the one a test breaks); `new` is the other.
struct Steady {
    pair: Pair,
    clients: Clients,
    old: usize,
    new: usize,
}

impl Steady {
    fn start(settings: &Settings) -> Steady {
        let pair = Pair::start(settings);
        let old = pair.active();
        let clients = pair.clients();
        wait_served_via(
            &pair,
            &clients,
            Instant::now(),
            pair.brokers[old].host.address,
        );
        Steady {
            pair,
            clients,
            old,
            new: 1 - old,
        }
    }

    /// The address of the host `index`.
    fn address(&self, index: usize) -> Ipv4Addr {
        self.pair.brokers[index].host.address
    }

    /// Applies `fault` to the pair at a random point of keepalived's periods, waits until a
    /// client is served through the other host and 20 more have come, and checks the
    /// takeover; prints what it measured after `what`.
    fn take_over(&mut self, what: &str, fault: impl FnOnce(&mut Pair, usize)) -> Takeover {
        at_a_random_phase(&self.clients);
        let at = Instant::now();
        fault(&mut self.pair, self.old);
        let (old, new) = (self.address(self.old), self.address(self.new));
        let first = wait_served_via(&self.pair, &self.clients, at, new);
        self.clients.wait_count(20, first.ended);
        let takeover = Takeover::check(&self.clients.attempts(), at, old, new);
        eprintln!(
            "ha_pair: {what} on host {}: {}",
            self.pair.brokers[self.old].name,
            takeover.summary()
        );
        takeover
    }

    /// Lets the host that failed come back with `repair`, waits until it is BACKUP again,
    /// then checks that 100 clients (5 s) are all served through the other host, which still
    /// holds the address alone (nopreempt). A host that preempts does so once its master-down
    /// interval has run out after its return (RFC 5798: it ignores the lower priority's
    /// adverts), 3.22 s at most here: the 5 s see it.
    fn comes_back(&mut self, repair: impl FnOnce(&mut Pair, usize)) {
        let (pair, old) = (&mut self.pair, self.old);
        let seen = pair.brokers[old].states().len();
        repair(pair, old);
        let back = netns::wait_for(
            &format!("host {} to return as BACKUP", pair.brokers[old].name),
            netns::DEADLINE,
            || {
                let states = pair.brokers[old].states();
                (states.len() > seen && states.last().map(String::as_str) == Some("BACKUP"))
                    .then(Instant::now)
            },
            || pair.explain(),
        );
        self.clients.wait_count(100, back);
        let new = self.address(self.new);
        let strays: Vec<_> = self
            .clients
            .attempts()
            .into_iter()
            .filter(|a| a.started > back && !a.outcome.served_via(new))
            .collect();
        assert!(
            strays.is_empty(),
            "with host {} back, clients not served through {new}: {strays:#?}\n{}",
            self.pair.brokers[old].name,
            self.pair.explain()
        );
        assert_eq!(self.pair.active(), self.new, "the address moved back");
    }
}

#[test]
#[ignore = "needs root and network namespaces (iproute2, keepalived)"]
fn a_killed_broker_hands_the_address_over_and_the_survivor_keeps_quarantining() {
    let _one = one_at_a_time();
    let mut steady = Steady::start(&SHIPPED);

    // (a) The active broker dies: its check fails, its keepalived gives the address up.
    steady.take_over("SIGKILL of the broker (advert_int 1)", |pair, old| {
        pair.brokers[old].kill_broker();
    });

    // (c) The survivor balances and quarantines on its own: a server that stops is
    // quarantined (through the survivor's JSON, asked at the virtual address), and no client
    // sees it.
    let Steady {
        pair, clients, new, ..
    } = &mut steady;
    let stopped = Instant::now();
    pair.servers.stop("s1");
    let server = |json: &serde_json::Value, port: &str| {
        json["servers"]
            .as_array()?
            .iter()
            .find(|s| s["server"].as_str().is_some_and(|s| s.ends_with(port)))
            .cloned()
    };
    let json = netns::wait_for(
        "s1 quarantined in the JSON asked through the virtual address",
        netns::DEADLINE,
        || {
            let json = pair.query_json(PORT);
            (server(&json, ":7001")?["inquarantine"] == true).then_some(json)
        },
        || pair.explain(),
    );
    assert_eq!(
        json["ID"].as_str(),
        Some(pair.brokers[*new].broker_pid().to_string().as_str()),
        "the JSON came from another broker than the survivor: {json:#}"
    );
    let s2 = server(&json, ":7002").expect("s2 in the JSON");
    assert_eq!(s2["inquarantine"], false, "{json:#}");
    clients.wait_count(20, stopped);
    let survivor = pair.brokers[*new].host.address;
    let unserved: Vec<_> = clients
        .attempts()
        .into_iter()
        .filter(|a| a.started > stopped)
        .filter(|a| {
            !matches!(&a.outcome, Outcome::Served { server, via } if server == "s2" && *via == survivor)
        })
        .collect();
    assert!(
        unserved.is_empty(),
        "with s1 stopped, clients not served by s2 through the survivor: {unserved:#?}"
    );

    // The broker comes back: its host returns as BACKUP and takes nothing back.
    steady.comes_back(|pair, old| pair.brokers[old].restart_broker());

    // Every AppServer down: both brokers are equally unable, and the check (liveness, not
    // READY) keeps the address where it is for three check rounds and more.
    let Steady {
        pair, clients, new, ..
    } = &mut steady;
    let states = pair.brokers[*new].states();
    pair.servers.stop("s2");
    clients.wait_count(60, Instant::now());
    assert_eq!(
        pair.active(),
        *new,
        "the address moved with every server down"
    );
    assert_eq!(
        pair.brokers[*new].states(),
        states,
        "host {} changed state with every server down\n{}",
        pair.brokers[*new].name,
        pair.explain()
    );
}

/// A browser's first request through the virtual address: its answer sets the broker's cookie,
/// which names the server that answered by its id in [BALANCE_HTTP]. Returns that server, the
/// cookie's value and the broker host that relayed the request.
fn open_session(pair: &Pair) -> (String, String, Ipv4Addr) {
    let first = pair.get("/first", None);
    let Outcome::Served { server, via } = first.outcome.clone() else {
        panic!("the first request was not served: {first:?}");
    };
    let cookie = first
        .set_cookie
        .expect("the first answer sets the broker's cookie");
    assert!(
        cookie.starts_with(&format!("{}.", web_server_id(&server))),
        "cookie {cookie} for {server}"
    );
    (server, cookie, via)
}

/// The requests of `attempts` that were answered by another server than `server`.
fn served_elsewhere<'a>(attempts: &'a [Attempt], server: &str) -> Vec<&'a Attempt> {
    attempts
        .iter()
        .filter(|a| matches!(&a.outcome, Outcome::Served { server: s, .. } if s != server))
        .collect()
}

#[test]
#[ignore = "needs root and network namespaces (iproute2, keepalived)"]
fn an_http_session_keeps_its_server_through_the_survivor_until_that_server_stops() {
    let _one = one_at_a_time();
    let mut steady = Steady::start(&SHIPPED);
    let (old, new) = (steady.address(steady.old), steady.address(steady.new));
    let served = |server: &str, via| Outcome::Served {
        server: server.to_owned(),
        via,
    };

    let (server, cookie, via) = open_session(&steady.pair);
    assert_eq!(
        via, old,
        "the first request did not go through the active host"
    );
    // That browser goes on, a request every 50 ms, each on a new connection with the cookie.
    let browser = steady.pair.browser(&cookie);
    wait_served_via(&steady.pair, &browser, Instant::now(), old);

    let takeover = steady.take_over(
        "SIGKILL of the broker, an HTTP session open (advert_int 1)",
        |pair, old| pair.brokers[old].kill_broker(),
    );

    // Through the survivor, which has never seen the cookie: the same server, since the
    // cookie names it by id and both hosts run the same file, and no new cookie, since the
    // server is alive (an answer that sets one is wrong). Before and after: that server only.
    let Steady {
        pair,
        new: survivor,
        ..
    } = &mut steady;
    let first = wait_served_via(pair, &browser, takeover.at, new);
    browser.wait_count(20, first.ended);
    let attempts = browser.stop();
    let seen = Takeover::check(&attempts, takeover.at, old, new);
    let elsewhere = served_elsewhere(&attempts, &server);
    assert!(
        elsewhere.is_empty(),
        "requests with the cookie of {server} served by another server: {elsewhere:#?}"
    );
    eprintln!(
        "ha_pair: the same takeover seen by a browser whose cookie names {server}: {}",
        seen.summary()
    );

    // The session's server stops: the survivor finds it refusing, quarantines it and moves the
    // session to the other one, whose id the new cookie names.
    pair.servers.stop(&server);
    let (other, _) = *WEB_SERVERS
        .iter()
        .find(|(s, _)| *s != server)
        .expect("a second web server");
    let moved = pair.get("/moved", Some(&cookie));
    assert_eq!(
        moved.outcome,
        served(other, new),
        "{moved:?}\n{}",
        pair.explain()
    );
    let moved_cookie = moved
        .set_cookie
        .expect("the moved session's answer sets a new cookie");
    assert!(
        moved_cookie.starts_with(&format!("{}.", web_server_id(other))),
        "cookie {moved_cookie} for {other}"
    );
    for i in 0..5 {
        let page = pair.get(&format!("/moved/{i}"), Some(&moved_cookie));
        assert_eq!(page.outcome, served(other, new), "{page:?}");
        assert_eq!(page.set_cookie, None, "a valid cookie set again: {page:?}");
    }
    let log = pair.brokers[*survivor].broker_text();
    assert_eq!(
        log.matches("session moved").count(),
        1,
        "the survivor did not log the move once:\n{log}"
    );
    // The survivor's HTTP balancer (its JSON, asked at the virtual address) has the stopped
    // server in quarantine, the other one serving, and one session moved.
    let port_of = |name: &str| {
        let (_, port) = WEB_SERVERS.iter().find(|(s, _)| *s == name).unwrap();
        format!(":{port}")
    };
    let (stopped_port, other_port) = (port_of(&server), port_of(other));
    let state = |json: &serde_json::Value, port: &str| {
        json["servers"]
            .as_array()?
            .iter()
            .find(|s| s["server"].as_str().is_some_and(|s| s.ends_with(port)))
            .map(|s| s["inquarantine"].clone())
    };
    let json = netns::wait_for(
        "the stopped web server quarantined in the JSON asked through the virtual address",
        netns::DEADLINE,
        || {
            let json = pair.query_json(HTTP_PORT);
            (state(&json, &stopped_port)? == true).then_some(json)
        },
        || pair.explain(),
    );
    assert_eq!(
        json["ID"].as_str(),
        Some(pair.brokers[*survivor].broker_pid().to_string().as_str()),
        "the JSON came from another broker than the survivor: {json:#}"
    );
    assert_eq!(state(&json, &other_port), Some(false.into()), "{json:#}");
    assert_eq!(json["http"]["sessions_moved"], 1, "{json:#}");
}

/// Pulls the active host's cable: the other host takes the address once the master-down
/// interval has passed; the cable plugged back, the first host returns as BACKUP.
fn cut_off(settings: &Settings, advert_int: f64) {
    let _one = one_at_a_time();
    let mut steady = Steady::start(settings);
    // keepalived-a.conf and -b.conf: priorities 200 and 150.
    let new = &steady.pair.brokers[steady.new];
    let priority = if new.name == "a" { 200.0 } else { 150.0 };
    let master_down = 3.0 * advert_int + (256.0 - priority) / 256.0 * advert_int;
    let what = format!(
        "cable pulled (advert_int {advert_int}, master-down interval of host {} \
         {master_down:.2}s, goal under {:.1}s)",
        new.name,
        3.0 * advert_int + 1.0
    );
    steady.take_over(&what, |pair, old| pair.lan.unplug(&pair.brokers[old].host));
    steady.comes_back(|pair, old| pair.lan.plug(&pair.brokers[old].host));
}

#[test]
#[ignore = "needs root and network namespaces (iproute2, keepalived)"]
fn a_host_cut_off_loses_the_address_after_the_master_down_interval() {
    cut_off(&SHIPPED, 1.0);
}

#[test]
#[ignore = "needs root and network namespaces (iproute2, keepalived)"]
fn a_host_cut_off_loses_the_address_sooner_with_half_second_adverts() {
    cut_off(&HALF_SECOND_ADVERTS, 0.5);
}

#[test]
#[ignore = "needs root and network namespaces (iproute2, keepalived)"]
fn a_stopping_broker_hands_the_address_over_before_it_refuses_anyone() {
    let _one = one_at_a_time();
    let mut steady = Steady::start(&SHIPPED);
    let old_address = steady.address(steady.old);
    let mut held = steady.pair.hold();
    let before = steady.pair.exchange(&mut held);

    // SIGTERM, as `systemctl stop` sends: PING answers 503 through SHUTDOWN_GRACE (5 s here),
    // the check fails twice, and the address moves while the broker still accepts.
    let takeover = steady.take_over("SIGTERM of the broker (SHUTDOWN_GRACE 5s)", |pair, old| {
        netns::signal(pair.brokers[old].broker_pid(), Signal::SIGTERM);
    });
    let refused: Vec<_> = takeover
        .failed
        .iter()
        .filter(|(_, why)| why.contains("refused"))
        .collect();
    assert!(
        refused.is_empty(),
        "clients refused: the listener closed before the address moved: {refused:?}\n{}",
        steady.pair.explain()
    );
    // A connection open through the old host is cut once the address has moved: its next
    // packet reaches the new host, which knows nothing of it and resets it. A takeover,
    // even a graceful one, ends the sessions of the host that gave the address up
    // (docs/high-availability.md says what SmartClient users see).
    let after = steady.pair.exchange(&mut held);
    assert!(
        before.served_via(old_address) && matches!(after, Outcome::Failed(_)),
        "a connection held across the takeover: before {before:?}, after {after:?}"
    );
    steady.pair.brokers[steady.old].wait_broker_exit();
}

#[test]
#[ignore = "needs root and network namespaces (iproute2, keepalived)"]
fn a_split_brain_serves_clients_through_either_host_and_ends_with_one() {
    let _one = one_at_a_time();
    let Steady { pair, clients, .. } = Steady::start(&SHIPPED);
    // A browser with an HTTP session sends its cookie every 50 ms throughout.
    let (server, cookie, _) = open_session(&pair);
    let browser = pair.browser(&cookie);

    // The two broker hosts stop hearing each other while both still reach everyone else:
    // the backup takes the address too.
    let split = Instant::now();
    let hosts = [&pair.brokers[0].host, &pair.brokers[1].host];
    pair.lan.isolate(&hosts, true);
    let both = netns::wait_for(
        "both hosts to hold the address",
        netns::DEADLINE,
        || {
            pair.brokers
                .iter()
                .all(|b| b.holds_address())
                .then(Instant::now)
        },
        || pair.explain(),
    );
    clients.wait_count(40, both);
    // Each master's gratuitous ARPs pull the client host to it in turn; heal while it
    // follows b, the host that is to give the address up, so the heal has clients to bring
    // back (b's second burst of ARPs, 5 s after it became master, pulls it back if a's
    // came later).
    let (a, b) = (pair.index_of("a"), pair.index_of("b"));
    let (a_address, b_address) = (pair.brokers[a].host.address, pair.brokers[b].host.address);
    netns::wait_for(
        "the client host to follow b",
        netns::DEADLINE,
        || {
            let last = clients
                .attempts()
                .into_iter()
                .rev()
                .find(|x| x.started > both)?;
            last.outcome.served_via(b_address).then_some(())
        },
        || pair.explain(),
    );
    let healed = Instant::now();
    pair.lan.isolate(&hosts, false);
    // The higher priority (keepalived-a.conf's 200) keeps the address, whoever served.
    assert_eq!(pair.active(), a, "host a did not keep the address");
    let first = wait_served_via(&pair, &clients, healed, a_address);
    clients.wait_count(20, first.ended);
    let attempts = clients.attempts();
    let heal = Takeover::check(&attempts, healed, b_address, a_address);

    let during = |attempts: &[Attempt]| -> (usize, usize, usize, usize) {
        let during: Vec<_> = attempts
            .iter()
            .filter(|x| x.started > split && x.started <= healed)
            .collect();
        let through = |address| {
            during
                .iter()
                .filter(|x| x.outcome.served_via(address))
                .count()
        };
        let failed = during
            .iter()
            .filter(|x| matches!(x.outcome, Outcome::Failed(_)))
            .count();
        (during.len(), through(a_address), through(b_address), failed)
    };
    let (count, via_a, via_b, failed) = during(&attempts);
    eprintln!(
        "ha_pair: split brain (both hosts held the address from +{:.2}s to +{:.2}s): {count} \
         clients, {via_a} through a, {via_b} through b, {failed} failed; healed while clients \
         went through b, host a alone again: {}",
        secs(split, both),
        secs(split, healed),
        heal.summary()
    );

    // The browser's requests went through either broker as its connections did, and each
    // broker sent them to the server the cookie names, none setting a new one.
    let pages = browser.stop();
    let wrong: Vec<_> = pages
        .iter()
        .filter(|x| matches!(x.outcome, Outcome::Wrong(_)))
        .collect();
    assert!(
        wrong.is_empty(),
        "browser requests answered wrong: {wrong:#?}"
    );
    let elsewhere = served_elsewhere(&pages, &server);
    assert!(
        elsewhere.is_empty(),
        "requests with the cookie of {server} served by another server: {elsewhere:#?}"
    );
    let (count, via_a, via_b, failed) = during(&pages);
    assert!(
        via_a > 0 && via_b > 0,
        "the browser's requests did not go through both hosts during the split brain \
         ({via_a} through a, {via_b} through b)"
    );
    eprintln!(
        "ha_pair: the same split brain seen by a browser whose cookie names {server}: {count} \
         requests, {via_a} through a, {via_b} through b, every answer from {server}, {failed} \
         failed"
    );
}
