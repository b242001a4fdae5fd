//! The results of a run and their Markdown table.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::{Bench, Mode};

/// The paths compared, in the order they run in each round.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Target {
    Direct,
    Appbroker,
    Haproxy,
    Nginx,
}

impl Target {
    pub const ALL: [Target; 4] = [
        Target::Direct,
        Target::Appbroker,
        Target::Haproxy,
        Target::Nginx,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Appbroker => "appbroker",
            Target::Haproxy => "haproxy",
            Target::Nginx => "nginx",
        }
    }

    /// The name in the table.
    pub fn title(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Appbroker => "appbroker",
            Target::Haproxy => "HAProxy",
            Target::Nginx => "nginx",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Better {
    Higher,
    Lower,
}

struct RowDef {
    key: &'static str,
    label: &'static str,
    better: Better,
}

const fn row(key: &'static str, label: &'static str, better: Better) -> RowDef {
    RowDef { key, label, better }
}

/// Every row, in table order.
const ROWS: &[RowDef] = &[
    row("bulk1", "bulk, 1 stream, iperf3 (Gbit/s)", Better::Higher),
    row(
        "bulk4",
        "bulk, 4 streams, iperf3 -P 4 (Gbit/s)",
        Better::Higher,
    ),
    row("tcp_rr", "netperf TCP_RR (trans/s)", Better::Higher),
    row("tcp_rr_p50", "netperf TCP_RR p50 (µs)", Better::Lower),
    row("tcp_rr_p99", "netperf TCP_RR p99 (µs)", Better::Lower),
    row("tcp_crr", "netperf TCP_CRR (conn/s)", Better::Higher),
    row("tcp_crr_p50", "netperf TCP_CRR p50 (µs)", Better::Lower),
    row("tcp_crr_p99", "netperf TCP_CRR p99 (µs)", Better::Lower),
    row(
        "rr64",
        "loadgen RR, 64 connections (trans/s)",
        Better::Higher,
    ),
    row(
        "rr64_p50",
        "loadgen RR, 64 connections p50 (µs)",
        Better::Lower,
    ),
    row(
        "rr64_p99",
        "loadgen RR, 64 connections p99 (µs)",
        Better::Lower,
    ),
    row(
        "rr64_p999",
        "loadgen RR, 64 connections p99.9 (µs)",
        Better::Lower,
    ),
    row("crr", "loadgen CRR, 4 workers (conn/s)", Better::Higher),
    row("crr_p50", "loadgen CRR, 4 workers p50 (µs)", Better::Lower),
    row("crr_p99", "loadgen CRR, 4 workers p99 (µs)", Better::Lower),
    row(
        "crr_p999",
        "loadgen CRR, 4 workers p99.9 (µs)",
        Better::Lower,
    ),
    row(
        "cpu_bulk1",
        "proxy CPU per GB, bulk 1 stream (ms)",
        Better::Lower,
    ),
    row(
        "cpu_bulk4",
        "proxy CPU per GB, bulk 4 streams (ms)",
        Better::Lower,
    ),
    row(
        "cpu_tcp_rr",
        "proxy CPU per transaction, TCP_RR (µs)",
        Better::Lower,
    ),
    row(
        "cpu_rr64",
        "proxy CPU per transaction, loadgen RR 64 (µs)",
        Better::Lower,
    ),
    row(
        "cpu_tcp_crr",
        "proxy CPU per new connection, TCP_CRR (µs)",
        Better::Lower,
    ),
    row(
        "cpu_crr",
        "proxy CPU per new connection, loadgen CRR (µs)",
        Better::Lower,
    ),
    row(
        "mem_user",
        "idle connection memory, user space (bytes)",
        Better::Lower,
    ),
    row(
        "mem_kernel",
        "idle connection memory, kernel (bytes)",
        Better::Lower,
    ),
    row(
        "mem_total",
        "idle connection memory, total (bytes)",
        Better::Lower,
    ),
];

/// Every value measured in one mode, by row key and target, one per round.
#[derive(Default)]
pub struct Results {
    values: HashMap<(&'static str, Target), Vec<f64>>,
}

impl Results {
    pub fn add(&mut self, key: &'static str, target: Target, value: f64) {
        self.values.entry((key, target)).or_default().push(value);
    }

    /// Median, min, max.
    fn stats(&self, key: &str, target: Target) -> Option<(f64, f64, f64)> {
        let (_, v) = self
            .values
            .iter()
            .find(|((k, t), _)| *k == key && *t == target)?;
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
    for r in ROWS {
        let stats: Vec<Option<(f64, f64, f64)>> = Target::ALL
            .iter()
            .map(|t| {
                if has(*t) {
                    results.stats(r.key, *t)
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
    let _ = writeln!(out, "- peers: {}", versions.join("; "));
    let _ = writeln!(
        out,
        "- memory: {} idle connections{}",
        bench.opts.connections,
        if bench.tools.memory_py.is_some() {
            ", measured by benches/memory.py"
        } else {
            ", measured by the runner's fallback (see the notes)"
        }
    );
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
    out
}

/// User-space, kernel and total bytes per connection out of memory.py's JSON line:
/// `user_bytes_per_conn` (VmRSS for one process, Pss for several), `kernel_total_bytes_per_conn`
/// (socket buffers plus socket structures) and `total_bytes_per_conn`.
pub fn memory_values(json: &serde_json::Value) -> Option<Vec<(&'static str, f64)>> {
    let user = json.get("user_bytes_per_conn")?.as_f64()?;
    let kernel = json.get("kernel_total_bytes_per_conn")?.as_f64()?;
    let total = json
        .get("total_bytes_per_conn")
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(user + kernel);
    Some(vec![
        ("mem_user", user),
        ("mem_kernel", kernel),
        ("mem_total", total),
    ])
}
