//! The results of a run and their Markdown table.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::h2::H2Load;
use crate::http::HttpLoad;
use crate::metric::{Family, METRICS, Metric, Target};
use crate::{Bench, Mode};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Better {
    Higher,
    Lower,
}

struct Row {
    key: String,
    label: String,
    better: Better,
}

fn row(key: impl Into<String>, label: impl Into<String>, better: Better) -> Row {
    Row {
        key: key.into(),
        label: label.into(),
        better,
    }
}

/// Every row, in table order.
fn rows() -> Vec<Row> {
    use Better::{Higher, Lower};
    let mut rows = vec![
        row("bulk1", "bulk, 1 stream, iperf3 (Gbit/s)", Higher),
        row("bulk4", "bulk, 4 streams, iperf3 -P 4 (Gbit/s)", Higher),
        row("tcp_rr", "netperf TCP_RR (trans/s)", Higher),
        row("tcp_rr_p50", "netperf TCP_RR p50 (µs)", Lower),
        row("tcp_rr_p99", "netperf TCP_RR p99 (µs)", Lower),
        row("tcp_crr", "netperf TCP_CRR (conn/s)", Higher),
        row("tcp_crr_p50", "netperf TCP_CRR p50 (µs)", Lower),
        row("tcp_crr_p99", "netperf TCP_CRR p99 (µs)", Lower),
        row("rr64", "loadgen RR, 64 connections (trans/s)", Higher),
        row("rr64_p50", "loadgen RR, 64 connections p50 (µs)", Lower),
        row("rr64_p99", "loadgen RR, 64 connections p99 (µs)", Lower),
        row("rr64_p999", "loadgen RR, 64 connections p99.9 (µs)", Lower),
        row("crr", "loadgen CRR, 4 workers (conn/s)", Higher),
        row("crr_p50", "loadgen CRR, 4 workers p50 (µs)", Lower),
        row("crr_p99", "loadgen CRR, 4 workers p99 (µs)", Lower),
        row("crr_p999", "loadgen CRR, 4 workers p99.9 (µs)", Lower),
        row("cpu_bulk1", "proxy CPU per GB, bulk 1 stream (ms)", Lower),
        row("cpu_bulk4", "proxy CPU per GB, bulk 4 streams (ms)", Lower),
        row(
            "cpu_tcp_rr",
            "proxy CPU per transaction, TCP_RR (µs)",
            Lower,
        ),
        row(
            "cpu_rr64",
            "proxy CPU per transaction, loadgen RR 64 (µs)",
            Lower,
        ),
        row(
            "cpu_tcp_crr",
            "proxy CPU per new connection, TCP_CRR (µs)",
            Lower,
        ),
        row(
            "cpu_crr",
            "proxy CPU per new connection, loadgen CRR (µs)",
            Lower,
        ),
        row(
            "mem_user",
            "idle connection memory, user space (bytes)",
            Lower,
        ),
        row(
            "mem_kernel",
            "idle connection memory, kernel (bytes)",
            Lower,
        ),
        row("mem_total", "idle connection memory, total (bytes)", Lower),
    ];
    // TLS: CPU per handshake first (on 2 CPUs the rates are bounded by the load generator),
    // then the rates and their p99, then bulk.
    let handshakes: Vec<(String, String)> = METRICS
        .into_iter()
        .filter_map(|m| match m {
            Metric::TlsHandshakes(v, k) => Some((m.name(), v.title(), k.title())),
            _ => None,
        })
        .flat_map(|(name, v, k)| {
            ["full", "resumed"].map(|kind| (format!("{name}_{kind}"), format!("{v}, {k}, {kind}")))
        })
        .collect();
    for (key, what) in &handshakes {
        rows.push(row(
            format!("cpu_{key}"),
            format!("proxy CPU per TLS connection, {what} (µs)"),
            Lower,
        ));
    }
    for (key, what) in &handshakes {
        rows.push(row(
            key,
            format!("TLS handshakes, {what}, 4 workers (conn/s)"),
            Higher,
        ));
        rows.push(row(
            format!("{key}_p99"),
            format!("TLS handshakes, {what}, p99 (µs)"),
            Lower,
        ));
    }
    for (way, what) in [("up", "client to server"), ("down", "server to client")] {
        rows.push(row(
            format!("tls_bulk_{way}"),
            format!("TLS 1.3 bulk, 1 stream, {what} (Gbit/s)"),
            Higher,
        ));
    }
    for (way, what) in [("up", "client to server"), ("down", "server to client")] {
        rows.push(row(
            format!("cpu_tls_bulk_{way}"),
            format!("proxy CPU per GB, TLS 1.3 bulk {what} (ms)"),
            Lower,
        ));
    }
    // HTTP: rates and latency, CPU per request, memory per idle keep-alive client.
    let loads = [HttpLoad::KeepAlive, HttpLoad::Close, HttpLoad::NewSession];
    for load in loads {
        let (key, what) = (load.name(), load.title());
        rows.push(row(key, format!("{what}, wrk (req/s)"), Higher));
        rows.push(row(
            format!("{key}_p50"),
            format!("{what}, p50 (µs)"),
            Lower,
        ));
        rows.push(row(
            format!("{key}_p99"),
            format!("{what}, p99 (µs)"),
            Lower,
        ));
    }
    for load in loads {
        rows.push(row(
            format!("cpu_{}", load.name()),
            format!("proxy CPU per request, {} (µs)", load.title()),
            Lower,
        ));
    }
    for (part, what) in [
        ("user", "user space"),
        ("kernel", "kernel"),
        ("total", "total"),
    ] {
        rows.push(row(
            format!("http_mem_{part}"),
            format!("idle keep-alive HTTP client memory, {what} (bytes)"),
            Lower,
        ));
    }
    // HTTP/2: rates, CPU per request, memory per idle client.
    for load in [H2Load::One, H2Load::Sixteen] {
        let (key, what) = (load.name(), load.title());
        rows.push(row(key, format!("{what}, h2load (req/s)"), Higher));
        rows.push(row(
            format!("cpu_{key}"),
            format!("proxy CPU per request, {what} (µs)"),
            Lower,
        ));
    }
    for (part, what) in [
        ("user", "user space"),
        ("kernel", "kernel"),
        ("total", "total"),
    ] {
        rows.push(row(
            format!("h2_mem_{part}"),
            format!("idle HTTP/2 client over TLS memory, {what} (bytes)"),
            Lower,
        ));
    }
    rows
}

/// Every value measured in one mode, by row key and target, one per round.
#[derive(Default)]
pub struct Results {
    values: HashMap<(String, Target), Vec<f64>>,
}

impl Results {
    pub fn add(&mut self, key: &str, target: Target, value: f64) {
        self.values
            .entry((key.to_string(), target))
            .or_default()
            .push(value);
    }

    /// Median, min, max.
    fn stats(&self, key: &str, target: Target) -> Option<(f64, f64, f64)> {
        let v = self.values.get(&(key.to_string(), target))?;
        if v.is_empty() {
            return None;
        }
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some((median, v[0], v[n - 1]))
    }
}

/// A figure with as many digits as it deserves: 12,345 / 123 / 12.3 / 1.23.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        let digits = format!("{:.0}", a);
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if v < 0.0 { format!("-{out}") } else { out }
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn cell(stats: Option<(f64, f64, f64)>) -> String {
    match stats {
        None => "-".to_string(),
        Some((median, min, max)) => format!(
            "{} <small>{}–{}</small>",
            number(median),
            number(min),
            number(max)
        ),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => format!("{:.2}", a / b),
        _ => String::new(),
    }
}

/// The table of one mode.
fn table(results: &Results, targets: &[Target]) -> String {
    let has = |t: Target| targets.contains(&t);
    let mut out = String::new();
    out.push_str(
        "| metric | direct | appbroker | HAProxy | nginx | appbroker/direct | HAProxy/direct | \
         nginx/direct | appbroker/best anchor |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows() {
        let stats: Vec<Option<(f64, f64, f64)>> = Target::ALL
            .iter()
            .map(|t| {
                if has(*t) {
                    results.stats(&r.key, *t)
                } else {
                    None
                }
            })
            .collect();
        if stats.iter().all(Option::is_none) {
            continue;
        }
        let median = |i: usize| stats[i].map(|s| s.0);
        let direct = median(0);
        let anchors: Vec<(Target, f64)> = [(Target::Haproxy, 2), (Target::Nginx, 3)]
            .into_iter()
            .filter_map(|(t, i)| median(i).map(|m| (t, m)))
            .collect();
        let best = anchors.into_iter().reduce(|a, b| {
            let b_better = match r.better {
                Better::Higher => b.1 > a.1,
                Better::Lower => b.1 < a.1,
            };
            if b_better { b } else { a }
        });
        let vs_best = match (median(1), best) {
            (Some(a), Some((t, b))) if b != 0.0 => {
                format!("{:.2} <small>vs {}</small>", a / b, t.title())
            }
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            cell(stats[0]),
            cell(stats[1]),
            cell(stats[2]),
            cell(stats[3]),
            ratio(median(1), direct),
            ratio(median(2), direct),
            ratio(median(3), direct),
            vs_best,
        );
    }
    out
}

fn first_line_of(path: &str, prefix: &str) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(prefix))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// The whole report: machine, command, notes, one table per mode.
pub fn render(bench: &Bench, sections: &[(Mode, Results)], took: Duration) -> String {
    let mut out = String::new();
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get().to_string())
        .unwrap_or_else(|_| "?".into());
    let model = first_line_of("/proc/cpuinfo", "model name");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let mut command = String::from("cargo bench --bench proxies");
    if !bench.opts.args.is_empty() {
        command.push_str(" -- ");
        command.push_str(&bench.opts.args.join(" "));
    }
    let _ = writeln!(out, "# appbroker side-by-side benchmark\n");
    let _ = writeln!(out, "- command: `{command}`");
    let _ = writeln!(
        out,
        "- {} round(s) of {} s per measurement{}, interleaved (for each round, for each \
         metric: direct, appbroker, HAProxy, nginx); each cell is the median \
         <small>min–max</small> of the rounds; took {:.0} s",
        bench.opts.rounds,
        bench.opts.secs,
        if bench.opts.quick { " (--quick)" } else { "" },
        took.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "- machine: {nproc} CPUs, {model}, Linux {kernel}; load average at the start {}; date {}",
        bench.load_average,
        chrono::Local::now().format("%Y-%m-%d %H:%M")
    );
    let mut versions = Vec::new();
    if let Some(p) = &bench.tools.haproxy {
        versions.push(crate::procs::version_line(p, "-v"));
    }
    if let Some((p, _)) = &bench.tools.nginx {
        versions.push(crate::procs::version_line(p, "-v"));
    }
    if let Some(p) = &bench.tools.iperf3 {
        versions.push(crate::procs::version_line(p, "-v"));
    }
    if let Some(p) = &bench.tools.netperf {
        versions.push(crate::procs::version_line(p, "-V"));
    }
    if let Some(p) = &bench.tools.wrk {
        versions.push(crate::procs::version_line(p, "-v"));
    }
    let _ = writeln!(out, "- peers: {}", versions.join("; "));
    let memory = bench.opts.metrics.contains(&Metric::Memory);
    if memory || bench.opts.metrics.contains(&Metric::HttpMemory) {
        let _ = writeln!(
            out,
            "- memory: {} idle connections{}",
            bench.opts.connections,
            if memory && bench.tools.memory_py.is_some() {
                ", measured by benches/memory.py (HTTP clients: by the runner's own measurement)"
            } else {
                ", measured by the runner's own measurement (see the notes)"
            }
        );
    }
    if bench.wants(Family::Tls) {
        let _ = writeln!(
            out,
            "- TLS: an ECDSA P-256 and an RSA 2048 certificate made at the start (one CA), the \
             same files for every target; every listener speaks TLS 1.2 and 1.3 with session \
             tickets and a session cache; the client offers the groups X25519 (its key share) and P-256"
        );
    }
    if bench.wants(Family::Http) {
        let _ = writeln!(
            out,
            "- HTTP: access logs {} for every proxy{}",
            if bench.opts.access_log { "on" } else { "off" },
            if bench.opts.access_log {
                " (--access-log)"
            } else {
                " (--access-log turns them on)"
            }
        );
    }
    let targets: Vec<Target> = bench.opts.targets.clone();
    for (mode, results) in sections {
        let title = match mode {
            Mode::Unpinned => "Unpinned (the scheduler places every process on either CPU)",
            Mode::Pinned => "Pinned (every process under `taskset -c 0`)",
        };
        let _ = writeln!(out, "\n## {title}\n");
        out.push_str(&table(results, &targets));
    }
    if !bench.notes.is_empty() {
        let _ = writeln!(out, "\nNotes:\n");
        for n in &bench.notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    if !bench.negotiated.is_empty() {
        let _ = writeln!(
            out,
            "\nWhat the TLS handshakes negotiated (version, cipher suite, group, as the client \
             saw them):\n"
        );
        for (row, by_target) in &bench.negotiated {
            let mut distinct: Vec<&String> = by_target.values().collect();
            distinct.sort();
            distinct.dedup();
            if distinct.len() == 1 {
                let targets: Vec<&str> =
                    by_target.keys().map(|t| Target::ALL[*t].title()).collect();
                let _ = writeln!(out, "- {row}: {} ({})", distinct[0], targets.join(", "));
            } else {
                let each: Vec<String> = by_target
                    .iter()
                    .map(|(t, n)| format!("{} {n}", Target::ALL[*t].title()))
                    .collect();
                let _ = writeln!(out, "- {row}: NOT ALIKE: {}", each.join("; "));
            }
        }
    }
    out
}

/// User-space, kernel and total bytes per connection out of memory.py's JSON line:
/// `user_bytes_per_conn` (VmRSS for one process, Pss for several), `kernel_total_bytes_per_conn`
/// (socket buffers plus socket structures) and `total_bytes_per_conn`.
pub fn memory_values(json: &serde_json::Value) -> Option<Vec<(String, f64)>> {
    let user = json.get("user_bytes_per_conn")?.as_f64()?;
    let kernel = json.get("kernel_total_bytes_per_conn")?.as_f64()?;
    let total = json
        .get("total_bytes_per_conn")
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(user + kernel);
    Some(vec![
        ("mem_user".into(), user),
        ("mem_kernel".into(), kernel),
        ("mem_total".into(), total),
    ])
}
