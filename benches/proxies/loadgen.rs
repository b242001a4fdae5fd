//! The benchmark's own loopback programs, run as child processes of the runner (the same
//! binary started again with a mode argument), so they can be pinned like every other process
//! and their CPU is never counted as the proxy's:
//!
//! - `--serve-echo PORT`: an echo server on 127.0.0.1:PORT;
//! - `--loadgen rr ADDR CONNS SECS`: CONNS connections each doing 1-byte request/response;
//! - `--loadgen crr ADDR WORKERS SECS`: WORKERS loops of connect, one 1-byte exchange, close;
//! - `--loadgen hold ADDR N SECS`: N connections, one exchange each, then held idle.
//!
//! Each prints one JSON line on standard output. Every loop is bounded by time and by count,
//! and every child exits when its standard input closes (the runner is gone).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;

/// Bound on any one connect, read or write.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the samples one load-generator task keeps (and so on its exchanges).
const MAX_SAMPLES_PER_TASK: usize = 4_000_000;
/// An echo server lives at most this long, even if nobody stops it.
const SERVER_LIFETIME: Duration = Duration::from_secs(4 * 3600);
/// The request byte: not `G`, `H`, `g` or `h`, so appbroker's query sniffing forwards it at
/// once instead of waiting for the rest of a possible `GET /TOTVS_BROKER_QUERY`.
const REQUEST: &[u8] = b"x";

/// Runs the child mode named by `args`, if any.
pub fn child_mode(args: &[String]) -> Option<ExitCode> {
    let mode = args.first()?.as_str();
    if mode != "--serve-echo" && mode != "--loadgen" {
        return None;
    }
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    exit_when_stdin_closes();
    let result = match mode {
        "--serve-echo" => runtime().and_then(|rt| {
            let port: u16 = parse(args.get(1), "port")?;
            rt.block_on(async {
                match timeout(SERVER_LIFETIME, serve_echo(port)).await {
                    Ok(r) => r,
                    Err(_) => Ok(()),
                }
            })
        }),
        _ => runtime().and_then(|rt| rt.block_on(loadgen(&args[1..]))),
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench child: {e:#}");
            ExitCode::from(1)
        }
    })
}

fn parse<T: std::str::FromStr>(arg: Option<&String>, what: &str) -> Result<T> {
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

async fn serve_echo(port: u16) -> Result<()> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    let listener = socket.listen(4096)?;
    loop {
        let (mut stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(_) => {
                // Out of descriptors or the like: wait and go on.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
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
        });
    }
}

async fn loadgen(args: &[String]) -> Result<()> {
    let kind = args.first().map(String::as_str).unwrap_or("");
    let addr: SocketAddr = parse(args.get(1), "address")?;
    let n: usize = parse(args.get(2), "count")?;
    let secs: f64 = parse(args.get(3), "seconds")?;
    let duration = Duration::from_secs_f64(secs);
    let line = match kind {
        "rr" => rr(addr, n, duration).await?,
        "crr" => crr(addr, n, duration).await?,
        "hold" => return hold(addr, n, duration).await,
        _ => bail!("unknown load generator {kind:?} (rr, crr, hold)"),
    };
    println!("{line}");
    Ok(())
}

async fn connect(addr: SocketAddr) -> Result<TcpStream> {
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

#[derive(Default)]
struct Tally {
    samples_ns: Vec<u64>,
    errors: u64,
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
            let mut t = Tally {
                samples_ns: Vec::with_capacity(1 << 16),
                errors: 0,
            };
            while t.samples_ns.len() < MAX_SAMPLES_PER_TASK {
                let t0 = Instant::now();
                if t0 >= deadline {
                    break;
                }
                if exchange(&mut stream).await.is_err() {
                    t.errors += 1;
                    break;
                }
                t.samples_ns.push(t0.elapsed().as_nanos() as u64);
            }
            t
        }));
    }
    finish("rr", tasks, start).await
}

/// `workers` loops of connect, one exchange, close, until `duration` or the sample cap.
async fn crr(addr: SocketAddr, workers: usize, duration: Duration) -> Result<String> {
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(workers);
    for _ in 0..workers {
        tasks.push(tokio::spawn(async move {
            let mut t = Tally {
                samples_ns: Vec::with_capacity(1 << 16),
                errors: 0,
            };
            while t.samples_ns.len() < MAX_SAMPLES_PER_TASK && t.errors < 1000 {
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
                    Err(_) => {
                        t.errors += 1;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            t
        }));
    }
    finish("crr", tasks, start).await
}

async fn finish(
    kind: &str,
    tasks: Vec<tokio::task::JoinHandle<Tally>>,
    start: Instant,
) -> Result<String> {
    let mut all = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let t = task.await?;
        all.extend(t.samples_ns);
        errors += t.errors;
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
    Ok(serde_json::json!({
        "kind": kind,
        "count": all.len(),
        "errors": errors,
        "secs": secs,
        "rate": all.len() as f64 / secs,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
        "p999_us": pct(0.999),
    })
    .to_string())
}

/// Opens `n` connections (32 at a time), one exchange on each, prints `{"held": n, ...}` and
/// holds them idle until standard input closes or `limit` passes.
async fn hold(addr: SocketAddr, n: usize, limit: Duration) -> Result<()> {
    let start = Instant::now();
    let mut held = Vec::with_capacity(n);
    let mut errors = 0u64;
    let mut pending = tokio::task::JoinSet::new();
    let mut launched = 0;
    while held.len() + (errors as usize) < n {
        while launched < n && pending.len() < 32 {
            launched += 1;
            pending.spawn(async move {
                let mut s = connect(addr).await?;
                exchange(&mut s).await?;
                Ok::<_, anyhow::Error>(s)
            });
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
