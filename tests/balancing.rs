//! Selection through a broker in process: each policy's exact sequence and spread (weight 0
//! included), many concurrent clients, a large pool with letter ids, a server given by host
//! name, and the `MAX_CONNECTIONS` limit. Asserted on the broker's events and state.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use appbroker::Event;
use harness::*;
use tokio::net::TcpStream;

/// An ini over `servers` given as (server, weight), in this order, with `extra` lines.
fn weighted(servers: &[(&TestServer, u32)], extra: &str) -> String {
    let mut ini = ini_for(&[], extra);
    for (i, (server, weight)) in servers.iter().enumerate() {
        ini.push_str(&format!(
            "REMOTE_SERVER_{:02}={} {weight}\n",
            i + 1,
            server.ini()
        ));
    }
    ini
}

/// Waits until a stopped server's port refuses connections. `TestServer::stop` only asks its
/// accept task to end, so for a moment the port may still take a connection and then reset it.
async fn port_closed(server: &TestServer) {
    let closed = format!("{}'s port closed", server.name);
    poll(
        &closed,
        Duration::ZERO,
        DEADLINE,
        async || match TcpStream::connect(server.addr).await {
            Ok(_) => Err("still listening"),
            Err(_) => Ok(()),
        },
    )
    .await
}

/// How many of `names` each name got.
fn spread(names: &[String]) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for name in names {
        *counts.entry(name.as_str()).or_default() += 1;
    }
    counts
}

/// Asks `count` times in a row, each on a new connection, and returns who answered.
async fn ask_many(broker: &InProcess, count: usize) -> Vec<String> {
    let mut order = Vec::new();
    for _ in 0..count {
        order.push(ask(broker.addr()).await.unwrap());
    }
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_follows_the_smooth_weighted_sequence() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let mut ini = ini_for(&[], "SORT_METHOD=ROUND_ROBIN");
    ini.push_str(&format!(
        "REMOTE_SERVER_01={} 1\nREMOTE_SERVER_02={} 3\n",
        a.ini(),
        b.ini()
    ));
    let broker = InProcess::start(&ini).await;
    let mut order = Vec::new();
    for _ in 0..8 {
        order.push(ask(broker.addr()).await.unwrap());
    }
    assert_eq!(order, ["b", "a", "b", "b", "b", "a", "b", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_matches_nginx_for_weights_5_1_1() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    let ini = weighted(&[(&a, 5), (&b, 1), (&c, 1)], "SORT_METHOD=ROUND_ROBIN");
    let broker = InProcess::start(&ini).await;
    // nginx's documented example, twice over: the sequence repeats every sum of weights.
    let order = ask_many(&broker, 14).await;
    assert_eq!(
        order,
        [
            "a", "a", "b", "a", "c", "a", "a", "a", "a", "b", "a", "c", "a", "a"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_skips_a_weight_zero_server() {
    let a = TestServer::start("a").await;
    let drained = TestServer::start("drained").await;
    let c = TestServer::start("c").await;
    let ini = weighted(
        &[(&a, 1), (&drained, 0), (&c, 2)],
        "SORT_METHOD=ROUND_ROBIN",
    );
    let broker = InProcess::start(&ini).await;
    // Smooth round robin over a (1) and c (2) alone, as if the drained server were not there.
    let order = ask_many(&broker, 6).await;
    assert_eq!(order, ["c", "a", "c", "c", "a", "c"]);
    assert_eq!(drained.accepted(), 0, "a weight-0 server got a client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_spreads_held_connections_by_weight() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    let ini = weighted(&[(&a, 1), (&b, 1), (&c, 2)], "SORT_METHOD=CONNECTION");
    let broker = InProcess::start(&ini).await;
    let mut held = Vec::new();
    let mut names = Vec::new();
    for _ in 0..40 {
        let (stream, name) = hold(broker.addr()).await;
        held.push(stream);
        names.push(name);
    }
    assert_eq!(
        spread(&names),
        BTreeMap::from([("a", 10), ("b", 10), ("c", 20)])
    );
    // Each pick is the lightest per unit of weight, ties going to the first after the last
    // chosen: c (weight 2) takes two turns for every one of a and b.
    assert_eq!(names[..8], ["a", "b", "c", "c", "a", "b", "c", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_rotates_equal_weights_in_configuration_order() {
    // Started a, b, c but configured c, a, b: the rotation must follow the file, not the
    // order the servers were started or their ports.
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    let broker = InProcess::start(&ini_for(&[&c, &a, &b], "SORT_METHOD=CONNECTION")).await;

    // Held connections: every server is as loaded as the others after each full turn.
    let mut held = Vec::new();
    let mut names = Vec::new();
    for _ in 0..6 {
        let (stream, name) = hold(broker.addr()).await;
        held.push(stream);
        names.push(name);
    }
    assert_eq!(names, ["c", "a", "b", "c", "a", "b"]);
    drop(held);
    broker.events.wait_for_ended(6).await;

    // Short connections, each over before the next starts: all servers are always equal, and
    // the tie goes to the server after the one chosen last (b, the sixth above).
    let mut order = Vec::new();
    for closed in 7..=12 {
        order.push(ask(broker.addr()).await.unwrap());
        // A connection that is still counted would make its server heavier than the others.
        broker.events.wait_for_ended(closed).await;
    }
    assert_eq!(order, ["c", "a", "b", "c", "a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_gives_a_weight_zero_server_no_client() {
    let mut a = TestServer::start("a").await;
    let drained = TestServer::start("drained").await;
    let b = TestServer::start("b").await;
    let ini = weighted(&[(&a, 1), (&drained, 0), (&b, 1)], "SORT_METHOD=CONNECTION");
    let broker = InProcess::start(&ini).await;

    // Even while a and b carry connections and the drained server carries none, it is
    // never the lightest: weight 0 takes it out of selection altogether.
    let mut held = Vec::new();
    let mut names = Vec::new();
    for _ in 0..10 {
        let (stream, name) = hold(broker.addr()).await;
        held.push(stream);
        names.push(name);
    }
    assert_eq!(spread(&names), BTreeMap::from([("a", 5), ("b", 5)]));
    names = ask_many(&broker, 4).await;
    assert!(!names.contains(&"drained".to_string()), "{names:?}");
    assert_eq!(drained.accepted(), 0, "a weight-0 server got a client");

    // With a gone, b takes everything; the drained server still gets nothing.
    a.stop().await;
    port_closed(&a).await;
    names = ask_many(&broker, 4).await;
    assert_eq!(names, ["b", "b", "b", "b"]);
    assert_eq!(drained.accepted(), 0, "a weight-0 server got a client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_clients_are_all_served_intact() {
    const CLIENTS: usize = 200;
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &b], "SORT_METHOD=CONNECTION")).await;
    let addr = broker.addr();

    // All connect at once; each proves it reached a server with a line of its own.
    let mut connecting = Vec::new();
    for i in 0..CLIENTS {
        connecting.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let name = exchange(&mut stream, &format!("client {i:03} says hello"))
                .await
                .unwrap();
            (stream, name)
        }));
    }
    let mut held = Vec::new();
    for task in connecting {
        held.push(task.await.unwrap());
    }
    // All 200 are open together; counted from the moment each was chosen, they split evenly.
    let names: Vec<String> = held.iter().map(|(_, name)| name.clone()).collect();
    assert_eq!(spread(&names), BTreeMap::from([("a", 100), ("b", 100)]));

    // Then all talk at once, several lines each: every reply echoes its own client's line,
    // from the server the connection started on.
    let mut talking = Vec::new();
    for (i, (mut stream, first)) in held.into_iter().enumerate() {
        talking.push(tokio::spawn(async move {
            for round in 0..3 {
                let line = format!("client {i:03} round {round} {}", "x".repeat(i % 50));
                let name = exchange(&mut stream, &line).await.unwrap();
                assert_eq!(name, first, "client {i} moved server");
            }
        }));
    }
    for task in talking {
        task.await.unwrap();
    }
    assert_eq!(a.accepted() + b.accepted(), CLIENTS);
}

/// `REMOTE_SERVER` ids in the order an operator numbers a large pool: 01..99, then AA, AB...
fn ids(count: usize) -> Vec<String> {
    let letters = b'A'..=b'Z';
    (1..=99)
        .map(|n| format!("{n:02}"))
        .chain(letters.clone().flat_map(|first| {
            letters
                .clone()
                .map(move |second| format!("{}{}", first as char, second as char))
        }))
        .take(count)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_uses_all_120_servers_with_letter_ids() {
    let ids = ids(120);
    assert_eq!(ids[98..101], ["99", "AA", "AB"]);
    let mut servers = Vec::new();
    for id in &ids {
        servers.push(TestServer::start(id).await);
    }
    let mut ini = ini_for(&[], "SORT_METHOD=ROUND_ROBIN");
    for (id, server) in ids.iter().zip(&servers) {
        ini.push_str(&format!("REMOTE_SERVER_{id}={}\n", server.ini()));
    }
    let broker = InProcess::start(&ini).await;
    // Equal weights: one turn each, in configuration order, letter ids included.
    let order = ask_many(&broker, ids.len()).await;
    assert_eq!(order, ids);
    for server in &servers {
        assert_eq!(server.accepted(), 1, "server {}", server.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_address_under_two_ids_is_two_entries() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let broker = InProcess::start(&ini_for(&[&a, &a, &b], "SORT_METHOD=ROUND_ROBIN")).await;
    let notice = format!("{} is also REMOTE_SERVER_01", a.address());
    assert!(
        broker
            .notices
            .iter()
            .any(|n| n.message.starts_with(&notice)),
        "{:?}",
        broker.notices
    );
    let servers = broker.state().servers;
    assert_eq!(servers.len(), 3);
    assert_eq!(servers[0].address, servers[1].address);
    // Each id takes its own turn, so a gets two of every three clients.
    let order = ask_many(&broker, 6).await;
    assert_eq!(order, ["a", "a", "b", "a", "a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_given_by_host_name_is_reachable() {
    // TestServer listens on 127.0.0.1 only. Where `localhost` also resolves to ::1 (tried
    // first on many systems), that address refuses and the broker must go on to 127.0.0.1
    // within the same attempt, without blaming the server.
    let a = TestServer::start("a").await;
    let mut ini = ini_for(&[], "");
    ini.push_str(&format!("REMOTE_SERVER_01=localhost {}\n", a.addr.port()));
    let broker = InProcess::start(&ini).await;
    for _ in 0..3 {
        assert_eq!(ask(broker.addr()).await.unwrap(), "a");
    }
    let events = &broker.events;
    assert_eq!(
        events.count(|e| matches!(e, Event::Quarantined { .. } | Event::ConnectFailed { .. })),
        0,
        "a reachable host name was blamed:\n{}",
        events.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_refuses_clients_past_the_limit_until_one_leaves() {
    let a = TestServer::start("a").await;
    let broker = InProcess::start(&ini_for(&[&a], "MAX_CONNECTIONS=3")).await;
    let refusals = |broker: &InProcess| broker.events.count(|e| matches!(e, Event::Refused { .. }));
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(hold(broker.addr()).await.0);
    }

    // Past the limit a client is accepted and closed at once, never left hanging.
    for _ in 0..3 {
        let stream = TcpStream::connect(broker.addr()).await.unwrap();
        assert!(closed_at_once(stream).await, "a client past the limit");
    }
    assert_eq!(a.accepted(), 3, "a refused client reached the server");
    for stream in &mut held {
        assert_eq!(exchange(stream, "still here").await.unwrap(), "a");
    }
    let state = broker.state();
    assert_eq!((state.active, state.rejected, state.peak), (3, 3, 3));
    broker
        .events
        .wait_for_count("three refusals", 3, |e| matches!(e, Event::Refused { .. }))
        .await;
    assert_eq!(refusals(&broker), 3);

    // One leaves; once the broker has seen it go, the next client is served. Clients that
    // arrive before that are refused, and counted.
    drop(held.remove(0));
    let (_newcomer, more) = first_served(broker.addr()).await;
    let refused = 3 + more;
    assert_eq!(broker.state().rejected, refused);
    let refusal = |e: &Event| matches!(e, Event::Refused { .. });
    broker
        .events
        .wait_for_count("every refusal", refused as usize, refusal)
        .await;
    assert_eq!(refusals(&broker), refused as usize);
    assert_eq!(broker.state().accepted, 4);
}
