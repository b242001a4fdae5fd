//! The runner's child processes: the same binary started again with a mode argument, so that
//! the benchmark's own loopback programs can be pinned like every other process and their CPU
//! is never counted as the proxy's. This module reads the mode and hands it to the piece that
//! does the work:
//!
//! - `--serve-echo PORT`: an echo server on 127.0.0.1:PORT ([`crate::loadgen`]);
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
//!   then held idle;
//! - `--loadgen h2-hold ADDR N SECS CA COOKIE`: N HTTP/2 clients over TLS, one request each,
//!   then held idle ([`crate::h2`]).
//!
//! Each prints one JSON line on standard output. Every loop is bounded by time and by count,
//! and every child exits when its standard input closes (the runner is gone).

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::time::timeout;

use crate::loadgen::{self, echo, parse, serve_loop};
use crate::{h2, http, tls};

/// A server lives at most this long, even if nobody stops it.
const SERVER_LIFETIME: Duration = Duration::from_secs(4 * 3600);

/// Runs the child mode named by `args`, if any.
pub fn run(args: &[String]) -> Option<ExitCode> {
    let mode = args.first()?.as_str();
    if !mode.starts_with("--serve-") && mode != "--loadgen" {
        return None;
    }
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    exit_when_stdin_closes();
    let result = match mode {
        "--loadgen" => runtime().and_then(|rt| rt.block_on(load(&args[1..]))),
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
            "--serve-bulk" => tls::serve_bulk_plain(port(0)?).await,
            "--serve-tls" => {
                let role = tls::Role::parse(args.first().map(String::as_str).unwrap_or(""))?;
                tls::serve_tls(role, port(1)?, path(2)?, path(3)?).await
            }
            "--serve-http" => http::serve_origin([port(0)?, port(1)?]).await,
            _ => bail!("unknown server mode {mode:?}"),
        }
    };
    match timeout(SERVER_LIFETIME, server).await {
        Ok(r) => r,
        Err(_) => Ok(()),
    }
}

/// One of the load generator's loops, whose JSON line it prints.
async fn load(args: &[String]) -> Result<()> {
    let kind = args.first().map(String::as_str).unwrap_or("");
    let line = match kind {
        "tls-hs" => Some(tls::handshakes(args).await?),
        "tls-bulk" => Some(tls::bulk(args).await?),
        "http-hold" => return http::hold(args).await,
        "h2-hold" => return h2::hold(args).await,
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
        "rr" => loadgen::rr(addr, n, duration).await?,
        "crr" => loadgen::crr(addr, n, duration).await?,
        "hold" => return loadgen::hold(addr, n, duration).await,
        _ => bail!(
            "unknown load generator {kind:?} (rr, crr, hold, tls-hs, tls-bulk, http-hold, h2-hold)"
        ),
    };
    println!("{line}");
    Ok(())
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
