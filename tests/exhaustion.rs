//! Exhaustion: the broker out of file descriptors keeps serving whom it can, blames no server,
//! says so once, recovers by itself and never exits; and a server that never reads cannot make
//! it buffer without bound.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::{
    Broker, DEADLINE, HttpConnection, Origin, TestServer, binary, eventually, free_port, http_ini,
    ini_for, poll, query_json,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The broker's open-file limit in the exhaustion test, soft and hard.
const NOFILE: u64 = 256;
/// Clients arriving at once: more than `NOFILE / 2` (each served client takes two descriptors).
const ARRIVING: usize = 400;

/// Starts the broker on `ini` through `sh -c 'ulimit -n 256 && exec ...'`, as an operator's
/// service manager would lower it, and waits for `broker ready`.
async fn start_limited(ini: &str, nofile: u64) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    let text = ini.replace("@PORT@", &ports[0].to_string());
    let config_path = dir.path().join("appserver.ini");
    std::fs::write(&config_path, text).unwrap();
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -n {nofile} && exec \"$0\" --config \"$1\""))
        .arg(binary())
        .arg(&config_path);
    let broker = Broker::spawn_command(dir, config_path, ports, command);
    broker.wait_for_log("broker ready").await;
    broker
}

/// The `Max open files` soft and hard limits of a process.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].parse().unwrap(), fields[4].parse().unwrap())
}

/// Descriptors a process has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Descriptors a process has open numbered below `limit`: the ones its open-file limit
/// counts (a descriptor it inherited above the limit, as from the test harness, takes none of
/// its room).
fn fds_below(pid: u32, limit: u64) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .filter(|&fd| fd < limit)
        .count() as u64
}

/// A process's resident memory in bytes (`VmRSS`).
fn vm_rss(pid: u32) -> u64 {
    harness::status_bytes(&pid.to_string(), "VmRSS")
}

/// What happened to one arriving client.
enum Arrival {
    /// Its line came back exactly, prefixed by the server's name; the connection is held.
    Served(TcpStream),
    /// Closed (or reset) by the broker before any byte of an answer.
    Closed,
    /// Bytes came back that are not its line: must never happen.
    Corrupted(String),
    /// No answer within the deadline.
    Waiting,
}

/// Connects through `addr`, sends a line of its own and reads the answer.
async fn arrive(addr: SocketAddr, n: usize, names: &[String]) -> Arrival {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return Arrival::Closed;
    };
    let line = format!("client {n:03} {}\n", "x".repeat(n % 61));
    if stream.write_all(line.as_bytes()).await.is_err() {
        return Arrival::Closed;
    }
    let mut reply = Vec::new();
    let mut buf = [0u8; 256];
    let answered = tokio::time::timeout(DEADLINE * 3, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => {
                    reply.extend_from_slice(&buf[..k]);
                    if reply.ends_with(b"\n") {
                        return true;
                    }
                }
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&reply).to_string();
    match answered {
        Err(_) => Arrival::Waiting,
        Ok(false) if reply.is_empty() => Arrival::Closed,
        Ok(false) => Arrival::Corrupted(text),
        Ok(true) if names.iter().any(|name| text == format!("{name}: {line}")) => {
            Arrival::Served(stream)
        }
        Ok(true) => Arrival::Corrupted(text),
    }
}

/// Clients waiting in the accept queues of the listeners on `port` (the `rx_queue` of each
/// listening socket in /proc/net/tcp): connected as far as the kernel is concerned, not yet
/// accepted. Every listener of the port counts: each worker has its own (SO_REUSEPORT), and
/// the kernel spreads arriving clients over them.
fn accept_queue(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f[1].ends_with(&local) && f[3] == "0A")
        .map(|f| usize::from_str_radix(f[4].split(':').nth(1).unwrap(), 16).unwrap())
        .sum()
}

/// The broker's lines about its own exhaustion and recovery, for assertion messages (the
/// monitor's per-round lines would drown them).
fn exhaustion_lines(broker: &Broker) -> String {
    broker
        .logs()
        .into_iter()
        .filter(|l| l.contains("clients") && !l.contains("connection closed"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// How the arriving clients fared so far.
#[derive(Default)]
struct Tally {
    /// Connections served and held open (until `release`).
    held: Vec<TcpStream>,
    /// Served in all, held or not.
    served: usize,
    closed: usize,
    corrupted: Vec<String>,
    waiting: usize,
    /// Set when the held clients leave: clients served from then on are closed at once.
    release: bool,
}

/// The lines of one exhaustion episode, counted while the clients were held.
struct Episode {
    accept: usize,
    connect: usize,
    accept_again: usize,
    connect_again: usize,
    /// The broker's exhaustion lines then, for assertion messages.
    lines: String,
}

impl Episode {
    /// Counts the lines the broker has logged so far; `lines` are its exhaustion lines.
    fn logged(broker: &Broker, lines: String) -> Episode {
        Episode {
            accept: broker.count_logs("cannot accept clients: too many open files"),
            connect: broker.count_logs("cannot connect clients:"),
            accept_again: broker.count_logs("accepting clients again"),
            connect_again: broker.count_logs("connecting clients again"),
            lines,
        }
    }
}

/// The broker over two servers, with their monitor, under [`NOFILE`]; its pid and the
/// descriptors it has open while idle.
async fn broker_at_the_limit() -> (TestServer, TestServer, Broker, u32, usize) {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    // The monitor runs often, so it also meets the exhaustion: its failed connects must not
    // blame the servers either.
    let ini = ini_for(
        &[&a, &b],
        "MONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=500ms",
    );
    let broker = start_limited(&ini, NOFILE).await;
    let pid = broker.child.id();
    assert_eq!(
        open_file_limits(pid),
        (NOFILE, NOFILE),
        "the shell lowered both"
    );
    broker
        .wait_for_log(&format!("open-file limit {NOFILE}"))
        .await;
    let idle_fds = open_fds(pid);
    (a, b, broker, pid, idle_fds)
}

/// [`ARRIVING`] clients arrive at once through `addr`, each tallied as it fares.
fn arrive_at_once(
    addr: SocketAddr,
    names: &[String],
    tally: &Arc<std::sync::Mutex<Tally>>,
) -> tokio::task::JoinSet<()> {
    let mut arriving = tokio::task::JoinSet::new();
    for n in 0..ARRIVING {
        let (names, tally) = (names.to_vec(), Arc::clone(tally));
        arriving.spawn(async move {
            let arrival = arrive(addr, n, &names).await;
            let mut tally = tally.lock().unwrap();
            match arrival {
                Arrival::Served(stream) => {
                    tally.served += 1;
                    if !tally.release {
                        tally.held.push(stream);
                    }
                }
                Arrival::Closed => tally.closed += 1,
                Arrival::Corrupted(text) => tally.corrupted.push(text),
                Arrival::Waiting => tally.waiting += 1,
            }
        });
    }
    arriving
}

/// Waits until every arriving client is served, closed or queued, and checks the broker
/// served as many as its descriptors allow, and no more, and said so; the count of those
/// served, and the episode's lines so far.
async fn served_whom_it_could(
    broker: &Broker,
    pid: u32,
    tally: &std::sync::Mutex<Tally>,
) -> (usize, Episode) {
    let port = broker.addr().port();
    eventually("every arriving client served, closed or queued", || {
        let t = tally.lock().unwrap();
        t.served + t.closed + t.corrupted.len() + accept_queue(port) == ARRIVING
    })
    .await;
    let (served, closed, queued) = {
        let t = tally.lock().unwrap();
        (t.served, t.closed, accept_queue(port))
    };
    let lines = exhaustion_lines(broker);
    eprintln!(
        "at the limit: {served} of {ARRIVING} served and held, {closed} closed, {queued} queued; \
         broker descriptors {} of {NOFILE}",
        open_fds(pid)
    );
    assert!(
        tally.lock().unwrap().corrupted.is_empty(),
        "answers that were not the client's line: {:?}",
        tally.lock().unwrap().corrupted
    );
    assert!(
        served >= 100,
        "only {served} of {ARRIVING} served ({closed} closed, {queued} queued):\n{lines}"
    );
    assert!(
        served < ARRIVING,
        "all {ARRIVING} served: the limit was not reached"
    );
    // Said, and said to blame no server (how often is checked at the end).
    let said = Episode::logged(broker, lines.clone());
    assert!(
        said.accept + said.connect >= 1,
        "the exhaustion was not logged ({served} served, {closed} closed, {queued} queued):\n{lines}"
    );
    if said.connect > 0 {
        assert!(
            lines.contains("no server is blamed"),
            "the line says no server is blamed:\n{lines}"
        );
    }
    (served, said)
}

/// The held clients leave; every client still arriving is answered (served, and it leaves at
/// once, or closed), none left hanging.
async fn release_the_held(
    broker: &Broker,
    tally: &std::sync::Mutex<Tally>,
    mut arriving: tokio::task::JoinSet<()>,
) {
    {
        let mut t = tally.lock().unwrap();
        t.release = true;
        t.held.clear();
    }
    while let Some(finished) = arriving.join_next().await {
        finished.unwrap();
    }
    let t = tally.lock().unwrap();
    assert!(
        t.corrupted.is_empty(),
        "answers that were not the client's line: {:?}",
        t.corrupted
    );
    assert_eq!(
        t.waiting,
        0,
        "clients queued during the exhaustion were never served:\n{}",
        exhaustion_lines(broker)
    );
    // While the descriptors come back one by one, a queued client may still be accepted
    // with none left to connect it, and be closed: only no client may be left hanging.
    assert_eq!(t.served + t.closed, ARRIVING);
}

/// An episode ends with the first success after a quiet second (at the edge of the limit
/// successes and failures alternate): sends one client at a time until the lines that end
/// the episode `said` come.
async fn wait_for_the_recovery_lines(broker: &Broker, said: &Episode, names: &[String]) {
    let mut probe = 5000;
    let every = Duration::from_millis(100);
    poll("the recovery logged", every, DEADLINE, async || {
        if (said.accept == 0 || broker.has_log("accepting clients again"))
            && (said.connect == 0 || broker.has_log("connecting clients again"))
        {
            return Ok(());
        }
        if let Arrival::Served(stream) = arrive(broker.addr(), probe, names).await {
            drop(stream);
        }
        probe += 1;
        Err(exhaustion_lines(broker))
    })
    .await
}

/// Once the relays of the clients that left are closed, a new wave of 100 fits whole.
async fn a_new_wave_fits(broker: &Broker, pid: u32, idle_fds: usize, names: &[String]) {
    eventually("the broker's descriptors back to idle", || {
        open_fds(pid) <= idle_fds + 4
    })
    .await;
    let addr = broker.addr();
    let mut again = tokio::task::JoinSet::new();
    for k in 0..100 {
        let names = names.to_vec();
        again.spawn(async move { arrive(addr, 1000 + k, &names).await });
    }
    let mut held_again = Vec::new();
    while let Some(arrival) = again.join_next().await {
        match arrival.unwrap() {
            Arrival::Served(stream) => held_again.push(stream),
            Arrival::Corrupted(text) => panic!("corrupted answer after recovery: {text:?}"),
            Arrival::Closed | Arrival::Waiting => {}
        }
    }
    assert_eq!(
        held_again.len(),
        100,
        "after the release 100 clients fit again:\n{}",
        exhaustion_lines(broker)
    );
}

/// No server was blamed for the broker's own exhaustion: not in the log, not in the state;
/// and the broker still runs.
async fn no_server_blamed(broker: &mut Broker) {
    // The query needs a descriptor too, so it comes once the clients are gone.
    let json = eventually_json(broker.addr()).await;
    let servers = json["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 2);
    for server in servers {
        assert_eq!(
            server["inquarantine"], false,
            "a server was quarantined: {server}"
        );
    }
    let log = broker.log_text();
    for blame in [
        "in quarantine",
        "cannot connect to server",
        "failed the monitor check",
    ] {
        assert!(!log.contains(blame), "`{blame}` logged:\n{log}");
    }
    assert!(
        broker.child.try_wait().unwrap().is_none(),
        "the broker exited:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_broker_serves_whom_it_can_blames_no_server_and_recovers() {
    let (_a, _b, mut broker, pid, idle_fds) = broker_at_the_limit().await;
    let names = vec!["a".to_string(), "b".to_string()];

    // 400 clients arrive at once. Each served client takes two descriptors, so about 120 fit;
    // the others are closed, or wait in the accept queue until descriptors are free again.
    let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
    let arriving = arrive_at_once(broker.addr(), &names, &tally);
    let (served, said) = served_whom_it_could(&broker, pid, &tally).await;

    // The held clients leave. The broker recovers by itself: the clients still queued are
    // answered, then a new wave is served whole.
    release_the_held(&broker, &tally, arriving).await;
    wait_for_the_recovery_lines(&broker, &said, &names).await;
    a_new_wave_fits(&broker, pid, idle_fds, &names).await;
    no_server_blamed(&mut broker).await;

    // While the clients were held the broker was in one exhaustion episode: each of its
    // lines once, however many clients met it. (Checked last, so everything above is known
    // too. When the held clients leave, the queued ones rush in and may exhaust it again for
    // a moment: a new episode, not counted here.)
    for (line, count) in [
        ("cannot accept clients: too many open files", said.accept),
        ("cannot connect clients:", said.connect),
        ("accepting clients again", said.accept_again),
        ("connecting clients again", said.connect_again),
    ] {
        assert!(
            count <= 1,
            "`{line}` logged {count} times in one episode (while {served} clients were held):\n{}",
            said.lines
        );
    }
}

/// The open-file limit in the HTTP test: room for a few dozen clients besides the broker's own
/// descriptors.
const HTTP_NOFILE: u64 = 64;

/// Out of descriptors, an HTTP balancer answers each request 503 at once, without trying its
/// second server (which the broker could not connect either), and its episode counts each
/// request once: "N requests were answered 503" for N requests. It said "2N were closed" for
/// N clients answered 503 when each request tried both servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_each_http_request_is_answered_503_once_and_counted_once() {
    let (a, b) = (Origin::start().await, Origin::start().await);
    // No pooling: every request dials, so the first after the episode ends it.
    let ini = http_ini(&[a.addr, b.addr], "HTTP_POOL_MAX_IDLE=0");
    let broker = start_limited(&ini, HTTP_NOFILE).await;
    let pid = broker.child.id();
    let idle_fds = fds_below(pid, HTTP_NOFILE);
    // Clients whose connection the broker accepted (each answered a PING, which needs no
    // descriptor more), until the broker holds every descriptor it may: none is left to
    // connect a server, and none of them waits in the accept queue.
    let mut held = Vec::new();
    while fds_below(pid, HTTP_NOFILE) < HTTP_NOFILE {
        let mut connection = HttpConnection::connect(broker.addr()).await;
        let ping = connection.request("GET", "/TOTVS_BROKER_QUERY/PING", &[]);
        assert_eq!(ping.await.unwrap().status, 200, "{}", broker.log_text());
        held.push(connection);
        assert!(
            held.len() < 2 * HTTP_NOFILE as usize,
            "the descriptors never ran out"
        );
    }
    let clients = held.len();
    for connection in &mut held {
        let answer = connection.request("GET", "/page", &[]).await.unwrap();
        assert_eq!(answer.status, 503, "{}", answer.text());
        assert!(answer.header("retry-after").is_some());
    }
    assert_eq!(
        a.accepted.load(Ordering::SeqCst) + b.accepted.load(Ordering::SeqCst),
        0
    );
    let metrics = held[0]
        .request("GET", "/TOTVS_BROKER_QUERY/METRICS", &[])
        .await
        .unwrap()
        .text();
    let counted = format!("kind=\"no_server\"}} {clients}");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("appbroker_http_failures_total") && l.ends_with(&counted)),
        "{clients} requests answered 503:\n{metrics}"
    );
    // Once descriptors are free again, the first connect after a quiet second ends the
    // episode, with the count.
    drop(held);
    eventually("the broker's descriptors free again", || {
        fds_below(pid, HTTP_NOFILE) <= idle_fds
    })
    .await;
    let every = Duration::from_millis(100);
    poll("the recovery logged", every, DEADLINE, async || {
        if broker.has_log("connecting clients again") {
            return Ok(());
        }
        let mut probe = HttpConnection::connect(broker.addr()).await;
        let answer = probe.request("GET", "/page", &[]).await.unwrap();
        assert!([200, 503].contains(&answer.status), "{}", answer.status);
        Err(broker.log_text())
    })
    .await;
    eprintln!(
        "{clients} requests answered 503 with no descriptor left:\n{}",
        exhaustion_lines(&broker)
    );
    let log = broker.log_text();
    assert_eq!(
        broker.count_logs("cannot connect clients: too many open files"),
        1,
        "{log}"
    );
    assert_eq!(
        broker.count_logs("their requests are answered 503 and no server is blamed"),
        1,
        "{log}"
    );
    let recovered = format!(
        "connecting clients again: {clients} requests were answered 503 while the broker \
         lacked resources"
    );
    assert!(broker.has_log(&recovered), "{clients} requests:\n{log}");
    for blame in [
        "no remote servers available",
        "in quarantine",
        "cannot connect to server",
    ] {
        assert!(!log.contains(blame), "`{blame}` logged:\n{log}");
    }
}

/// The JSON query, retried until the broker has a descriptor for it (the held clients'
/// connections may still be closing).
async fn eventually_json(addr: SocketAddr) -> serde_json::Value {
    let every = Duration::from_millis(20);
    poll("the JSON query answered", every, DEADLINE, async || {
        tokio::spawn(query_json(addr)).await
    })
    .await
}

/// What the client of the never-reading server sends in all.
const SEND: u64 = 64 * 1024 * 1024;
/// What it writes at once.
const CHUNK: usize = 64 * 1024;
/// Far less than 64 MiB, far more than one relay buffer and the allocator's slack.
const BOUND: u64 = 8 * 1024 * 1024;

/// Writes [`SEND`] pattern bytes on `client`, counting them in `sent`, then shuts it down.
fn write_the_pattern(
    mut client: TcpStream,
    sent: &Arc<AtomicU64>,
) -> tokio::task::JoinHandle<TcpStream> {
    let sent = Arc::clone(sent);
    tokio::spawn(async move {
        let mut offset = 0u64;
        let mut chunk = vec![0u8; CHUNK];
        while offset < SEND {
            for (i, byte) in chunk.iter_mut().enumerate() {
                *byte = pattern(offset + i as u64);
            }
            client.write_all(&chunk).await.unwrap();
            offset += CHUNK as u64;
            sent.store(offset, Ordering::SeqCst);
        }
        client.shutdown().await.unwrap();
        client
    })
}

/// While the server reads nothing, the client gets as far as the buffers on the way let it,
/// then its writes block. Samples the broker's memory until the client has made no progress
/// for a second (or has sent everything, which a bounded broker cannot allow), and checks it
/// stalled with the broker's memory bounded. The second only decides when to stop looking;
/// the verdict is on bytes and memory.
async fn stalls_with_memory_bounded(pid: u32, sent: &AtomicU64, before: u64) {
    let mut peak = before;
    let mut last = (0, Instant::now());
    let every = Duration::from_millis(20);
    poll(
        "the client stalled or finished",
        every,
        DEADLINE * 3,
        async || {
            peak = peak.max(vm_rss(pid));
            let now = sent.load(Ordering::SeqCst);
            if now == SEND {
                return Ok(());
            }
            if now != last.0 {
                last = (now, Instant::now());
            } else if now > 0 && last.1.elapsed() > Duration::from_secs(1) {
                return Ok(()); // stalled: the broker stopped reading from the client
            }
            Err(format!("{} KiB sent", now >> 10))
        },
    )
    .await;
    let stalled_at = sent.load(Ordering::SeqCst);
    eprintln!(
        "client stalled after {} KiB; broker RSS {} KiB before, {} KiB at most meanwhile",
        stalled_at >> 10,
        before >> 10,
        peak >> 10
    );
    assert!(
        stalled_at < SEND,
        "the client sent all 64 MiB to a server that reads nothing: the broker buffered it \
         (RSS {} MiB -> peak {} MiB)",
        before >> 20,
        peak >> 20
    );
    assert!(
        peak - before < BOUND,
        "the broker's RSS grew by {} KiB (from {} KiB) while the client had sent {} KiB",
        (peak - before) >> 10,
        before >> 10,
        stalled_at >> 10
    );
}

/// Samples `pid`'s memory until `stop` is set; the most it used.
fn sample_memory(pid: u32, stop: &Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    let stop = Arc::clone(stop);
    tokio::spawn(async move {
        let mut peak = 0;
        while !stop.load(Ordering::SeqCst) {
            peak = peak.max(vm_rss(pid));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak
    })
}

/// Reads `server` to its end, checking every byte against the pattern; how many came.
async fn read_the_pattern(server: &mut TcpStream) -> u64 {
    let mut received = 0u64;
    let mut buf = vec![0u8; CHUNK];
    tokio::time::timeout(DEADLINE * 3, async {
        loop {
            let k = server.read(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            for (i, &byte) in buf[..k].iter().enumerate() {
                assert_eq!(
                    byte,
                    pattern(received + i as u64),
                    "byte {} differs",
                    received + i as u64
                );
            }
            received += k as u64;
        }
    })
    .await
    .expect("the rest arrives once the server reads");
    received
}

/// A server that accepts and never reads: the client's bytes pile up in the kernel's buffers,
/// and the broker must stop reading from the client rather than hold them. The bound is on
/// memory, not on time: however long it runs, the broker's RSS may not grow by more than a
/// small fraction of what the client tries to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_reads_cannot_make_the_broker_buffer_without_bound() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    let ini = format!(
        "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
         MONITORING_TYPE=DISABLED\nREMOTE_SERVER_01=127.0.0.1 {}\n",
        server_addr.port()
    );
    let mut broker = Broker::start(&ini).await;
    let pid = broker.child.id();
    let before = vm_rss(pid);

    let client = TcpStream::connect(broker.addr()).await.unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let writing = write_the_pattern(client, &sent);
    let (mut server, _) = tokio::time::timeout(DEADLINE, listener.accept())
        .await
        .expect("the broker connects to the server")
        .unwrap();
    stalls_with_memory_bounded(pid, &sent, before).await;

    // Now the server reads: every byte arrives, in order, and the broker's memory stays bounded.
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = sample_memory(pid, &stop_sampling);
    assert_eq!(read_the_pattern(&mut server).await, SEND);
    let _client = writing.await.unwrap();
    stop_sampling.store(true, Ordering::SeqCst);
    let peak_draining = sampler.await.unwrap();
    eprintln!(
        "64 MiB relayed once the server read; broker RSS {} KiB at most meanwhile",
        peak_draining >> 10
    );
    assert!(
        peak_draining.saturating_sub(before) < BOUND,
        "the broker's RSS grew by {} KiB while relaying 64 MiB",
        (peak_draining - before) >> 10
    );
    assert!(
        broker.child.try_wait().unwrap().is_none(),
        "the broker exited"
    );
}

/// The byte at `offset` of the client's stream: position-dependent, so a lost, repeated or
/// reordered chunk shows.
fn pattern(offset: u64) -> u8 {
    (offset % 251) as u8
}
