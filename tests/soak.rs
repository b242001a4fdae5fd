//! The soak: a few minutes of steady load from several clients while the servers flap up and
//! down every few hundred milliseconds (never all down at once). It counts exchanges, corrupted
//! bytes (must be 0) and client failures (must be 0: some server is always up), and samples the
//! broker's memory every 10 s (it must stay flat). Not part of the default run:
//!
//! ```text
//! cargo test --release --test soak -- --ignored --nocapture          # 3 minutes
//! SOAK_SECONDS=600 cargo test --release --test soak -- --ignored --nocapture
//! ```
//!
//! A server "goes down" the way a restarted AppServer does: its port closes (connects are
//! refused) while the connections it has finish normally. One race is the harness's own and
//! not the broker's: a connection the kernel completed on the port just before it closed, and
//! that was not accepted yet, is reset by the kernel. The broker passes that reset on to its
//! client (as it must), so such a failure is looked up in the broker's log (`server side:
//! connection reset` on that client's line) and reported apart; every other failure counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use harness::Broker;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Concurrent clients, each exchanging lines on one connection after another.
const CLIENTS: usize = 8;
/// Servers behind the broker; at most all but one are down at once.
const SERVERS: usize = 3;
/// How often the broker's memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// A small deterministic generator (xorshift), so a run can be told apart by its seed only.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// An echo server (`<name>: <line>` for every line) whose port can be closed and opened again
/// without cutting the connections it already has.
struct FlappingServer {
    name: String,
    addr: SocketAddr,
    /// While up: stops the accept loop, which drains the accept queue before closing the port.
    up: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
    /// While down: the port, bound without listening, so connects are refused and nothing
    /// else can take it.
    reserved: Option<socket2::Socket>,
}

impl FlappingServer {
    async fn start(name: &str) -> FlappingServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut server = FlappingServer {
            name: name.to_string(),
            addr: listener.local_addr().unwrap(),
            up: None,
            reserved: None,
        };
        server.listen(listener);
        server
    }

    fn listen(&mut self, listener: TcpListener) {
        let (stop, name) = (CancellationToken::new(), self.name.clone());
        let stopped = stop.clone();
        let accepting = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => break,
                    accepted = listener.accept() => {
                        if let Ok((stream, _)) = accepted {
                            tokio::spawn(answer(stream, name.clone()));
                        }
                    }
                }
            }
            // Take what the kernel has already queued, so as few connections as possible are
            // reset when the port closes.
            while let Some(accepted) = poll_fn(|cx| match listener.poll_accept(cx) {
                Poll::Ready(result) => Poll::Ready(Some(result)),
                Poll::Pending => Poll::Ready(None),
            })
            .await
            {
                if let Ok((stream, _)) = accepted {
                    tokio::spawn(answer(stream, name.clone()));
                }
            }
        });
        self.up = Some((stop, accepting));
    }

    fn is_up(&self) -> bool {
        self.up.is_some()
    }

    /// Closes the port; existing connections go on.
    async fn down(&mut self) {
        if let Some((stop, accepting)) = self.up.take() {
            stop.cancel();
            accepting.await.unwrap();
            let socket =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            socket.set_reuse_address(true).unwrap();
            socket.bind(&self.addr.into()).unwrap();
            self.reserved = Some(socket);
        }
    }

    /// Opens the port again.
    async fn up(&mut self) {
        if self.up.is_none() {
            drop(self.reserved.take());
            let listener = TcpListener::bind(self.addr).await.unwrap();
            self.listen(listener);
        }
    }
}

async fn answer(stream: TcpStream, name: String) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return write.shutdown().await;
        }
        let mut reply = format!("{name}: ").into_bytes();
        reply.extend_from_slice(&line);
        write.write_all(&reply).await?;
    }
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    /// Connections that did all their exchanges.
    connections: u64,
    /// Lines sent and answered.
    exchanges: u64,
    /// Bytes relayed both ways.
    bytes: u64,
    /// Bytes of answers that differ from what was sent.
    corrupted_bytes: u64,
    /// Connections that failed.
    failures: Vec<Failure>,
}

/// A connection that failed.
#[derive(Debug)]
struct Failure {
    /// The client's port (0: the connect itself failed).
    port: u16,
    /// Lines answered on it before it failed.
    answered: u64,
    /// Bytes of the first line.
    first_line: usize,
    /// What the client saw.
    what: String,
}

impl Failure {
    /// The broker's closing line for this connection when it says the server reset it before
    /// anything reached the client: the harness's race of a port closing under a connection
    /// not yet accepted. Ports are reused over a run, so the line must also match the bytes.
    fn reset_as_port_closed<'a>(&self, logs: &'a [String]) -> Option<&'a String> {
        if self.port == 0 || self.answered > 0 {
            return None;
        }
        let client = format!("client=127.0.0.1:{} ", self.port);
        let sent = [
            "bytes_from_client=0 ".to_string(),
            format!("bytes_from_client={} ", self.first_line),
        ];
        logs.iter().find(|l| {
            l.contains(&client)
                && l.contains("server side: connection reset")
                && l.contains("bytes_to_client=0 ")
                && sent.iter().any(|s| l.contains(s.as_str()))
        })
    }
}

/// One client: connection after connection, each with a few lines of random length, until
/// `until`.
async fn client(id: u64, broker: SocketAddr, until: Instant, tally: Arc<Mutex<Tally>>) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (id + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut seq = 0u64;
    while Instant::now() < until {
        let mut stream = match TcpStream::connect(broker).await {
            Ok(stream) => stream,
            Err(e) => {
                tally.lock().unwrap().failures.push(Failure {
                    port: 0,
                    answered: 0,
                    first_line: 0,
                    what: format!("connect: {e}"),
                });
                continue;
            }
        };
        let port = stream.local_addr().map(|a| a.port()).unwrap_or(0);
        let lines = 1 + rng.below(8);
        let mut outcome = Ok((0u64, 0u64, 0u64));
        let mut first_line = 0;
        for _ in 0..lines {
            seq += 1;
            let length = 1 + rng.below(3000) as usize;
            let mut line: Vec<u8> = format!("c{id} s{seq} ").into_bytes();
            while line.len() < length {
                line.push(b'!' + (rng.below(94) as u8));
            }
            line.push(b'\n');
            if first_line == 0 {
                first_line = line.len();
            }
            match exchange(&mut stream, &line).await {
                Ok(corrupted) => {
                    let (n, bytes, bad) = outcome.as_mut().map(|t| *t).unwrap_or_default();
                    outcome = Ok((n + 1, bytes + 2 * line.len() as u64, bad + corrupted));
                }
                Err(e) => {
                    let answered = outcome.as_ref().map(|t| t.0).unwrap_or_default();
                    outcome = Err((answered, e));
                    break;
                }
            }
        }
        let mut t = tally.lock().unwrap();
        match outcome {
            Ok((n, bytes, bad)) => {
                t.connections += 1;
                t.exchanges += n;
                t.bytes += bytes;
                t.corrupted_bytes += bad;
            }
            Err((answered, what)) => t.failures.push(Failure {
                port,
                answered,
                first_line,
                what,
            }),
        }
    }
}

/// Sends `line` and reads the answer; `Ok(bytes that differ)` or how it failed.
async fn exchange(stream: &mut TcpStream, line: &[u8]) -> Result<u64, String> {
    stream
        .write_all(line)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = Vec::with_capacity(line.len() + 8);
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(harness::DEADLINE, async {
        while !reply.ends_with(b"\n") {
            match stream.read(&mut buf).await {
                Ok(0) => return Err(format!("closed after {} bytes of the answer", reply.len())),
                Ok(k) => reply.extend_from_slice(&buf[..k]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
        Ok(())
    })
    .await;
    match read {
        Err(_) => return Err("no answer".into()),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(())) => {}
    }
    // `<server name>: <line>`: compare what follows the name with the line, byte by byte.
    let Some(at) = reply.windows(2).position(|w| w == b": ") else {
        return Ok(reply.len() as u64);
    };
    let echoed = &reply[at + 2..];
    let differing = echoed.iter().zip(line).filter(|(a, b)| a != b).count();
    Ok((differing + echoed.len().abs_diff(line.len())) as u64)
}

fn vm_rss_kib(pid: u32) -> u64 {
    harness::status_bytes(&pid.to_string(), "VmRSS") / 1024
}

/// The flapping servers, all up, and the broker over them (monitored every second, a short
/// quarantine).
async fn servers_and_broker() -> (Vec<FlappingServer>, Broker) {
    let mut servers = Vec::new();
    for i in 0..SERVERS {
        servers.push(FlappingServer::start(&format!("s{i}")).await);
    }
    let mut ini = String::from(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\n\
         LOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
         MONITOR_INTERVAL=1s\nQUARANTINE_TIME=2s\n",
    );
    for (i, s) in servers.iter().enumerate() {
        ini.push_str(&format!(
            "REMOTE_SERVER_{:02}=127.0.0.1 {}\n",
            i + 1,
            s.addr.port()
        ));
    }
    (servers, Broker::start(&ini).await)
}

/// A process's memory samples: (seconds since the soak started, KiB), in order.
type Samples = Arc<Mutex<Vec<(u64, u64)>>>;

/// Samples `pid`'s memory now, then every [`SAMPLE_EVERY`] until `until`.
fn sample_memory(
    pid: u32,
    started: Instant,
    until: Instant,
) -> (Samples, tokio::task::JoinHandle<()>) {
    let samples = Arc::new(Mutex::new(vec![(0u64, vm_rss_kib(pid))]));
    let sampling = {
        let samples = Arc::clone(&samples);
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + SAMPLE_EVERY, SAMPLE_EVERY);
            while Instant::now() < until {
                tick.tick().await;
                let at = started.elapsed().as_secs();
                samples.lock().unwrap().push((at, vm_rss_kib(pid)));
            }
        })
    };
    (samples, sampling)
}

/// Flaps until `until`: every 200-500 ms one server goes down or comes back; never the last
/// one up. How many went down or came back.
async fn flap(servers: &mut [FlappingServer], until: Instant) -> u64 {
    let mut transitions = 0u64;
    let mut rng = Rng(0xDEAD_BEEF_CAFE_F00D);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200 + rng.below(300))).await;
        let i = rng.below(SERVERS as u64) as usize;
        let up = servers.iter().filter(|s| s.is_up()).count();
        if servers[i].is_up() {
            if up > 1 {
                servers[i].down().await;
                transitions += 1;
            }
        } else {
            servers[i].up().await;
            transitions += 1;
        }
    }
    transitions
}

/// Prints what the clients did and met: the failures the harness caused (a connection reset
/// as its port closed, told apart by the broker's line for that client) apart from the others,
/// which are returned.
fn report_failures<'a>(tally: &'a Tally, logs: &[String]) -> Vec<&'a Failure> {
    let (reset_by_closing_port, unexplained): (Vec<_>, Vec<_>) = tally
        .failures
        .iter()
        .partition(|f| f.reset_as_port_closed(logs).is_some());
    println!(
        "exchanges {} on {} connections, {} MiB relayed; corrupted bytes {}",
        tally.exchanges,
        tally.connections,
        tally.bytes >> 20,
        tally.corrupted_bytes
    );
    println!(
        "client failures while a server was up: {} (and {} reset by a port closing under a \
         connection not yet accepted: the harness's race, see the file's doc)",
        unexplained.len(),
        reset_by_closing_port.len()
    );
    for f in unexplained.iter().take(20) {
        println!(
            "  failure: client port {} after {} lines: {}",
            f.port, f.answered, f.what
        );
    }
    for f in reset_by_closing_port.iter().take(3) {
        println!(
            "  reset as a port closed: client port {}: {}\n    broker: {}",
            f.port,
            f.what,
            f.reset_as_port_closed(logs).unwrap()
        );
    }
    unexplained
}

/// Prints the memory samples; growth from the first sample under load (the allocator has found
/// its working set by then) to the last, as (first, last) in KiB.
fn report_memory(samples: &[(u64, u64)]) -> (u64, u64) {
    let series: Vec<String> = samples
        .iter()
        .map(|(at, kib)| format!("{at}s {kib}"))
        .collect();
    let (first, last) = (
        samples[1.min(samples.len() - 1)].1,
        samples[samples.len() - 1].1,
    );
    println!("broker VmRSS KiB every 10 s: {}", series.join(", "));
    println!(
        "growth from {} KiB (10 s) to {} KiB (end): {} KiB",
        first,
        last,
        last as i64 - first as i64
    );
    (first, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak of minutes: cargo test --release --test soak -- --ignored --nocapture"]
async fn soak_with_flapping_servers_and_steady_load() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
    let (mut servers, mut broker) = servers_and_broker().await;
    let pid = broker.child.id();
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let (samples, sampling) = sample_memory(pid, started, until);

    let tally = Arc::new(Mutex::new(Tally::default()));
    let addr = broker.addr();
    let clients: Vec<_> = (0..CLIENTS as u64)
        .map(|id| tokio::spawn(client(id, addr, until, Arc::clone(&tally))))
        .collect();
    let transitions = flap(&mut servers, until).await;
    for c in clients {
        c.await.unwrap();
    }
    sampling.await.unwrap();
    for s in &mut servers {
        s.up().await;
    }

    let tally = tally.lock().unwrap();
    println!(
        "soak: {seconds} s, {CLIENTS} clients, {SERVERS} servers, {} transitions (never all down)",
        transitions
    );
    let unexplained = report_failures(&tally, &broker.logs());
    println!("quarantine lines: {}", broker.count_logs("in quarantine"));
    let (first, last) = report_memory(&samples.lock().unwrap());
    assert_eq!(tally.corrupted_bytes, 0, "corrupted bytes");
    assert!(
        unexplained.is_empty(),
        "client failures while a server was up: {unexplained:?}"
    );
    assert!(tally.exchanges > 0);
    // Flat: a leak of 4 bytes per connection would pass 2 MiB in 3 minutes of this load.
    assert!(
        last < first + 2048,
        "the broker's memory grew from {first} KiB to {last} KiB"
    );
    assert!(
        broker.child.try_wait().unwrap().is_none(),
        "the broker exited"
    );
}
