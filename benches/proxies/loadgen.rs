//! The benchmark's own loopback programs, run as child processes of the runner (the same
//! binary started again with a mode argument), so they can be pinned like every other process
//! and their CPU is never counted as the proxy's:
//!
//! - `--serve-echo PORT`: an echo server on 127.0.0.1:PORT;
//! - `--serve-bulk PORT`: the bulk origin of the TLS bulk rows ([`crate::tls`]);
//! - `--serve-tls echo|bulk PORT CERT KEY`: the same servers behind TLS (the direct path of
//!   the TLS rows);
//! - `--serve-http PORT_A PORT_B`: the HTTP origin, two servers in one process
//!   ([`crate::http`]);
//! - `--loadgen rr ADDR CONNS SECS`: CONNS connections each doing 1-byte request/response;
//! - `--loadgen crr ADDR WORKERS SECS`: WORKERS loops of connect, one 1-byte exchange, close;
//! - `--loadgen hold ADDR N SECS`: N connections, one exchange each, then held idle;
//! - `--loadgen tls-hs ADDR WORKERS SECS CA VERSION full|resumed`: TLS handshake loops;
//! - `--loadgen tls-bulk ADDR SECS CA up|down`: one TLS stream one way;
//! - `--loadgen http-hold ADDR N SECS [COOKIE]`: N keep-alive HTTP clients, one request each,
//!   then held idle.
//!
//! Each prints one JSON line on standard output. Every loop is bounded by time and by count,
//! and every child exits when its standard input closes (the runner is gone).

use std::future::Future;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;

/// Bound on any one connect, read or write.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the samples one load-generator task keeps (and so on its exchanges).
const MAX_SAMPLES_PER_TASK: usize = 4_000_000;
/// An echo server lives at most this long, even if nobody stops it.
const SERVER_LIFETIME: Duration = Duration::from_secs(4 * 3600);
/// The request byte: not `G`, `H`, `g` or `h`, so appbroker's query sniffing forwards it at
/// once instead of waiting for the rest of a possible `GET /TOTVS_BROKER_QUERY`.
pub const REQUEST: &[u8] = b"x";

/// Runs the child mode named by `args`, if any.
pub fn child_mode(args: &[String]) -> Option<ExitCode> {
    let mode = args.first()?.as_str();
    if !mode.starts_with("--serve-") && mode != "--loadgen" {
        return None;
    }
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    exit_when_stdin_closes();
    let result = match mode {
        "--loadgen" => runtime().and_then(|rt| rt.block_on(loadgen(&args[1..]))),
        _ => runtime().and_then(|rt| rt.block_on(serve(mode, &args[1..]))),
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench child: {e:#}");
            ExitCode::from(1)
        }
    })
}

/// One of the servers, for at most [`SERVER_LIFETIME`].
async fn serve(mode: &str, args: &[String]) -> Result<()> {
    let port = |i: usize| parse::<u16>(args.get(i), "port");
    let path = |i: usize| -> Result<&Path> {
        Ok(Path::new(
            args.get(i).ok_or_else(|| anyhow!("missing file"))?,
        ))
    };
    let server = async {
        match mode {
            "--serve-echo" => serve_loop(port(0)?, echo).await,
            "--serve-bulk" => crate::tls::serve_bulk_plain(port(0)?).await,
            "--serve-tls" => {
                let role = crate::tls::Role::parse(args.first().map(String::as_str).unwrap_or(""))?;
                crate::tls::serve_tls(role, port(1)?, path(2)?, path(3)?).await
            }
            "--serve-http" => crate::http::serve_origin([port(0)?, port(1)?]).await,
            _ => bail!("unknown server mode {mode:?}"),
        }
    };
    match timeout(SERVER_LIFETIME, server).await {
        Ok(r) => r,
        Err(_) => Ok(()),
    }
}

pub fn parse<T: std::str::FromStr>(arg: Option<&String>, what: &str) -> Result<T> {
    arg.ok_or_else(|| anyhow!("missing {what}"))?
        .parse()
        .map_err(|_| anyhow!("bad {what}"))
}

/// A multi-threaded runtime with one worker per CPU this process may run on (1 when pinned).
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")
}

/// Exits the process when standard input reaches end of file.
fn exit_when_stdin_closes() {
    let _ = std::thread::Builder::new().name("stdin".into()).spawn(|| {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => std::process::exit(0),
                Ok(_) => {}
            }
        }
    });
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

async fn loadgen(args: &[String]) -> Result<()> {
    let kind = args.first().map(String::as_str).unwrap_or("");
    let line = match kind {
        "tls-hs" => Some(crate::tls::handshakes(args).await?),
        "tls-bulk" => Some(crate::tls::bulk(args).await?),
        "http-hold" => return crate::http::hold(args).await,
        _ => None,
    };
    if let Some(line) = line {
        println!("{line}");
        return Ok(());
    }
    let addr: SocketAddr = parse(args.get(1), "address")?;
    let n: usize = parse(args.get(2), "count")?;
    let secs: f64 = parse(args.get(3), "seconds")?;
    let duration = Duration::from_secs_f64(secs);
    let line = match kind {
        "rr" => rr(addr, n, duration).await?,
        "crr" => crr(addr, n, duration).await?,
        "hold" => return hold(addr, n, duration).await,
        _ => bail!("unknown load generator {kind:?} (rr, crr, hold, tls-hs, tls-bulk, http-hold)"),
    };
    println!("{line}");
    Ok(())
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
async fn rr(addr: SocketAddr, conns: usize, duration: Duration) -> Result<String> {
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
async fn crr(addr: SocketAddr, workers: usize, duration: Duration) -> Result<String> {
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
async fn hold(addr: SocketAddr, n: usize, limit: Duration) -> Result<()> {
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
