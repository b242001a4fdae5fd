//! The operator's log lines, through the real binary: the TOTVS quarantine line byte for
//! byte with the end in local time, the cause of a failure once per episode, the monitor's
//! round lines, the failure and release lines of clients, and the closing line of a broker's
//! own close; each with its level. (What the broker does is asserted on its events in the
//! other test files; here, how it says it.)

// The helpers below are not #[test] functions, so clippy's allowance for tests misses them;
// a panic in them is a failed assertion, as in tests/harness.
#![allow(clippy::expect_used)]

use std::time::Duration;

use harness::*;
use tokio::net::TcpStream;

/// One log line split as operators read it: `YYYY-MM-DD HH:MM:SS.mmm LEVEL message fields...`.
#[derive(Debug, Clone)]
struct Line {
    level: String,
    /// The message and the fields after it.
    text: String,
}

impl Line {
    /// Splits `raw`, or `None` when it does not start with the timestamp and a level.
    fn parse(raw: &str) -> Option<Line> {
        let (stamp, rest) = (raw.get(..23)?, raw.get(23..)?);
        let shape_ok = stamp
            .bytes()
            .zip("dddd-dd-dd dd:dd:dd.ddd".bytes())
            .all(|(c, p)| {
                if p == b'd' {
                    c.is_ascii_digit()
                } else {
                    c == p
                }
            });
        let rest = rest.strip_prefix(' ')?;
        let (level, text) = rest.split_once(' ')?;
        let levels = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"];
        if !shape_ok || !levels.contains(&level) {
            return None;
        }
        // The level is padded to five characters ("INFO  message").
        let text = text.trim_start_matches(' ');
        Some(Line {
            level: level.to_string(),
            text: text.to_string(),
        })
    }

    /// True when the message is exactly `message`, followed only by the event's fields.
    fn message_is(&self, message: &str) -> bool {
        self.text
            .strip_prefix(message)
            .is_some_and(|tail| tail.is_empty() || tail.starts_with(' '))
    }
}

/// Every line logged so far, each of which must have the operator's format.
fn lines(broker: &Broker) -> Vec<Line> {
    broker
        .logs()
        .iter()
        .map(|raw| {
            Line::parse(raw).unwrap_or_else(|| {
                panic!(
                    "line without `date time LEVEL message`: {raw:?}\n{}",
                    broker.log_text()
                )
            })
        })
        .collect()
}

/// Waits until a line satisfies `wanted`; returns it.
async fn wait_for_line(broker: &Broker, what: &str, wanted: impl Fn(&Line) -> bool) -> Line {
    until(what, async || {
        let line = lines(broker).into_iter().find(&wanted);
        line.ok_or_else(|| format!("log:\n{}", broker.log_text()))
    })
    .await
}

/// Waits for a line whose message is exactly `message`.
async fn wait_for_message(broker: &Broker, message: &str) -> Line {
    wait_for_line(broker, &format!("the message {message:?}"), |l| {
        l.message_is(message)
    })
    .await
}

/// A `putting server ... in quarantine` line: its start and stop epochs and its reason.
#[derive(Debug, PartialEq, Eq)]
struct Quarantined {
    start: u64,
    stop: u64,
    reason: String,
}

/// Parses `putting server <address> in quarantine start=<s> stop=<t> (<reason>)`.
fn quarantined(line: &Line, address: &str) -> Option<Quarantined> {
    let rest = line
        .text
        .strip_prefix(&format!("putting server {address} in quarantine start="))?;
    let (start, rest) = rest.split_once(" stop=")?;
    let (stop, rest) = rest.split_once(" (")?;
    let (reason, tail) = rest.split_once(')')?;
    if !(tail.is_empty() || tail.starts_with(' ')) {
        return None;
    }
    Some(Quarantined {
        start: start.parse().ok()?,
        stop: stop.parse().ok()?,
        reason: reason.to_string(),
    })
}

/// Servers a and b behind a broker whose monitor checks them every `interval` (quarantine
/// 120 s), once its first round has found both available.
async fn monitored_pair(interval: &str) -> (TestServer, TestServer, Broker) {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let ini = ini_for(
        &[&a, &b],
        &format!("MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL={interval}\nQUARANTINE_TIME=120"),
    );
    let broker = Broker::start(&ini).await;
    wait_for_message(
        &broker,
        "monitor: OK - 2 servers available, 0 servers unavailable",
    )
    .await;
    (a, b, broker)
}

/// The lines of `address`'s quarantines, as logged.
fn quarantine_lines(broker: &Broker, address: &str) -> Vec<Line> {
    lines(broker)
        .into_iter()
        .filter(|l| quarantined(l, address).is_some())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_s_cause_is_logged_once_per_quarantine_and_each_round_keeps_the_totvs_lines()
{
    let (_a, mut b, broker) = monitored_pair("200ms").await;
    let failed = format!("server {} failed the monitor check: ", b.address());
    let unavailable = format!("monitor: server {} unavailable", b.address());

    for episode in 1..=2 {
        b.stop().await;
        // Four rounds of the same quarantine: each one's TOTVS lines, the cause only once.
        eventually("four rounds with b in quarantine", || {
            quarantine_lines(&broker, &b.address()).len() >= 4 * episode
        })
        .await;
        let all = lines(&broker);
        let causes: Vec<&Line> = all.iter().filter(|l| l.text.starts_with(&failed)).collect();
        assert_eq!(
            causes.len(),
            episode,
            "the cause once per quarantine; log:\n{}",
            broker.log_text()
        );
        assert_eq!(causes[episode - 1].level, "ERROR");
        assert!(causes[episode - 1].text.contains("connection refused"));
        assert!(
            all.iter().filter(|l| l.message_is(&unavailable)).count() >= 4 * episode - 1,
            "`monitor: server ... unavailable` every round; log:\n{}",
            broker.log_text()
        );

        // Each quarantine line: the TOTVS part as it always was, then the end in local time.
        for line in quarantine_lines(&broker, &b.address()) {
            let q = quarantined(&line, &b.address()).expect("a quarantine line");
            let stop = chrono::DateTime::from_timestamp(q.stop as i64, 0)
                .expect("stop= is a time")
                .with_timezone(&chrono::Local);
            let expected = format!(
                "putting server {} in quarantine start={} stop={} (monitor) until={}",
                b.address(),
                q.start,
                q.stop,
                stop.format("%H:%M:%S")
            );
            assert!(line.message_is(&expected), "{line:?}, expected {expected}");
            assert_eq!(line.level, "WARN");
        }

        // Back, released; the next time it dies is a new quarantine, whose cause is logged.
        b.resume().await;
        let released = format!(
            "releasing server {} from quarantine (monitor check passed)",
            b.address()
        );
        eventually("b released", || broker.count_logs(&released) == episode).await;
    }
}

/// Waits for a line whose message is exactly `message`, at `level`.
async fn wait_for_message_at(broker: &Broker, level: &str, message: &str) {
    let line = wait_for_message(broker, message).await;
    assert_eq!(line.level, level, "{message}");
}

/// Waits for a line whose text starts with `start`, at `level`; returns its text.
async fn wait_for_start_at(broker: &Broker, level: &str, start: &str) -> String {
    let line = wait_for_line(broker, &format!("a line starting {start:?}"), |l| {
        l.text.starts_with(start)
    })
    .await;
    assert_eq!(line.level, level, "{}", line.text);
    line.text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_s_lines_say_each_step_at_its_level() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let ini = ini_for(
        &[&a, &b],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=200ms\nMONITOR_FALL=2\nMONITOR_RISE=2",
    );
    let broker = Broker::start(&ini).await;
    wait_for_message_at(
        &broker,
        "INFO",
        "monitor: OK - 2 servers available, 0 servers unavailable",
    )
    .await;
    b.stop().await;
    let failed = format!("server {} failed the monitor check", b.address());
    let first = wait_for_start_at(&broker, "WARN", &format!("{failed} (1 of MONITOR_FALL=2")).await;
    assert!(
        first.contains("(1 of MONITOR_FALL=2 before quarantine): connection refused"),
        "{first}"
    );
    let second = wait_for_start_at(&broker, "ERROR", &format!("{failed}: ")).await;
    assert!(
        second.contains(": connection refused (ECONNREFUSED"),
        "{second}"
    );
    wait_for_start_at(
        &broker,
        "WARN",
        &format!("putting server {} in quarantine", b.address()),
    )
    .await;
    wait_for_message_at(
        &broker,
        "INFO",
        "monitor: OK - 1 server available, 1 server unavailable",
    )
    .await;
    wait_for_message_at(
        &broker,
        "WARN",
        &format!("monitor: server {} unavailable", b.address()),
    )
    .await;

    a.stop().await;
    wait_for_message_at(
        &broker,
        "INFO",
        "monitor: OK - 0 servers available, 2 servers unavailable",
    )
    .await;
    wait_for_message_at(
        &broker,
        "ERROR",
        "monitor: attention, there are no remote servers available",
    )
    .await;

    b.resume().await;
    wait_for_message_at(
        &broker,
        "INFO",
        &format!(
            "server {} passed the monitor check (1 of MONITOR_RISE=2 to leave quarantine)",
            b.address()
        ),
    )
    .await;
    wait_for_message_at(
        &broker,
        "INFO",
        &format!(
            "releasing server {} from quarantine (monitor check passed)",
            b.address()
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_s_failures_and_the_release_it_brings_are_logged() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    // Monitoring disabled and a long quarantine: only clients change anything.
    let broker = Broker::start(&ini_for(&[&a, &b], "QUARANTINE_TIME=120")).await;
    a.stop().await;
    b.stop().await;
    let client = TcpStream::connect(broker.addr()).await.expect("connect");
    assert!(closed_at_once(client).await, "the client was not closed");
    for server in [&a, &b] {
        let error = wait_for_start_at(
            &broker,
            "ERROR",
            &format!("cannot connect to server {}: ", server.address()),
        )
        .await;
        for needed in [
            "connection refused",
            "ECONNREFUSED",
            "Windows 10061/1225",
            "the server is down, or the address or port is wrong; the cause is on the \
             server's side or in the configuration, not the broker's",
            "client=",
        ] {
            assert!(error.contains(needed), "{needed:?} in {error}");
        }
        // Whose side the cause is on, in words, not our vocabulary.
        assert!(!error.contains("points at"), "{error}");
        let quarantine = wait_for_start_at(
            &broker,
            "WARN",
            &format!("putting server {} in quarantine start=", server.address()),
        )
        .await;
        assert!(quarantine.contains(" (connect) until="), "{quarantine}");
    }
    wait_for_start_at(
        &broker,
        "ERROR",
        "no remote servers available; the client is closed",
    )
    .await;

    a.resume().await;
    assert_eq!(ask(broker.addr()).await.expect("client served"), "a");
    wait_for_message_at(
        &broker,
        "INFO",
        &format!(
            "releasing server {} from quarantine (a client connected to it)",
            a.address()
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_whose_time_is_up_is_logged_as_such() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let broker = Broker::start(&ini_for(&[&a, &b], "QUARANTINE_TIME=300ms")).await;
    b.stop().await;
    let quarantine = format!("putting server {} in quarantine", b.address());
    for _ in 0..10 {
        assert_eq!(ask(broker.addr()).await.expect("client served"), "a");
        if broker.has_log(&quarantine) {
            break;
        }
    }
    broker.wait_for_log(&quarantine).await;
    b.resume().await;
    wait_for_message_at(
        &broker,
        "INFO",
        &format!(
            "releasing server {} from quarantine (quarantine time is up)",
            b.address()
        ),
    )
    .await;
}

/// A connection that carries no byte either way (a browser's speculative connection to a TCP
/// balancer's page, forwarded once `QUERY_SNIFF_TIMEOUT` passes; a port check held open) is
/// counted as any, and its closing line is at debug, whether the client closed it or
/// `IDLE_TIMEOUT` did; one that carried bytes keeps its line at info.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_byte_either_way_is_told_at_debug() {
    let server = TestServer::start("a").await;
    let broker = Broker::spawn(
        &ini_for(
            &[&server],
            "LOG_CONNECTIONS=1\nQUERY_SNIFF_TIMEOUT=50ms\nIDLE_TIMEOUT=1s",
        ),
        &["--log-level", "debug"],
    );
    broker.wait_for_log("broker ready").await;
    let closing = |client: std::net::SocketAddr| {
        move |l: &Line| {
            l.text.starts_with("connection closed")
                && format!("{} ", l.text).contains(&format!("client={client} "))
        }
    };
    // Silent, then closed by the client once forwarded.
    let silent = TcpStream::connect(broker.addr()).await.expect("connect");
    let first = silent.local_addr().expect("address");
    eventually("the silent client forwarded", || server.accepted() == 1).await;
    drop(silent);
    let line = wait_for_line(&broker, "the silent client's closing line", closing(first)).await;
    assert_eq!(line.level, "DEBUG", "{}", line.text);
    assert!(
        line.message_is("connection closed without a byte either way")
            && line.text.contains("ended_by=client")
            && line.text.contains(&format!("server={}", server.address())),
        "{}",
        line.text
    );
    // Silent until IDLE_TIMEOUT closes it.
    let idle = TcpStream::connect(broker.addr()).await.expect("connect");
    let second = idle.local_addr().expect("address");
    let line = wait_for_line(&broker, "the idle client's closing line", closing(second)).await;
    assert_eq!(line.level, "DEBUG", "{}", line.text);
    assert!(line.text.contains("ended_by=idle-timeout"), "{}", line.text);
    drop(idle);
    // Counted as any connection: its server took it.
    let status = query_json(broker.addr()).await;
    assert_eq!(status["servers"][0]["total_connections"], 2, "{status:#}");
    // A client that spoke: at info, as always.
    let (spoke, _) = hold(broker.addr()).await;
    let third = spoke.local_addr().expect("address");
    drop(spoke);
    let line = wait_for_line(
        &broker,
        "the speaking client's closing line",
        closing(third),
    )
    .await;
    assert_eq!(line.level, "INFO", "{}", line.text);
    assert!(line.message_is("connection closed"), "{}", line.text);
    let said: Vec<Line> = lines(&broker)
        .into_iter()
        .filter(|l| closing(first)(l) || closing(second)(l))
        .collect();
    assert_eq!(said.len(), 2, "one line each: {said:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_close_is_logged_even_without_log_connections() {
    let server = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(
        &[&server],
        "IDLE_TIMEOUT=500ms\nLOG_CONNECTIONS=0",
    ))
    .await;
    let (client, name) = hold(broker.addr()).await;
    assert_eq!(name, "a");
    let local = client.local_addr().expect("address");
    assert!(
        closed_at_once(client).await,
        "the idle client was not closed"
    );
    let closed = wait_for_line(&broker, "the closing line", |l| {
        l.text.starts_with("connection closed")
            && format!("{} ", l.text).contains(&format!("client={local} "))
    })
    .await;
    assert_eq!(closed.level, "INFO", "{}", closed.text);
    for needed in [
        "ended_by=idle-timeout",
        "bytes_from_client=5 bytes_to_client=8",
        &format!("server={}", server.address()),
    ] {
        assert!(
            closed.text.contains(needed),
            "{needed:?} in {}",
            closed.text
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_is_logged_once_per_episode_with_the_count_refused() {
    const REACHED: &str = "MAX_CONNECTIONS (3) reached";
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&a], "MAX_CONNECTIONS=3")).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(hold(broker.addr()).await.0);
    }
    for _ in 0..3 {
        let stream = TcpStream::connect(broker.addr()).await.expect("connect");
        assert!(closed_at_once(stream).await, "a client past the limit");
    }
    let reached = broker.wait_for_log(REACHED).await;
    assert!(reached.contains(" WARN "), "{reached}");

    // One leaves; clients that arrive before the broker has seen it go are refused and
    // counted in the same episode.
    drop(held.remove(0));
    let (newcomer, more) = first_served(broker.addr()).await;
    let mut refused = 3 + more;
    // At the edge of the limit admissions and refusals alternate, so the episode ends only
    // when a client is admitted after a quiet second: keep admitting (and letting go) one
    // client at a time until the line says so. A client that comes before the broker has seen
    // the last one go is still refused, and counted in the episode.
    drop(newcomer);
    let every = Duration::from_millis(100);
    poll(
        "the end of the episode logged",
        every,
        DEADLINE,
        async || {
            match served(broker.addr()).await {
                Some(stream) => drop(stream),
                None => refused += 1,
            }
            let ended = format!(
                "accepting clients again: {refused} refused while MAX_CONNECTIONS was reached"
            );
            broker
                .has_log(&ended)
                .then_some(())
                .ok_or_else(|| broker.log_text())
        },
    )
    .await;
    assert_eq!(
        broker.count_logs(REACHED),
        1,
        "one line per episode, not per refused client:\n{}",
        broker.log_text()
    );

    // Full again: a new episode, a new line.
    while held.len() < 3 {
        // The last client let go may still count for a moment.
        match served(broker.addr()).await {
            Some(stream) => held.push(stream),
            None => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let stream = TcpStream::connect(broker.addr()).await.expect("connect");
    assert!(closed_at_once(stream).await, "a client past the limit");
    broker.wait_for_logs(REACHED, 2).await;
}

/// Rewrites the broker's file with `text` (placeholders filled) and sends SIGHUP.
fn sighup_with(broker: &Broker, text: &str) {
    let text = fill_placeholders(text, &broker.ports, broker.dir.path());
    std::fs::write(&broker.config_path, text).expect("rewrite the ini");
    broker.signal(nix::sys::signal::Signal::SIGHUP);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_lines_say_what_changed_what_was_refused_and_what_is_cut() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let single = ini_for(&[&a], "").replace("SHUTDOWN_TIMEOUT=5", "SHUTDOWN_TIMEOUT=1s");
    let web = format!(
        "[BALANCE_WEB_SERVICES]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT2@\n\
         MONITORING_TYPE=DISABLED\nREMOTE_SERVER_01={}\n",
        b.ini()
    );
    let broker = Broker::start(&format!("{single}{web}")).await;

    // An invalid file: every error at ERROR, naming file and line, then the rejection.
    sighup_with(
        &broker,
        &single.replace("SHUTDOWN_TIMEOUT=1s", "SHUTDOWN_TIMEOUT=forever"),
    );
    wait_for_message_at(
        &broker,
        "ERROR",
        "reload rejected: the running configuration stays",
    )
    .await;
    let file = broker.config_path.display().to_string();
    wait_for_start_at(
        &broker,
        "ERROR",
        &format!("{file}:2: [General] SHUTDOWN_TIMEOUT: `forever`"),
    )
    .await;

    // A removed balancer with a connection open: closed, then cut after SHUTDOWN_TIMEOUT.
    let (held, _) = hold(broker.addr2()).await;
    sighup_with(&broker, &single);
    wait_for_message_at(
        &broker,
        "INFO",
        "configuration reloaded: [BALANCE_WEB_SERVICES] removed",
    )
    .await;
    wait_for_message_at(
        &broker,
        "INFO",
        "[BALANCE_WEB_SERVICES] removed: listener closed; its 1 connection may take up to 1s \
         to finish",
    )
    .await;
    wait_for_message_at(
        &broker,
        "WARN",
        "[BALANCE_WEB_SERVICES] removed: cutting 1 connection still open",
    )
    .await;
    assert!(closed_at_once(held).await, "the held client must be cut");

    // A listen address that cannot be bound: said at ERROR, the old one kept.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("address").port();
    sighup_with(&broker, &single.replace("@PORT@", &port.to_string()));
    let error = wait_for_start_at(
        &broker,
        "ERROR",
        &format!("cannot listen on 127.0.0.1:{port} for [BALANCE_SMART_CLIENT_DESKTOP]: "),
    )
    .await;
    assert!(
        error.ends_with(&format!(
            "[BALANCE_SMART_CLIENT_DESKTOP] keeps listening on {}",
            broker.addr()
        )),
        "{error}"
    );
    // Once it is free, the move is said at INFO.
    drop(taken);
    broker.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for_message_at(
        &broker,
        "INFO",
        &format!(
            "[BALANCE_SMART_CLIENT_DESKTOP] now listens on 127.0.0.1:{port} (was {})",
            broker.addr()
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closed_line_counts_the_bytes_each_way_and_who_ended() {
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&a], "")).await;
    let mut client = TcpStream::connect(broker.addr()).await.expect("connect");
    let local = client.local_addr().expect("address");
    // Sent: "hello\n" (6) and "second line\n" (12) = 18.
    // Received: "a: hello\n" (9) and "a: second line\n" (15) = 24.
    assert_eq!(exchange(&mut client, "hello").await.expect("connect"), "a");
    assert_eq!(
        exchange(&mut client, "second line").await.expect("connect"),
        "a"
    );
    drop(client);

    let needle = format!("client={local} ");
    let line = wait_for_line(&broker, "the closing line", |l| {
        l.text.starts_with("connection closed") && format!("{} ", l.text).contains(&needle)
    })
    .await;
    assert_eq!(line.level, "INFO");
    let line = line.text;
    assert!(
        line.contains("bytes_from_client=18 bytes_to_client=24 ended_by=client"),
        "{line}"
    );
    assert!(line.contains(&format!("server={}", a.address())), "{line}");
}

/// The start of a query that never ends.
const UNFINISHED: &[u8] = b"GET /TOTVS_BROKER_QUERY/PING HTTP/1.1\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_query_places_is_logged_once_per_episode() {
    let a = TestServer::start("a").await;
    let broker = Broker::start(&ini_for(&[&a], "QUERY_MAX_CONNECTIONS=1")).await;
    let (held, _) = hold_query_places(broker.addr(), &[UNFINISHED]).await;
    for _ in 0..5 {
        let answer = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/PING", &[]).await;
        assert_eq!(answer.status, 503);
    }
    broker
        .wait_for_log("QUERY_MAX_CONNECTIONS (1) reached")
        .await;
    assert_eq!(broker.count_logs("QUERY_MAX_CONNECTIONS (1) reached"), 1);
    drop(held);
    // The episode ends with the first query answered after a quiet second.
    let every = Duration::from_millis(50);
    poll("the episode's end", every, DEADLINE, async || {
        if broker.has_log("answering queries again") {
            return Ok(());
        }
        let _ = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/PING", &[]).await;
        Err(format!("log:\n{}", broker.log_text()))
    })
    .await;
    let line = broker.wait_for_log("answering queries again").await;
    assert!(line.contains("refused"), "{line}");
    assert_eq!(broker.count_logs("QUERY_MAX_CONNECTIONS (1) reached"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_sessions_are_logged_once_per_server_episode_with_their_count() {
    const MOVED: &str = "session moved: its server cannot take it; cookie set anew";
    const COUNTED: &str =
        "sessions moved off their server: 2 in this episode, the first one logged";
    let mut servers = web_stand_ins().await;
    let (one, two) = (servers[0].address, servers[1].address);
    let broker = Broker::start(&format!(
        "[General]\n{}[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
         MONITORING_TYPE=DISABLED\nLOG_REQUESTS=1\nREMOTE_SERVER_01={} {}\n\
         REMOTE_SERVER_02={} {}\n",
        session_secret_line(),
        one.ip(),
        one.port(),
        two.ip(),
        two.port()
    ))
    .await;
    // Two sessions on 01, then 01 stops.
    let cookies = [0, 1].map(|n| format!("TOTVS_BROKER_SH_001={}", signed_cookie("01", n)));
    for cookie in &cookies {
        let answer = http_get(broker.addr(), "/", &[("Cookie", cookie)]).await;
        assert_eq!(answer.status, 200);
    }
    servers[0].stop();
    // The stand-in's connections close a moment after it stops: until the broker has seen
    // its kept-alive one close, a request could still be answered on it.
    let open = format!(
        "appbroker_http_pool_open_connections{{balancer=\"BALANCE_HTTP\",server=\"{one}\"}} 0"
    );
    let every = Duration::from_millis(20);
    poll(
        "01's pooled connection closed",
        every,
        DEADLINE,
        async || {
            let metrics = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/METRICS", &[]).await;
            let closed = metrics.text().lines().any(|line| line == open);
            closed.then_some(()).ok_or("")
        },
    )
    .await;
    // Each old cookie three times, as a client that ignores the new one would: one move
    // each (the first), the next ones balanced like any unknown cookie. Two moves off 01 in
    // one episode: the first logged, the second counted.
    for cookie in &cookies {
        for _ in 0..3 {
            let answer = http_get(broker.addr(), "/", &[("Cookie", cookie)]).await;
            assert_eq!(answer.status, 200);
            assert!(answer.header("set-cookie").unwrap().contains("=02."));
        }
    }
    // Every request's access line written: every move line before it too.
    broker.wait_for_logs("INFO  request ", 8).await;
    let moved: Vec<Line> = lines(&broker)
        .into_iter()
        .filter(|l| l.message_is(MOVED))
        .collect();
    assert_eq!(moved.len(), 1, "{}", broker.log_text());
    for line in &moved {
        assert_eq!(line.level, "WARN");
        assert!(
            line.text.contains(&format!("from=\"01 ({one})\""))
                && line.text.contains(&format!("server={two}")),
            "{}",
            line.text
        );
    }
    // A quiet second ends the episode: its count.
    let line = broker.wait_for_log(COUNTED).await;
    assert!(
        line.contains("INFO") && line.contains(&format!("from=\"01 ({one})\"")),
        "{line}"
    );
    assert!(line.contains("moved=2"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_request_target_cannot_reach_a_terminal_through_the_access_log() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let servers = web_stand_ins().await;
    let one = servers[0].address;
    let broker = Broker::start(&format!(
        "[General]\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
         MONITORING_TYPE=DISABLED\nLOG_REQUESTS=1\nREMOTE_SERVER_01={} {}\n",
        one.ip(),
        one.port(),
    ))
    .await;
    // A target with a C1 control (CSI, U+009B, as UTF-8) and an ESC: bytes a request line
    // may carry past a parser that takes any byte above 0x7f.
    let mut stream = TcpStream::connect(broker.addr()).await.expect("connect");
    stream
        .write_all(b"GET /page\xc2\x9b2J\x1b[31m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut answer = Vec::new();
    let _ = within("the answer", stream.read_to_end(&mut answer)).await;
    assert!(answer.starts_with(b"HTTP/1.1 400 "), "{answer:?}");
    let line = broker.wait_for_log("/page").await;
    assert!(line.contains(r" path=/page\u{9b}2J\x1b[31m "), "{line}");
    assert!(!line.contains('\u{9b}') && !line.contains('\x1b'), "{line}");
}

/// A raw server of the test's own: `/ws` is switched to `websocket` (`101`), then every byte
/// echoed until the broker half-closes, then closed in turn; any other path is `200 ok`.
async fn upgrading_server() -> std::net::SocketAddr {
    use tokio::io::AsyncWriteExt;
    let (addr, _) = raw_origin(|mut stream, _| async move {
        let head = read_head(&mut stream).await;
        if !head.starts_with(b"GET /ws ") {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
            return;
        }
        let switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                       Connection: Upgrade\r\n\r\n";
        if stream.write_all(switch).await.is_ok() {
            let (mut from, mut to) = stream.split();
            let _ = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.shutdown().await;
        }
    })
    .await;
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websockets_access_line_is_written_at_its_end_with_its_bytes_and_no_error() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let broker = Broker::start(&http_ini(&[upgrading_server().await], "")).await;
    let mut client = TcpStream::connect(broker.addr()).await.expect("connect");
    let upgrade = "GET /ws HTTP/1.1\r\nHost: app.example\r\nConnection: Upgrade\r\n\
                   Upgrade: websocket\r\n\r\n";
    client.write_all(upgrade.as_bytes()).await.expect("write");
    let head = within("the 101", read_head(&mut client)).await;
    assert!(
        head.starts_with(b"HTTP/1.1 101 "),
        "{}",
        head.escape_ascii()
    );
    client.write_all(b"hello, tunnel").await.expect("write");
    let mut echoed = [0u8; 13];
    client.read_exact(&mut echoed).await.expect("the echo");
    // Both sides close without an error: a clean end.
    client.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    within("the close", client.read_to_end(&mut rest))
        .await
        .expect("read");
    let line = wait_for_line(&broker, "the WebSocket's access line", |l| {
        l.message_is("request") && l.text.contains("path=/ws ")
    })
    .await;
    assert_eq!(line.level, "INFO", "{}", line.text);
    assert!(
        line.text
            .contains("status=101 bytes_from_client=13 bytes_to_client=13 "),
        "{}",
        line.text
    );
    assert!(!line.text.contains("error="), "{}", line.text);
    wait_for_line(&broker, "the closing line", |l| {
        l.message_is("connection closed")
    })
    .await;
    let requests = lines(&broker)
        .into_iter()
        .filter(|l| l.message_is("request"))
        .count();
    assert_eq!(requests, 1, "one access line: {}", broker.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_no_trusted_chain_names_is_written_unknown() {
    let extra = "HTTP_TRUSTED_PROXIES=127.0.0.1";
    let broker = Broker::start(&http_ini(&[upgrading_server().await], extra)).await;
    let request =
        "GET /page HTTP/1.1\r\nHost: app.example\r\nX-Forwarded-For: 203.0.113.9, unknown\r\n\r\n";
    let answer = raw_request(broker.addr(), request.as_bytes()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let line = wait_for_line(&broker, "the access line", |l| {
        l.message_is("request") && l.text.contains("path=/page ")
    })
    .await;
    assert!(line.text.contains("client=unknown "), "{}", line.text);
}
