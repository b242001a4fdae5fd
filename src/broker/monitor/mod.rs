//! The monitor: every `MONITOR_INTERVAL` a round checks every server of a balancer in
//! parallel (a TCP connect through the [dialer](crate::net::dial), and for SEND_EXPECT a probe and
//! its reply, for HTTP a request; a PROXY protocol header first with `SEND_PROXY_PROTOCOL`), counts failed and passed checks in a row against `MONITOR_FALL` and
//! `MONITOR_RISE` (1 by default, which is TOTVS), hands the results to the balancer's methods,
//! and logs the round's summary lines operators expect. Between rounds it wakes when a
//! quarantine's time is up, so the balancer releases it on time.
//!
//! - [`http_check`]: `MONITORING_TYPE=HTTP`: one `GET` of `MONITOR_PATH`, its status judged.

pub mod http_check;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, warn};

use crate::balancer::events::Event;
use crate::balancer::rules::health::{CheckResult, Reason, Release};
use crate::balancer::{Balancer, Generation, Server};
use crate::config::{BalancerConfig, Host, Monitoring, plural, show_duration, show_escaped};

use crate::net::dial::{ConnectError, connect_with_preface, dial};
use crate::net::proxy_protocol::{self, Header};
use crate::net::resolve::Resolver;
use crate::support::clock::wall_ms;
use crate::support::os_error::{Explained, PointsAt};
use crate::tls::UpstreamTls;

/// Runs monitor rounds (unless monitoring is disabled) and releases quarantines whose time is
/// up, until `stop` is cancelled.
pub async fn run(balancer: Arc<Balancer>, stop: CancellationToken) {
    let mut last_round: Option<Instant> = None;
    loop {
        let generation = balancer.generation();
        let monitoring = generation.config.monitoring != Monitoring::Disabled;
        // Read from the generation each time, so a reloaded MONITOR_INTERVAL applies at once.
        let mut next_round =
            last_round.map_or_else(Instant::now, |t| t + generation.config.monitor_interval);
        if monitoring && Instant::now() >= next_round {
            round(&balancer, &generation).await;
            last_round = Some(Instant::now());
            next_round = Instant::now() + generation.config.monitor_interval;
        }
        let deadline = balancer.sweep_expired_quarantines();
        let wake = match (monitoring.then_some(next_round), deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep => {}
            _ = balancer.health_changed() => {}
        }
    }
}

/// Why a check failed.
#[derive(Debug)]
pub enum CheckError {
    /// The TCP connect (or the lookup of the server's name) failed.
    Connect(ConnectError),
    /// SEND_EXPECT: no (complete) reply within the time allowed.
    NoReply {
        /// What had arrived when time ran out.
        got: Vec<u8>,
    },
    /// SEND_EXPECT: the reply does not start with what was expected.
    Mismatch {
        /// The start of the reply.
        got: Vec<u8>,
    },
    /// SEND_EXPECT: the server closed (or reset) the connection before a full reply.
    Closed {
        /// What had arrived.
        got: Vec<u8>,
    },
    /// HTTP: no answer in time, not HTTP, or a status outside `MONITOR_EXPECT_STATUS`.
    Http(http_check::HttpCheckError),
}

impl CheckError {
    /// The failure in words, for logs and pages.
    pub fn words(&self) -> String {
        match self {
            CheckError::Connect(e) => e.explain().words,
            CheckError::NoReply { got } if got.is_empty() => {
                "no reply: the port accepts but the application does not answer".into()
            }
            CheckError::NoReply { got } => format!("incomplete reply `{}`", show_escaped(got)),
            CheckError::Mismatch { got } => format!("unexpected reply `{}`", show_escaped(got)),
            CheckError::Closed { got } if got.is_empty() => "closed without replying".into(),
            CheckError::Closed { got } => format!("closed after `{}`", show_escaped(got)),
            CheckError::Http(e) => e.to_string(),
        }
    }

    /// The full log text: the words with what they point at.
    fn explain(&self, timeout: Duration, expect: &[u8]) -> String {
        match self {
            CheckError::Connect(e) => e.explain().to_string(),
            CheckError::NoReply { .. } => format!(
                "{} within {} (SEND_EXPECT, expecting `{}`); points at the server's application",
                self.words(),
                show_duration(timeout),
                show_escaped(expect)
            ),
            CheckError::Http(_) => format!(
                "{} (MONITORING_TYPE=HTTP); points at the server's application or a wrong \
                 MONITOR_PATH or MONITOR_EXPECT_STATUS",
                self.words()
            ),
            CheckError::Mismatch { .. } | CheckError::Closed { .. } => format!(
                "{} (SEND_EXPECT, expecting `{}`); points at the server's application or a wrong \
                 MONITOR_EXPECT",
                self.words(),
                show_escaped(expect)
            ),
        }
    }

    /// The connect's failure when it is the broker's own (out of descriptors): no server is
    /// to blame for it.
    fn broker_fault(&self) -> Option<Explained> {
        match self {
            CheckError::Connect(e) => Some(e.explain()).filter(|e| e.points_at == PointsAt::Broker),
            _ => None,
        }
    }
}

/// Checks one server: a TCP connect, and for SEND_EXPECT the probe and its reply (for HTTP a
/// `GET` of `MONITOR_PATH`), over TLS with `tls` (`SSL_ENCRYPT_UPSTREAM=1`), all within
/// `config`'s `CONNECT_TIMEOUT`.
pub async fn check(
    resolver: &Arc<Resolver>,
    host: &Host,
    port: u16,
    config: &BalancerConfig,
    tls: Option<&UpstreamTls>,
) -> Result<(), CheckError> {
    let deadline = Instant::now() + config.connect_timeout;
    // With SEND_PROXY_PROTOCOL the server reads a header first: a check's says it is the
    // broker's own connection, no client's (LOCAL; UNKNOWN in version 1, which has no LOCAL).
    // A connect-only check writes it too: a server that reads the header would otherwise log
    // a broken connection every round.
    let preface = proxy_protocol::preface(config.proxy.send, || Header::Local);
    if !matches!(
        config.monitoring,
        Monitoring::SendExpect { .. } | Monitoring::Http { .. }
    ) {
        return connect_with_preface(resolver, host, port, config, &preface)
            .await
            .map(drop)
            .map_err(CheckError::Connect);
    }
    let mut stream = dial(resolver, host, port, config, tls, &preface)
        .await
        .map_err(CheckError::Connect)?;
    let (send, expect) = match &config.monitoring {
        Monitoring::Http { path, expect } => {
            let check = http_check::HttpCheck {
                path: path.clone(),
                host: host.authority(port),
                expect: *expect,
                timeout: deadline.saturating_duration_since(Instant::now()),
            };
            return http_check::check(stream, &check)
                .await
                .map(drop)
                .map_err(CheckError::Http);
        }
        Monitoring::SendExpect { send, expect } => (send, expect),
        _ => return Ok(()),
    };
    let mut got = Vec::with_capacity(expect.len());
    let exchange = async {
        if stream.write_all(send).await.is_err() {
            return Err(CheckError::Closed { got: Vec::new() });
        }
        let mut chunk = [0u8; 512];
        while got.len() < expect.len() {
            let n = match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    return Err(CheckError::Closed {
                        got: std::mem::take(&mut got),
                    });
                }
                Ok(n) => n,
            };
            got.extend_from_slice(&chunk[..n]);
            let compared = got.len().min(expect.len());
            if got[..compared] != expect[..compared] {
                got.truncate(64);
                return Err(CheckError::Mismatch {
                    got: std::mem::take(&mut got),
                });
            }
        }
        Ok(())
    };
    match tokio::time::timeout_at(deadline, exchange).await {
        Ok(result) => result,
        Err(_) => Err(CheckError::NoReply { got }),
    }
}

/// One server's check: how long it took and how it went.
type CheckOutcome = (Duration, Result<(), CheckError>);

/// One monitor round: every server checked in parallel, then each result judged and logged
/// in configuration order, then the summary. A check that fails for the broker's own reasons
/// (out of file descriptors) blames no server: the server is counted as not checked.
async fn round(balancer: &Balancer, generation: &Arc<Generation>) {
    let outcomes = check_all(balancer, generation).await;
    let mut unchecked: Vec<usize> = Vec::new();
    let mut cause: Option<Explained> = None;
    for (index, (server, (took, result))) in generation.servers.iter().zip(outcomes).enumerate() {
        match result {
            Ok(()) => passed(balancer, generation, server, took),
            Err(e) => match e.broker_fault() {
                Some(explained) => {
                    unchecked.push(index);
                    cause.get_or_insert(explained);
                }
                None => failed(balancer, generation, server, took, &e),
            },
        }
    }
    summarize(balancer, generation, &unchecked, cause);
}

/// Checks every server of `generation` at once; the outcomes in configuration order.
async fn check_all(balancer: &Balancer, generation: &Arc<Generation>) -> Vec<CheckOutcome> {
    let mut checks = JoinSet::new();
    for (index, server) in generation.servers.iter().enumerate() {
        let server = Arc::clone(server);
        let (resolver, generation) = (Arc::clone(balancer.resolver()), Arc::clone(generation));
        checks.spawn(
            async move {
                let started = Instant::now();
                let tls = generation.tls.upstream.as_ref();
                let result = check(
                    &resolver,
                    &server.host,
                    server.port,
                    &generation.config,
                    tls,
                )
                .await;
                (index, started.elapsed(), result)
            }
            .in_current_span(),
        );
    }
    let mut outcomes: Vec<Option<CheckOutcome>> =
        (0..generation.servers.len()).map(|_| None).collect();
    while let Some(joined) = checks.join_next().await {
        if let Ok((index, took, result)) = joined {
            outcomes[index] = Some((took, result));
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| {
                let failed = io::Error::other("the check task failed");
                (
                    Duration::ZERO,
                    Err(CheckError::Connect(ConnectError::Io(failed))),
                )
            })
        })
        .collect()
}

/// A passed check: `MONITOR_RISE` of them in a row release a quarantined server.
fn passed(balancer: &Balancer, generation: &Generation, server: &Server, took: Duration) {
    let check = CheckResult {
        at_wall_ms: wall_ms(),
        duration: took,
        error: None,
    };
    let passes = balancer.check_passed(server, check);
    balancer.events().emit(|| Event::CheckPassed {
        balancer: generation.config.kind,
        server: server.address.clone(),
        in_a_row: passes,
    });
    if !server.is_quarantined() {
        return;
    }
    if server.quarantine_reason() == Some(Reason::Timeout)
        && matches!(generation.config.monitoring, Monitoring::Connection)
    {
        // The port accepting proves nothing to a server quarantined for not answering its
        // requests: its quarantine runs its time (a SEND_EXPECT or HTTP check could end it).
        return;
    }
    let rise = generation.config.monitor_rise;
    if passes >= rise {
        balancer.release_recovered(server, Release::CheckPassed);
    } else {
        info!(
            "server {} passed the monitor check ({passes} of MONITOR_RISE={rise} to leave quarantine)",
            server.address
        );
    }
}

/// A failed check: `MONITOR_FALL` of them in a row quarantine the server, and each failure of
/// a quarantined one extends its quarantine. The cause is logged once per episode (and when it
/// changes), while the TOTVS quarantine line still comes every round.
fn failed(
    balancer: &Balancer,
    generation: &Generation,
    server: &Server,
    took: Duration,
    e: &CheckError,
) {
    let config = &generation.config;
    let words = e.words();
    let check = CheckResult {
        at_wall_ms: wall_ms(),
        duration: took,
        error: Some(words.clone()),
    };
    let counted = balancer.check_failed(server, check);
    let expect = match &config.monitoring {
        Monitoring::SendExpect { expect, .. } => expect.as_slice(),
        _ => &[],
    };
    let explained = e.explain(config.connect_timeout, expect);
    balancer.events().emit(|| Event::CheckFailed {
        balancer: config.kind,
        server: server.address.clone(),
        error: words.clone(),
        explained: explained.clone(),
        in_a_row: counted.in_a_row,
    });
    let fall = config.monitor_fall;
    if counted.in_a_row >= fall || server.is_quarantined() {
        if !counted.repeated {
            error!(
                "server {} failed the monitor check: {explained}",
                server.address
            );
        }
        balancer.quarantine(server, Reason::Monitor, &words);
    } else {
        // Below MONITOR_FALL it still takes clients: not counted unavailable yet.
        warn!(
            "server {} failed the monitor check ({} of MONITOR_FALL={fall} before quarantine): {explained}",
            server.address, counted.in_a_row
        );
    }
}

/// The round's summary lines: how many servers are available, each unavailable one (in
/// quarantine, for whatever reason), servers not checked and why, and the alarm when none is
/// left.
fn summarize(
    balancer: &Balancer,
    generation: &Generation,
    unchecked: &[usize],
    cause: Option<Explained>,
) {
    let now = balancer.clock_ms();
    let unavailable: Vec<&str> = generation
        .servers
        .iter()
        .enumerate()
        .filter(|(i, s)| !unchecked.contains(i) && !s.is_available(now))
        .map(|(_, s)| s.address.as_str())
        .collect();
    if let Some(explained) = cause {
        error!(
            "monitor: {} not checked: {explained}; no server is blamed",
            plural(unchecked.len(), "server")
        );
    }
    let available = generation.servers.len() - unavailable.len() - unchecked.len();
    let not_checked = if unchecked.is_empty() {
        String::new()
    } else {
        format!(", {} not checked", unchecked.len())
    };
    info!(
        "monitor: OK - {} available, {} unavailable{not_checked}",
        plural(available, "server"),
        plural(unavailable.len(), "server")
    );
    for address in &unavailable {
        warn!("monitor: server {address} unavailable");
    }
    if available == 0 && unchecked.is_empty() {
        error!("monitor: attention, there are no remote servers available");
    }
    balancer.events().emit(|| Event::MonitorRound {
        balancer: generation.config.kind,
        available,
        unavailable: unavailable.iter().map(|a| a.to_string()).collect(),
        unchecked: unchecked.len(),
    });
}
