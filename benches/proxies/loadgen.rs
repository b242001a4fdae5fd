//! The load generator's plain TCP pieces, and what the TLS and HTTP loops build on: connect
//! with a bound, the 1-byte exchange, the loops (`rr`, `crr`, `hold`), their tallies and exact
//! percentiles, and the accept loop and echo of the runner's own servers. [`crate::child`]
//! runs them in the runner's child processes.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;

/// Bound on any one connect, read or write.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the samples one load-generator task keeps (and so on its exchanges).
const MAX_SAMPLES_PER_TASK: usize = 4_000_000;
/// The request byte: not `G`, `H`, `g` or `h`, so appbroker's query sniffing forwards it at
/// once instead of waiting for the rest of a possible `GET /TOTVS_BROKER_QUERY`.
pub const REQUEST: &[u8] = b"x";

/// A child mode's argument, parsed; the error names `what` is missing or bad.
pub fn parse<T: std::str::FromStr>(arg: Option<&String>, what: &str) -> Result<T> {
    arg.ok_or_else(|| anyhow!("missing {what}"))?
        .parse()
        .map_err(|_| anyhow!("bad {what}"))
}

/// Accepts on 127.0.0.1:`port` for ever and hands each connection to `handle` in a task
/// of its own.
pub async fn serve_loop<F, Fut>(port: u16, handle: F) -> Result<()>
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    let listener = socket.listen(4096)?;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors or the like: wait and go on.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(handle(stream));
    }
}

/// Every byte back, until the peer closes.
pub async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
    let mut buf = [0u8; 2048];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if stream.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
}

pub async fn connect(addr: SocketAddr) -> Result<TcpStream> {
    let stream = timeout(IO_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow!("connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// One request byte out, one reply byte back.
async fn exchange(stream: &mut TcpStream) -> Result<()> {
    let mut reply = [0u8; 1];
    timeout(IO_TIMEOUT, async {
        stream.write_all(REQUEST).await?;
        stream.read_exact(&mut reply).await?;
        Ok::<_, std::io::Error>(())
    })
    .await
    .map_err(|_| anyhow!("exchange timed out"))??;
    Ok(())
}

/// One task's latencies and failures.
pub struct Tally {
    pub samples_ns: Vec<u64>,
    pub errors: u64,
    /// The first failure, for the runner to show.
    first_error: Option<String>,
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            samples_ns: Vec::with_capacity(1 << 16),
            errors: 0,
            first_error: None,
        }
    }

    /// Below the sample cap?
    pub fn room(&self) -> bool {
        self.samples_ns.len() < MAX_SAMPLES_PER_TASK
    }

    pub fn fail(&mut self, e: anyhow::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{e:#}"));
        }
    }
}

/// `conns` connections, opened (and warmed with one exchange) before the clock starts, each
/// doing request/response until `duration` or [`MAX_SAMPLES_PER_TASK`].
pub async fn rr(addr: SocketAddr, conns: usize, duration: Duration) -> Result<String> {
    let mut streams = Vec::with_capacity(conns);
    for _ in 0..conns {
        let mut s = connect(addr).await?;
        exchange(&mut s).await?;
        streams.push(s);
    }
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(conns);
    for mut stream in streams {
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::new();
            while t.room() {
                let t0 = Instant::now();
                if t0 >= deadline {
                    break;
                }
                if let Err(e) = exchange(&mut stream).await {
                    t.fail(e);
                    break;
                }
                t.samples_ns.push(t0.elapsed().as_nanos() as u64);
            }
            t
        }));
    }
    Ok(finish("rr", join(tasks).await?, start).to_string())
}

async fn join(tasks: Vec<tokio::task::JoinHandle<Tally>>) -> Result<Vec<Tally>> {
    let mut all = Vec::with_capacity(tasks.len());
    for task in tasks {
        all.push(task.await?);
    }
    Ok(all)
}

/// `workers` loops of connect, one exchange, close, until `duration` or the sample cap.
pub async fn crr(addr: SocketAddr, workers: usize, duration: Duration) -> Result<String> {
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(workers);
    for _ in 0..workers {
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::new();
            while t.room() && t.errors < 1000 {
                let t0 = Instant::now();
                if t0 >= deadline {
                    break;
                }
                let ok = async {
                    let mut s = connect(addr).await?;
                    exchange(&mut s).await
                }
                .await;
                match ok {
                    Ok(()) => t.samples_ns.push(t0.elapsed().as_nanos() as u64),
                    Err(e) => {
                        t.fail(e);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            t
        }));
    }
    Ok(finish("crr", join(tasks).await?, start).to_string())
}

/// The figures of a timed loop: count, errors (and the first), rate and exact percentiles.
pub fn finish(kind: &str, tallies: Vec<Tally>, start: Instant) -> serde_json::Value {
    let mut all = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    for t in tallies {
        all.extend(t.samples_ns);
        errors += t.errors;
        first_error = first_error.or(t.first_error);
    }
    let secs = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |q: f64| -> f64 {
        if all.is_empty() {
            return 0.0;
        }
        let rank = ((q * all.len() as f64).ceil() as usize).clamp(1, all.len());
        all[rank - 1] as f64 / 1000.0
    };
    serde_json::json!({
        "kind": kind,
        "count": all.len(),
        "errors": errors,
        "first_error": first_error,
        "secs": secs,
        "rate": all.len() as f64 / secs,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
        "p999_us": pct(0.999),
    })
}

/// Opens `n` connections (32 at a time), one exchange on each, prints `{"held": n, ...}` and
/// holds them idle until standard input closes or `limit` passes.
pub async fn hold(addr: SocketAddr, n: usize, limit: Duration) -> Result<()> {
    hold_with(n, limit, move || async move {
        let mut s = connect(addr).await?;
        exchange(&mut s).await?;
        Ok(s)
    })
    .await
}

/// Opens `n` connections with `open` (32 at a time), prints `{"held": n, ...}` and holds them
/// idle until standard input closes or `limit` passes.
pub async fn hold_with<F, Fut, S>(n: usize, limit: Duration, open: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<S>> + Send + 'static,
    S: Send + 'static,
{
    let start = Instant::now();
    let mut held = Vec::with_capacity(n);
    let mut errors = 0u64;
    let mut pending = tokio::task::JoinSet::new();
    let mut launched = 0;
    while held.len() + (errors as usize) < n {
        while launched < n && pending.len() < 32 {
            launched += 1;
            pending.spawn(open());
        }
        match pending.join_next().await {
            Some(Ok(Ok(s))) => held.push(s),
            Some(_) => errors += 1,
            None => break,
        }
        if start.elapsed() > limit {
            bail!("opening {n} connections took more than {limit:?}");
        }
    }
    println!(
        "{}",
        serde_json::json!({"held": held.len(), "errors": errors, "secs": start.elapsed().as_secs_f64()})
    );
    let _ = std::io::stdout().flush();
    tokio::time::sleep(limit.saturating_sub(start.elapsed())).await;
    Ok(())
}
