//! TCP keepalive through the broker: its timers on both of the broker's sockets (read with
//! `ss`), and peers that vanish without a word in a network namespace, noticed by keepalive
//! and TCP_USER_TIMEOUT, and only then. These need `ss` (iproute2) or root (`ip`): they are
//! `#[ignore]`d with what they need, and fail when run without it (`.ci/run` runs them as
//! root).
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use harness::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `ss -tno` (established TCP sockets, numeric, with timers), or `None` when ss cannot run.
fn ss() -> Option<String> {
    let output = Command::new("ss").args(["-tno"]).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The `ss` line of the socket from `local` to `peer`.
fn socket_line(ss: &str, local: SocketAddr, peer: SocketAddr) -> Option<String> {
    ss.lines()
        .find(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.len() >= 5 && fields[3] == local.to_string() && fields[4] == peer.to_string()
        })
        .map(str::to_string)
}

/// The `ss` line of the socket from `local` to `peer` once nothing it sent awaits an
/// acknowledgement: while something does, ss shows the retransmission timer (`timer:(on,`)
/// in place of any keepalive timer.
async fn settled_socket_line(local: SocketAddr, peer: SocketAddr) -> String {
    let mut last = None;
    let every = Duration::from_millis(20);
    let settled = format!("a settled socket {local} -> {peer}");
    poll(&settled, every, DEADLINE, async || {
        let table = ss().expect("ss ran before");
        last = socket_line(&table, local, peer).or(last.take());
        match last.as_ref().filter(|l| !l.contains("timer:(on,")) {
            Some(line) => Ok(line.clone()),
            None => Err(format!("last seen {last:?} in:\n{table}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs ss (iproute2)"]
async fn keepalive_timers_run_on_both_of_the_brokers_sockets_unless_turned_off() {
    assert!(
        ss().is_some(),
        "`ss` (iproute2) is needed to show the sockets' timers: apt-get install iproute2"
    );
    let server = FaultServer::start("a", Behaviour::Healthy).await;
    let on = InProcess::start(&ini_over(&[server.ini()], SHORT_KEEPALIVE)).await;
    let off = InProcess::start(&ini_over(&[server.ini()], "KEEPALIVE_TIME=0")).await;

    for (broker, wanted) in [(&on, true), (&off, false)] {
        let (client, name) = hold(broker.addr()).await;
        assert_eq!(name, "a");
        let local = client.local_addr().unwrap();
        // The broker's server-side socket is the server's peer; the held connection is the
        // latest the server accepted.
        let to_server = server.connections().last().unwrap().peer;
        let client_side = settled_socket_line(broker.addr(), local).await;
        let server_side = settled_socket_line(to_server, server.addr).await;
        let ours = settled_socket_line(local, broker.addr()).await;
        for (what, line) in [("client side", &client_side), ("server side", &server_side)] {
            assert_eq!(
                line.contains("timer:(keepalive,"),
                wanted,
                "broker's {what} socket, keepalive {}: {line}",
                if wanted { "on" } else { "off" }
            );
        }
        // The test's own socket has no keepalive: the timer seen is the broker's setting.
        assert!(!ours.contains("keepalive"), "{ours}");
    }
}

/// A network namespace joined to this one by a veth pair, with a /30 between them; removed
/// (with the pair) when dropped, whatever happened in between.
struct Netns {
    name: String,
    outside_if: String,
    inside_if: String,
    outside: Ipv4Addr,
    inside: Ipv4Addr,
}

/// Runs `ip` (or another command) with `args`; its error output when it fails.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl Netns {
    /// Creates the namespace `tag` (0 to 3, one per test) and its link; `Err` (the reason)
    /// when namespaces cannot be made here (not root, no `ip`). A failure after that fails
    /// the test.
    fn create(tag: u32) -> Result<Netns, String> {
        let pid = std::process::id();
        // The pid and the tag pick the /30, so tests and test runs at once do not share one.
        let index = (pid * 4 + tag) & 0x3fff;
        let (third, fourth) = ((index >> 6) as u8, ((index & 63) * 4) as u8);
        let netns = Netns {
            name: format!("abfault{pid}{tag}"),
            outside_if: format!("abf{pid}{tag}o"),
            inside_if: format!("abf{pid}{tag}i"),
            outside: Ipv4Addr::new(10, 200, third, fourth + 1),
            inside: Ipv4Addr::new(10, 200, third, fourth + 2),
        };
        run("ip", &["netns", "add", &netns.name])?;
        // From here on `netns` is dropped on any failure, which removes what was made.
        let (ns, o, i) = (&netns.name, &netns.outside_if, &netns.inside_if);
        let (outside, inside) = (
            format!("{}/30", netns.outside),
            format!("{}/30", netns.inside),
        );
        let steps: [&[&str]; 6] = [
            &[
                "link", "add", o, "type", "veth", "peer", "name", i, "netns", ns,
            ],
            &["addr", "add", &outside, "dev", o],
            &["link", "set", o, "up"],
            &["-n", ns, "addr", "add", &inside, "dev", i],
            &["-n", ns, "link", "set", i, "up"],
            &["-n", ns, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if let Err(e) = run("ip", step) {
                panic!("setting up the namespace: {e}");
            }
        }
        Ok(netns)
    }

    /// Runs `make` on a thread that has entered the namespace: a socket belongs to the
    /// namespace it was made in, whoever uses it afterwards.
    fn inside<T: Send + 'static>(&self, make: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open the namespace");
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("enter the namespace");
            make()
        })
        .join()
        .expect("the namespace thread")
    }

    /// A listener on the inside address.
    fn listen_inside(&self) -> TcpListener {
        let inside = self.inside;
        let listener = self.inside(move || {
            let listener = std::net::TcpListener::bind((inside, 0)).expect("bind inside");
            listener.set_nonblocking(true).unwrap();
            listener
        });
        TcpListener::from_std(listener).unwrap()
    }

    /// A connection from inside the namespace to `to`.
    fn connect_from_inside(&self, to: SocketAddr) -> TcpStream {
        let stream = self.inside(move || {
            let stream = std::net::TcpStream::connect(to).expect("connect from inside");
            stream.set_nonblocking(true).unwrap();
            stream
        });
        TcpStream::from_std(stream).unwrap()
    }

    /// Makes everything inside vanish without a word: every packet in or out is dropped
    /// (iptables), or failing that the inside end of the link is taken down. Returns how.
    fn vanish(&self) -> &'static str {
        let dropped = ["INPUT", "OUTPUT"].iter().all(|chain| {
            run(
                "ip",
                &[
                    "netns", "exec", &self.name, "iptables", "-I", chain, "-j", "DROP",
                ],
            )
            .is_ok()
        });
        if dropped {
            return "iptables DROP inside the namespace";
        }
        run(
            "ip",
            &["-n", &self.name, "link", "set", &self.inside_if, "down"],
        )
        .expect("take the link down");
        "the namespace's end of the link taken down"
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["link", "del", &self.outside_if]);
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a network namespace (ip)"]
async fn a_vanished_server_is_noticed_by_keepalive_and_user_timeout_and_only_then() {
    let netns = Netns::create(0).unwrap_or_else(|why| {
        panic!(
            "cannot create a network namespace for a server to vanish in ({why}); this test \
             needs root (CAP_NET_ADMIN) and iproute2"
        )
    });
    let server = FaultServer::on("far", Behaviour::Healthy, netns.listen_inside());
    // time + interval x count = 1 + 1 x 2 = 3 s until a dead peer is given up.
    let on = InProcess::start(&ini_over(&[server.ini()], SHORT_KEEPALIVE)).await;
    let off = InProcess::start(&ini_over(&[server.ini()], "KEEPALIVE_TIME=0")).await;

    // Through each broker: one connection left idle (keepalive's case) and one that sends
    // after the server is gone, so the broker's bytes wait unacknowledged (TCP_USER_TIMEOUT's
    // case: keepalive does not probe while data is outstanding).
    let mut held = Vec::new();
    for broker in [&on, &off] {
        for _ in 0..2 {
            let (client, name) = hold(broker.addr()).await;
            assert_eq!(name, "far");
            held.push(client);
        }
    }
    let [mut on_idle, mut on_busy, off_idle, mut off_busy]: [TcpStream; 4] =
        held.try_into().unwrap();
    let how = netns.vanish();
    let vanished = Instant::now();
    on_busy.write_all(b"anyone there?\n").await.unwrap();
    off_busy.write_all(b"anyone there?\n").await.unwrap();

    for (what, client) in [("idle", &mut on_idle), ("busy", &mut on_busy)] {
        let read = wait_end(client).await;
        assert_end_seen(&format!("the {what} client with keepalive on"), &read);
        let ended = on.events.wait_for_end(client.local_addr().unwrap()).await;
        assert!(
            matches!(&ended.ended_by, End::Error(Side::Server, words) if words.contains("timed out")),
            "{what}: {ended:?}"
        );
    }
    eprintln!(
        "server vanished by {how}; the broker gave up on it after {:.1}s (time + interval x \
         count = 3s)",
        vanished.elapsed().as_secs_f64()
    );
    // Without keepalive, the same silence goes unnoticed past that. (The broker with
    // keepalive cannot have given up sooner; waiting here only makes sure of "past".)
    tokio::time::sleep_until((vanished + SHORT_KEEPALIVE_GIVES_UP_AFTER).into()).await;
    assert!(
        !ended_stream(&off_idle),
        "the idle client without keepalive was closed"
    );
    assert!(
        !ended_stream(&off_busy),
        "the busy client without keepalive was closed"
    );
    assert_eq!(
        off.events.ended(),
        0,
        "without keepalive nothing notices the vanished server; events:\n{}",
        off.events.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: a network namespace (ip)"]
async fn a_vanished_client_is_noticed_by_keepalive_and_its_server_connection_released() {
    let netns = Netns::create(1).unwrap_or_else(|why| {
        panic!(
            "cannot create a network namespace for a client to vanish in ({why}); this test \
             needs root (CAP_NET_ADMIN) and iproute2"
        )
    });
    let server = FaultServer::start("near", Behaviour::Healthy).await;
    // The brokers listen on the outside end of the link, where the namespace's clients can
    // reach them.
    let listening_outside = |extra: &str| {
        ini_over(&[server.ini()], extra).replace(
            "LOCAL_SERVER_ADDRESS=127.0.0.1",
            &format!("LOCAL_SERVER_ADDRESS={}", netns.outside),
        )
    };
    let on = InProcess::start(&listening_outside(SHORT_KEEPALIVE)).await;
    let off = InProcess::start(&listening_outside("KEEPALIVE_TIME=0")).await;

    // Through each broker: an idle client, and a busy one whose server keeps sending, so the
    // broker's bytes to the vanished client wait unacknowledged (TCP_USER_TIMEOUT's case).
    let mut held = Vec::new();
    for broker in [&on, &off] {
        let address = SocketAddr::from((netns.outside, broker.ports[0]));
        for busy in [false, true] {
            let mut client = netns.connect_from_inside(address);
            let name = exact_exchange(&mut client, "hello from inside", &["near"])
                .await
                .unwrap();
            assert_eq!(name, "near");
            let conn = server.connections().last().unwrap().clone();
            if busy {
                client.write_all(b"drip 200 50\n").await.unwrap();
                let mut tick = [0u8; 13];
                within("the first tick", client.read_exact(&mut tick))
                    .await
                    .unwrap();
                assert_eq!(&tick, b"near: tick 0\n");
            }
            held.push((client, conn));
        }
    }
    let how = netns.vanish();
    let vanished = Instant::now();

    // The broker with keepalive gives the clients up and releases their servers' connections.
    for (client, conn) in &held[..2] {
        let local = client.local_addr().unwrap();
        eventually("the server connection of a vanished client to end", || {
            conn.ended()
        })
        .await;
        let ended = on.events.wait_for_end(local).await;
        assert!(
            matches!(&ended.ended_by, End::Error(Side::Client, words) if words.contains("timed out")),
            "{ended:?}"
        );
    }
    eprintln!(
        "client vanished by {how}; the broker gave up on it after {:.1}s (time + interval x \
         count = 3s)",
        vanished.elapsed().as_secs_f64()
    );
    // Without keepalive, the servers' connections stay held for clients that are gone.
    tokio::time::sleep_until((vanished + SHORT_KEEPALIVE_GIVES_UP_AFTER).into()).await;
    for (_, conn) in &held[2..] {
        assert!(
            !conn.ended(),
            "a server connection of the broker without keepalive ended"
        );
    }
    assert_eq!(
        off.events.ended(),
        0,
        "without keepalive nothing notices the vanished clients; events:\n{}",
        off.events.text()
    );
}
