//! The side-by-side benchmark: the direct path, appbroker, HAProxy and nginx on loopback,
//! interleaved, with iperf3, netperf, wrk and a load generator of our own, over plain TCP,
//! TLS and HTTP. docs/benchmarks.md says what is measured and how; `cargo bench --bench
//! proxies -- --help` lists the options.
//!
//! ```text
//! cargo bench --bench proxies -- --quick            # one short round, about a minute and a half
//! cargo bench --bench proxies -- --both             # 3 rounds of 5 s, unpinned and pinned
//! ```
//!
//! The modules import one another one way (tests/module_graph.rs holds it), the drivers above
//! the pieces they share:
//!
//! - this file: the options, the run's state ([`Bench`]) and the round loop;
//! - [`child`]: the same binary started again as one of the runner's servers or load
//!   generators, handing the mode to the piece below that does it;
//! - [`report`]: the results and their Markdown table;
//! - [`metric`]: what is measured (metrics, targets, families of templates);
//! - [`http`] and [`tls`]: the HTTP and TLS rows' servers, load loops and checks (and the
//!   methods of [`Bench`] that run those rows: a module may name its parent's items);
//! - [`loadgen`]: the plain TCP load loops, their tallies, the accept loop and echo;
//! - [`procs`]: every process the runner starts, and its /proc readings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod child;
mod h2;
mod http;
mod loadgen;
mod metric;
mod procs;
mod report;
mod tls;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use metric::{Family, METRICS, Metric, Setup, Target};
use procs::{Proc, Spec};
use report::Results;

const HELP: &str = "\
cargo bench --bench proxies -- [OPTIONS]

Runs the direct path, appbroker, HAProxy and nginx side by side on loopback and prints a
Markdown table per mode (also written to target/bench-results.md). docs/benchmarks.md has the
details and the setup (apt-get install haproxy nginx libnginx-mod-stream iperf3 netperf wrk).

  --quick              one round of 1 s per measurement (default: 3 rounds of 5 s)
  --unpinned           processes go where the scheduler puts them (the default)
  --pinned             everything under `taskset -c 0`
  --both               unpinned, then pinned
  --only LIST          targets, comma-separated: direct,appbroker,haproxy,nginx (default: all)
  --metrics LIST       metrics or groups, comma-separated (default: all):
                         tcp:  bulk1,bulk4,tcp_rr,tcp_crr,rr64,crr,memory
                         tls:  tls13_ecdsa,tls13_rsa,tls12_ecdsa,tls12_rsa,tls_bulk
                         http: http_ka,http_close,http_session,http_memory
                         h2:   h2_1,h2_16,h2_memory (h2load over TLS; no direct path)
  --access-log         HTTP rows with every proxy's access log on (default: off for all)
  --rounds N           rounds (default 3, 1 with --quick)
  --secs S             seconds per measurement (default 5, 1 with --quick)
  --connections N      idle connections for the memory measurements (default 8000)
  --base-port P        ports P..P+13 on 127.0.0.1 are used (default 23400)
  --memory TOOL        script: benches/memory.py; fallback: the runner's own measurement;
                       auto (default): the script when present, except with --quick
  --help               this text
";

/// Connections of the load generator's request/response run, and workers of its churn and
/// TLS handshake runs.
const RR_CONNECTIONS: usize = 64;
const CRR_WORKERS: usize = 4;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Unpinned,
    Pinned,
}

/// Which memory measurement: benches/memory.py (the reliability work's script) or the
/// runner's own, faster fallback.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MemoryTool {
    /// memory.py when it is in the tree, except under --quick.
    Auto,
    Script,
    Fallback,
}

struct Opts {
    quick: bool,
    modes: Vec<Mode>,
    targets: Vec<Target>,
    metrics: Vec<Metric>,
    rounds: usize,
    secs: u64,
    connections: usize,
    base_port: u16,
    memory: MemoryTool,
    /// `--access-log`: the HTTP rows with every proxy writing an access log line per request.
    access_log: bool,
    /// The arguments as given (without cargo's `--bench`), for the report.
    args: Vec<String>,
}

fn parse_opts(args: &[String]) -> Result<Option<Opts>> {
    let mut quick = false;
    let mut modes = vec![Mode::Unpinned];
    let mut targets = Target::ALL.to_vec();
    let mut metrics = METRICS.to_vec();
    let mut rounds = None;
    let mut secs = None;
    let mut connections = 8000;
    let mut base_port = 23400;
    let mut memory = MemoryTool::Auto;
    let mut access_log = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| anyhow!("{name} needs a value"))
        };
        match arg.as_str() {
            "--bench" => {} // cargo passes it to every bench target
            "--help" | "-h" => return Ok(None),
            "--quick" => quick = true,
            "--pinned" => modes = vec![Mode::Pinned],
            "--unpinned" => modes = vec![Mode::Unpinned],
            "--both" => modes = vec![Mode::Unpinned, Mode::Pinned],
            "--only" => {
                targets = Vec::new();
                for name in value("--only")?.split(',').filter(|s| !s.is_empty()) {
                    let t = Target::ALL
                        .into_iter()
                        .find(|t| t.name() == name.trim().to_ascii_lowercase())
                        .ok_or_else(|| anyhow!("--only: unknown target {name:?}"))?;
                    if !targets.contains(&t) {
                        targets.push(t);
                    }
                }
                targets.sort_by_key(|t| *t as usize);
            }
            "--metrics" => metrics = metric::parse_metrics(&value("--metrics")?)?,
            "--access-log" => access_log = true,
            "--rounds" => rounds = Some(value("--rounds")?.parse().context("--rounds")?),
            "--secs" => secs = Some(value("--secs")?.parse().context("--secs")?),
            "--connections" => connections = value("--connections")?.parse()?,
            "--base-port" => base_port = value("--base-port")?.parse()?,
            "--memory" => {
                memory = match value("--memory")?.as_str() {
                    "auto" => MemoryTool::Auto,
                    "script" => MemoryTool::Script,
                    "fallback" => MemoryTool::Fallback,
                    other => bail!("--memory: {other:?} is not auto, script or fallback"),
                }
            }
            other => bail!("unknown option {other:?} (--help lists them)"),
        }
    }
    let rounds: usize = rounds.unwrap_or(if quick { 1 } else { 3 });
    let secs: u64 = secs.unwrap_or(if quick { 1 } else { 5 });
    if rounds == 0 || rounds > 100 || secs == 0 || secs > 600 {
        bail!("--rounds must be 1-100 and --secs 1-600");
    }
    if targets.is_empty() || metrics.is_empty() {
        bail!("nothing to run");
    }
    if connections == 0 || connections > 9000 {
        bail!("--connections must be 1-9000 (each proxied connection takes two descriptors)");
    }
    if !(1024..=65000).contains(&base_port) {
        bail!("--base-port must be 1024-65000");
    }
    Ok(Some(Opts {
        quick,
        modes,
        targets,
        metrics,
        rounds,
        secs,
        connections,
        base_port,
        memory,
        access_log,
        args: args.iter().filter(|a| *a != "--bench").cloned().collect(),
    }))
}

/// The loopback ports, all on 127.0.0.1.
#[derive(Clone, Copy)]
struct Ports {
    iperf: u16,
    netserver: u16,
    netperf_data: u16,
    echo: u16,
    /// The port memory.py starts its own echo servers on.
    spare: u16,
    /// The bulk origin behind the proxies' TLS listeners.
    bulk: u16,
    /// The HTTP origin: REMOTE_SERVER_01 and _02 of the HTTP rows.
    http: [u16; 2],
    /// The runner's own TLS echo servers (ECDSA, RSA) and TLS bulk server: the direct path
    /// of the TLS rows.
    tls_echo: [u16; 2],
    tls_bulk: u16,
    appbroker: u16,
    haproxy: u16,
    nginx: u16,
}

impl Ports {
    fn new(base: u16) -> Ports {
        Ports {
            iperf: base,
            netserver: base + 1,
            netperf_data: base + 2,
            echo: base + 3,
            spare: base + 4,
            bulk: base + 5,
            http: [base + 6, base + 7],
            tls_echo: [base + 8, base + 9],
            appbroker: base + 10,
            haproxy: base + 11,
            nginx: base + 12,
            tls_bulk: base + 13,
        }
    }

    fn all(&self) -> [u16; 14] {
        [
            self.iperf,
            self.netserver,
            self.netperf_data,
            self.echo,
            self.spare,
            self.bulk,
            self.http[0],
            self.http[1],
            self.tls_echo[0],
            self.tls_echo[1],
            self.appbroker,
            self.haproxy,
            self.nginx,
            self.tls_bulk,
        ]
    }

    fn tls_echo(&self, key: tls::KeyKind) -> u16 {
        match key {
            tls::KeyKind::Ecdsa => self.tls_echo[0],
            tls::KeyKind::Rsa => self.tls_echo[1],
        }
    }

    fn proxy(&self, target: Target) -> u16 {
        match target {
            Target::Direct => 0,
            Target::Appbroker => self.appbroker,
            Target::Haproxy => self.haproxy,
            Target::Nginx => self.nginx,
        }
    }
}

/// Programs found on this machine; `None` is skipped with a note.
struct Tools {
    appbroker: Option<PathBuf>,
    haproxy: Option<PathBuf>,
    /// nginx, and the `load_module` line its stream module needs (empty when built in).
    nginx: Option<(PathBuf, String)>,
    iperf3: Option<PathBuf>,
    netperf: Option<PathBuf>,
    netserver: Option<PathBuf>,
    shim: Option<PathBuf>,
    memory_py: Option<(PathBuf, PathBuf)>,
    wrk: Option<PathBuf>,
    /// nghttp2-client's h2load: the HTTP/2 rows.
    h2load: Option<PathBuf>,
}

struct Bench {
    opts: Opts,
    tools: Tools,
    ports: Ports,
    /// The repository (templates in benches/).
    root: PathBuf,
    /// target/bench: filled configurations (run/) and every process's output (logs/).
    run_dir: PathBuf,
    log_dir: PathBuf,
    /// This program, started again in its server and load-generator modes.
    exe: PathBuf,
    clk_tck: f64,
    /// /proc/loadavg's 1, 5 and 15 minute figures when the run started: other work on the
    /// machine shows there.
    load_average: String,
    /// memory.py runs so far, to name their saved outputs.
    memory_runs: usize,
    /// The certificates of the TLS rows (None when no TLS metric runs or they could not be
    /// made).
    certs: Option<tls::Certs>,
    /// Families whose appbroker template appbroker does not take (yet): its column stays
    /// empty for their metrics, and a note says why.
    appbroker_rejects: HashSet<Family>,
    /// What each TLS row's handshakes negotiated, per target, to show they compare alike.
    negotiated: BTreeMap<String, BTreeMap<usize, String>>,
    notes: Vec<String>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = child::run(&args) {
        return code;
    }
    let opts = match parse_opts(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("bench: {e:#}");
            return ExitCode::from(2);
        }
    };
    let result = procs::install_exit_handlers().and_then(|()| run(opts));
    procs::kill_all();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(opts: Opts) -> Result<()> {
    let started = Instant::now();
    let mut bench = Bench::prepare(opts)?;
    let mut sections = Vec::new();
    let modes = bench.opts.modes.clone();
    for mode in modes {
        let results = bench.run_mode(mode)?;
        sections.push((mode, results));
    }
    let text = report::render(&bench, &sections, started.elapsed());
    println!("\n{text}");
    let out = bench.target_dir().join("bench-results.md");
    std::fs::write(&out, &text).with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!("bench: table written to {}", out.display());
    Ok(())
}

impl Bench {
    fn prepare(opts: Opts) -> Result<Bench> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let exe = std::env::current_exe().context("cannot find this program")?;
        // target/<profile>/deps/proxies-<hash>
        let target_dir = exe
            .ancestors()
            .nth(3)
            .map(Path::to_path_buf)
            .unwrap_or_else(|| root.join("target"));
        let run_dir = target_dir.join("bench");
        let log_dir = run_dir.join("logs");
        let _ = std::fs::remove_dir_all(&run_dir);
        std::fs::create_dir_all(run_dir.join("run"))?;
        std::fs::create_dir_all(&log_dir)?;
        let _ = rlimit::increase_nofile_limit(u64::MAX);
        procs::init_wrappers(
            procs::find_program("setpriv"),
            procs::find_program("taskset"),
        );

        let ports = Ports::new(opts.base_port);
        for port in ports.all() {
            if procs::listening(port) {
                bail!(
                    "port {port} on 127.0.0.1 is taken (a benchmark still running? another \
                     program?); choose other ports with --base-port"
                );
            }
        }

        let mut notes = Vec::new();
        let mut tools = Tools {
            appbroker: None,
            haproxy: None,
            nginx: None,
            iperf3: procs::find_program("iperf3"),
            netperf: procs::find_program("netperf"),
            netserver: procs::find_program("netserver"),
            shim: None,
            memory_py: None,
            wrk: None,
            h2load: None,
        };

        if opts.targets.contains(&Target::Appbroker) {
            tools.appbroker = Some(build_appbroker(&root, &target_dir)?);
        }

        if opts.targets.contains(&Target::Haproxy) {
            tools.haproxy = procs::find_program("haproxy");
            if tools.haproxy.is_none() {
                notes.push(
                    "HAProxy is not installed: skipped (`apt-get install haproxy`).".to_string(),
                );
            }
        }
        if opts.targets.contains(&Target::Nginx) {
            match procs::find_program("nginx") {
                None => notes.push(
                    "nginx is not installed: skipped (`apt-get install nginx libnginx-mod-stream`)."
                        .to_string(),
                ),
                Some(nginx) => match stream_module(&nginx) {
                    Some(line) => tools.nginx = Some((nginx, line)),
                    None => notes.push(
                        "nginx has no stream module: skipped (`apt-get install libnginx-mod-stream`)."
                            .to_string(),
                    ),
                },
            }
        }
        let wants = |m: Metric| opts.metrics.contains(&m);
        if tools.iperf3.is_none() && (wants(Metric::Bulk1) || wants(Metric::Bulk4)) {
            notes.push("iperf3 is not installed: bulk skipped (`apt-get install iperf3`).".into());
        }
        if (tools.netperf.is_none() || tools.netserver.is_none())
            && (wants(Metric::TcpRr) || wants(Metric::TcpCrr))
        {
            tools.netperf = None;
            notes.push(
                "netperf is not installed: TCP_RR and TCP_CRR skipped (the load generator's \
                 rr64 and crr rows still measure request/response and churn; netperf is in \
                 Debian's non-free component, docs/benchmarks.md)."
                    .into(),
            );
        }
        if tools.netperf.is_some() && opts.quick && wants(Metric::TcpCrr) {
            notes.push(
                "--quick: each netperf TCP_CRR measurement is 5,000 connections (`-l -5000`) \
                 rather than 1 s: netserver pads a timed TCP_CRR test by 4 s."
                    .into(),
            );
        }
        if tools.netperf.is_some() && opts.targets.iter().any(|t| *t != Target::Direct) {
            match build_shim(&root, &target_dir) {
                Ok(path) => tools.shim = Some(path),
                Err(e) => notes.push(format!(
                    "The connect shim could not be built ({e:#}): netperf ran on the direct \
                     path only."
                )),
            }
        }
        if wants(Metric::Memory) {
            let script = root.join("benches").join("memory.py");
            let fallback = "the runner's fallback (user space: the proxy's RSS growth; kernel: \
                            the machine's slab and TCP memory growth beyond the direct path's)";
            let use_script = match opts.memory {
                MemoryTool::Fallback => false,
                MemoryTool::Script => true,
                MemoryTool::Auto => !opts.quick,
            };
            match (script.is_file(), procs::find_program("python3")) {
                _ if !use_script => notes.push(format!(
                    "Memory measured by {fallback}{}.",
                    if opts.quick {
                        ", which takes 2 s per target where benches/memory.py takes 11 s \
                         (--memory script uses it anyway)"
                    } else {
                        ""
                    }
                )),
                (true, Some(python)) => tools.memory_py = Some((python, script)),
                (true, None) => notes.push(format!(
                    "benches/memory.py needs python3, which is not installed: memory measured \
                     by {fallback}."
                )),
                // HOOK: benches/memory.py (the reliability work's script) is the memory
                // measurement. Where it is not in the tree yet, the runner measures with its
                // own fallback (`Bench::memory_fallback`).
                (false, _) => notes.push(format!(
                    "benches/memory.py is not in this tree yet: memory measured by {fallback}."
                )),
            }
        }
        if opts.modes.contains(&Mode::Pinned) && procs::find_program("taskset").is_none() {
            bail!("--pinned needs taskset (util-linux)");
        }
        let mut certs = None;
        if opts
            .metrics
            .iter()
            .any(|m| matches!(m.family(), Family::Tls | Family::H2))
        {
            match tls::Certs::generate(&run_dir.join("run").join("tls")) {
                Ok(c) => certs = Some(c),
                Err(e) => notes.push(format!(
                    "The TLS certificates could not be made ({e:#}): TLS rows skipped."
                )),
            }
        }
        if opts.metrics.iter().any(|m| matches!(m, Metric::H2(_))) {
            tools.h2load = procs::find_program("h2load");
            if tools.h2load.is_none() {
                notes.push(
                    "h2load is not installed: the HTTP/2 rate rows skipped \
                     (`apt-get install nghttp2-client`)."
                        .into(),
                );
            }
        }
        if opts.metrics.iter().any(|m| matches!(m, Metric::Http(_))) {
            tools.wrk = procs::find_program("wrk");
            if tools.wrk.is_none() {
                notes.push(
                    "wrk is not installed: the HTTP rate rows skipped (`apt-get install wrk`)."
                        .into(),
                );
            }
        }

        let mut bench = Bench {
            opts,
            tools,
            ports,
            root,
            run_dir,
            log_dir,
            exe,
            clk_tck: procs::clock_ticks_per_second(),
            load_average: std::fs::read_to_string("/proc/loadavg")
                .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|_| "unknown".into()),
            memory_runs: 0,
            certs,
            appbroker_rejects: HashSet::new(),
            negotiated: BTreeMap::new(),
            notes,
        };
        if bench.tools.appbroker.is_some() && bench.opts.targets.contains(&Target::Appbroker) {
            bench.check_appbroker_templates();
        }
        Ok(bench)
    }

    /// `appbroker --check` on each family's template (filled as for a run) of the metrics
    /// asked for. A template it rejects, or accepts without using a key the template sets
    /// (its effective configuration does not print it), leaves appbroker's column of that
    /// family empty with a note, instead of a failure in every round (a build from before
    /// those keys existed, say).
    fn check_appbroker_templates(&mut self) {
        let families: Vec<Family> = Family::ALL
            .into_iter()
            .filter(|f| self.opts.metrics.iter().any(|m| m.family() == *f))
            .collect();
        for family in families {
            let template = family.template(Target::Appbroker);
            let setup = Setup {
                family,
                backend: self.ports.echo,
                key: tls::KeyKind::Ecdsa,
            };
            let verdict = self
                .fill(Target::Appbroker, setup, "check")
                .and_then(|ini| {
                    // Messages name the template rather than its filled copy.
                    self.appbroker_check(&ini).map_err(|e| {
                        let named = format!("{e:#}")
                            .replace(&ini.display().to_string(), &format!("benches/{template}"));
                        anyhow!("{named}")
                    })
                });
            if let Err(e) = verdict {
                eprintln!("bench: appbroker does not take benches/{template}: {e:#}");
                self.notes.push(format!(
                    "appbroker's {} column is empty: it does not take benches/{template} ({e:#}). \
                     docs/benchmarks.md says what the template expects.",
                    family.title()
                ));
                self.appbroker_rejects.insert(family);
            }
        }
    }

    /// Runs `appbroker --check --config ini`: fine when it exits 0 and its effective
    /// configuration has every section and key of `ini`.
    fn appbroker_check(&self, ini: &Path) -> Result<()> {
        let exe = self.tools.appbroker.as_ref().context("no appbroker")?;
        let out = std::process::Command::new(exe)
            .arg("--check")
            .arg("--config")
            .arg(ini)
            .output()
            .context("cannot run appbroker --check")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            let errors: Vec<&str> = stderr
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("appbroker:"))
                .take(4)
                .collect();
            bail!(
                "`appbroker --check` exits {}: {}",
                out.status.code().unwrap_or(-1),
                if errors.is_empty() {
                    procs::last_lines(&stderr, 3)
                } else {
                    errors.join(" / ")
                }
            );
        }
        let effective = ini_keys(&String::from_utf8_lossy(&out.stdout));
        let wanted = ini_keys(&std::fs::read_to_string(ini)?);
        let missing: Vec<String> = wanted
            .iter()
            .filter(|k| !effective.contains(k))
            .map(|(section, key)| format!("[{section}] {key}"))
            .collect();
        if !missing.is_empty() {
            bail!(
                "it accepts the file but its effective configuration (--check) lacks {}",
                missing.join(", ")
            );
        }
        Ok(())
    }

    fn target_dir(&self) -> PathBuf {
        self.run_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| self.root.join("target"))
    }

    /// A row's failed requests (`failed` of `total`, `what` saying what failed): noted when
    /// there are any, and the row refused past one in a thousand.
    fn failures(&mut self, name: &str, failed: f64, total: f64, what: &str) -> Result<()> {
        if failed > 0.0 {
            self.note(format!("{name}: {failed} of {total} {what}"));
        }
        if failed * 1000.0 > total {
            bail!("{failed} of {total} {what}");
        }
        Ok(())
    }

    fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// Is this target runnable on this machine?
    fn available(&self, target: Target) -> bool {
        match target {
            Target::Direct => true,
            Target::Appbroker => self.tools.appbroker.is_some(),
            Target::Haproxy => self.tools.haproxy.is_some(),
            Target::Nginx => self.tools.nginx.is_some(),
        }
    }

    fn run_mode(&mut self, mode: Mode) -> Result<Results> {
        let pinned = mode == Mode::Pinned;
        let label = match mode {
            Mode::Unpinned => "unpinned",
            Mode::Pinned => "pinned",
        };
        eprintln!("bench: {label}: starting the loopback servers");
        let _servers = self.start_servers(pinned)?;
        let mut results = Results::default();
        let rounds = self.opts.rounds;
        let metrics = self.opts.metrics.clone();
        let targets: Vec<Target> = self
            .opts
            .targets
            .iter()
            .copied()
            .filter(|t| self.available(*t))
            .collect();
        for round in 1..=rounds {
            for &metric in &metrics {
                // The direct path's kernel memory per idle connection in this round,
                // subtracted from each proxy's by the memory fallback.
                let mut direct_kernel: Option<f64> = None;
                // The proxies of this metric start together and stay up, idle, while the
                // others are measured: one start and stop per metric instead of one per
                // measurement. (The memory measurements start each on its own.)
                let mut proxies: HashMap<Target, Proc> = HashMap::new();
                if !metric.holds_connections() {
                    let wanted: Vec<Target> = targets
                        .iter()
                        .copied()
                        .filter(|t| *t != Target::Direct && self.applies(metric, *t))
                        .collect();
                    for (target, result) in self.start_proxies(&wanted, self.setup(metric), pinned)
                    {
                        match result {
                            Ok(p) => {
                                proxies.insert(target, p);
                            }
                            Err(e) => {
                                eprintln!(
                                    "bench: [{label} {round}/{rounds}] {} {}: FAILED: {e:#}",
                                    metric.name(),
                                    target.name()
                                );
                                self.note(format!(
                                    "{label}: {} could not start for {}: {e:#}",
                                    target.name(),
                                    metric.name()
                                ));
                            }
                        }
                    }
                }
                for &target in &targets {
                    if !self.applies(metric, target) {
                        continue;
                    }
                    let proxy = proxies.get_mut(&target);
                    if target != Target::Direct && !metric.holds_connections() && proxy.is_none() {
                        continue;
                    }
                    let t0 = Instant::now();
                    match self.run_one(metric, target, proxy, pinned, &mut direct_kernel) {
                        Ok(values) => {
                            let shown: Vec<String> = values
                                .iter()
                                .map(|(k, v)| format!("{k}={}", report::number(*v)))
                                .collect();
                            eprintln!(
                                "bench: [{label} {round}/{rounds}] {} {}: {} ({:.1} s)",
                                metric.name(),
                                target.name(),
                                shown.join(" "),
                                t0.elapsed().as_secs_f64()
                            );
                            for (key, value) in values {
                                results.add(&key, target, value);
                            }
                        }
                        Err(e) => {
                            eprintln!(
                                "bench: [{label} {round}/{rounds}] {} {}: FAILED: {e:#}",
                                metric.name(),
                                target.name()
                            );
                            self.note(format!(
                                "{label}: {} through {} failed at least once: {e:#}",
                                metric.name(),
                                target.name()
                            ));
                        }
                    }
                }
                for (_, mut p) in proxies {
                    p.stop();
                }
            }
        }
        Ok(results)
    }

    /// Whether a measurement exists for this pair on this machine.
    fn applies(&self, metric: Metric, target: Target) -> bool {
        if target == Target::Appbroker && self.appbroker_rejects.contains(&metric.family()) {
            return false;
        }
        match metric {
            Metric::Bulk1 | Metric::Bulk4 => self.tools.iperf3.is_some(),
            Metric::TcpRr | Metric::TcpCrr => {
                self.tools.netperf.is_some()
                    && (target == Target::Direct || self.tools.shim.is_some())
            }
            Metric::Rr64 | Metric::Crr | Metric::HttpMemory => true,
            // memory.py measures a proxy; the fallback also measures the direct path, to
            // subtract the client's and server's sockets.
            Metric::Memory => target != Target::Direct || self.tools.memory_py.is_none(),
            Metric::TlsHandshakes(..) | Metric::TlsBulk => self.certs.is_some(),
            Metric::Http(_) => self.tools.wrk.is_some(),
            // The origin speaks HTTP/1.1 in the clear: no direct HTTP/2 path.
            Metric::H2(_) => {
                target != Target::Direct && self.tools.h2load.is_some() && self.certs.is_some()
            }
            Metric::H2Memory => target != Target::Direct && self.certs.is_some(),
        }
    }

    /// Does any metric asked for need this family's servers?
    fn wants(&self, family: Family) -> bool {
        self.opts.metrics.iter().any(|m| m.family() == family)
    }

    /// The loopback servers of one mode: iperf3, netserver and our echo server.
    fn start_servers(&mut self, pinned: bool) -> Result<Vec<Proc>> {
        let mut servers = Vec::new();
        let limit = Duration::from_secs(10);
        let wants = |m: Metric| self.opts.metrics.contains(&m);
        if let (Some(iperf3), true) = (
            &self.tools.iperf3,
            wants(Metric::Bulk1) || wants(Metric::Bulk4),
        ) {
            let mut p = Spec::new("iperf3-server", iperf3, &self.log_dir)
                .args(["-s", "-B", "127.0.0.1", "-p"])
                .arg(self.ports.iperf.to_string())
                .pinned(pinned)
                .spawn()?;
            procs::wait_listening(&mut p, self.ports.iperf, limit)?;
            servers.push(p);
        }
        if let (Some(netserver), Some(_), true) = (
            &self.tools.netserver,
            &self.tools.netperf,
            wants(Metric::TcpRr) || wants(Metric::TcpCrr),
        ) {
            let mut p = Spec::new("netserver", netserver, &self.log_dir)
                .args(["-D", "-L", "127.0.0.1", "-p"])
                .arg(self.ports.netserver.to_string())
                .pinned(pinned)
                .spawn()?;
            procs::wait_listening(&mut p, self.ports.netserver, limit)?;
            servers.push(p);
        }
        // Our own servers: (log name, arguments after the program, the ports to wait for).
        let mut own: Vec<(&str, Vec<String>, Vec<u16>)> = vec![(
            "echo-server",
            vec!["--serve-echo".into(), self.ports.echo.to_string()],
            vec![self.ports.echo],
        )];
        if let (true, Some(certs)) = (self.wants(Family::Tls), &self.certs) {
            let p = self.ports;
            own.push((
                "bulk-server",
                vec!["--serve-bulk".into(), p.bulk.to_string()],
                vec![p.bulk],
            ));
            let files = |k: tls::KeyKind| {
                let f = certs.files(k);
                [f.cert.display().to_string(), f.key.display().to_string()]
            };
            for (name, role, port, key) in [
                ("tls-echo-ecdsa", "echo", p.tls_echo[0], tls::KeyKind::Ecdsa),
                ("tls-echo-rsa", "echo", p.tls_echo[1], tls::KeyKind::Rsa),
                ("tls-bulk", "bulk", p.tls_bulk, tls::KeyKind::Ecdsa),
            ] {
                let mut args = vec!["--serve-tls".into(), role.into(), port.to_string()];
                args.extend(files(key));
                own.push((name, args, vec![port]));
            }
        }
        if self.wants(Family::Http) || self.wants(Family::H2) {
            let [a, b] = self.ports.http;
            own.push((
                "http-origin",
                vec!["--serve-http".into(), a.to_string(), b.to_string()],
                vec![a, b],
            ));
        }
        for (name, args, ports) in own {
            let mut p = Spec::new(name, &self.exe, &self.log_dir)
                .args(args)
                .pinned(pinned)
                .stdin_pipe()
                .spawn()?;
            for port in ports {
                procs::wait_listening(&mut p, port, limit)?;
            }
            servers.push(p);
        }
        Ok(servers)
    }

    /// One measurement of one metric through one target (its proxy already started, except
    /// for the memory measurements, which start their own): the client, and the proxy's CPU
    /// time around it.
    fn run_one(
        &mut self,
        metric: Metric,
        target: Target,
        mut proxy: Option<&mut Proc>,
        pinned: bool,
        direct_kernel: &mut Option<f64>,
    ) -> Result<Vec<(String, f64)>> {
        match metric {
            Metric::Memory if self.tools.memory_py.is_some() => {
                return self.memory_script(target, pinned);
            }
            Metric::Memory | Metric::HttpMemory | Metric::H2Memory => {
                return self.memory_fallback(metric, target, pinned, direct_kernel);
            }
            _ => {}
        }
        if let Some(p) = proxy.as_deref_mut()
            && !p.alive()
        {
            bail!(
                "{} is no longer running: {}",
                p.name,
                procs::last_lines(&p.stderr_text(), 3)
            );
        }
        let pid = proxy.as_ref().map(|p| p.pid());
        let port = match pid {
            Some(_) => self.ports.proxy(target),
            None => self.direct_port(metric),
        };
        let clk = self.clk_tck;
        let name = metric.name();
        let mut values = Vec::new();
        match metric {
            Metric::Bulk1 | Metric::Bulk4 => {
                let streams = if metric == Metric::Bulk1 { 1 } else { 4 };
                values = with_cpu(pid, clk, || {
                    let (gbps, bytes) = self.iperf3(streams, port, pinned)?;
                    // ms of CPU per GB (1e9 bytes)
                    let cpu = CpuWork::new(format!("cpu_{name}"), bytes / 1e9, 1e3);
                    Ok((vec![(name.to_string(), gbps)], cpu))
                })?;
            }
            Metric::TcpRr | Metric::TcpCrr => {
                let test = if metric == Metric::TcpRr {
                    "TCP_RR"
                } else {
                    "TCP_CRR"
                };
                let through = pid.map(|_| port);
                values = with_cpu(pid, clk, || {
                    let r = self.netperf(test, through, pinned)?;
                    let v = vec![
                        (name.to_string(), r.rate),
                        (format!("{name}_p50"), r.p50),
                        (format!("{name}_p99"), r.p99),
                    ];
                    // µs of CPU per transaction or connection
                    Ok((
                        v,
                        CpuWork::new(format!("cpu_{name}"), r.rate * r.elapsed, 1e6),
                    ))
                })?;
            }
            Metric::Rr64 | Metric::Crr => {
                let (kind, n) = if metric == Metric::Rr64 {
                    ("rr", RR_CONNECTIONS)
                } else {
                    ("crr", CRR_WORKERS)
                };
                let args = [kind.to_string(), addr(port), n.to_string(), self.secs()];
                values = with_cpu(pid, clk, || {
                    let r = self.loadgen(&args, pinned)?;
                    let v = vec![
                        (name.to_string(), r.rate),
                        (format!("{name}_p50"), r.p50),
                        (format!("{name}_p99"), r.p99),
                        (format!("{name}_p999"), r.p999),
                    ];
                    Ok((v, CpuWork::new(format!("cpu_{name}"), r.count, 1e6)))
                })?;
            }
            Metric::TlsHandshakes(version, _) => {
                if pid.is_some() {
                    self.tls_probe(target, port)?;
                }
                for resume in [false, true] {
                    values.extend(with_cpu(pid, clk, || {
                        self.tls_handshakes(metric, target, version, resume, port, pinned)
                    })?);
                }
            }
            Metric::TlsBulk => {
                if pid.is_some() {
                    self.tls_probe(target, port)?;
                }
                for upload in [true, false] {
                    values.extend(with_cpu(pid, clk, || {
                        self.tls_bulk(target, upload, port, pinned)
                    })?);
                }
            }
            Metric::Http(load) => {
                values = with_cpu(pid, clk, || self.http_row(load, target, port, pinned))?;
            }
            Metric::H2(load) => {
                values = with_cpu(pid, clk, || self.h2_row(load, target, port, pinned))?;
            }
            Metric::Memory | Metric::HttpMemory | Metric::H2Memory => {
                unreachable!("handled above")
            }
        }
        Ok(values)
    }

    fn secs(&self) -> String {
        self.opts.secs.to_string()
    }

    /// Where a metric's client connects on the direct path.
    fn direct_port(&self, metric: Metric) -> u16 {
        match metric {
            Metric::TlsHandshakes(_, key) => self.ports.tls_echo(key),
            Metric::TlsBulk => self.ports.tls_bulk,
            _ => self.setup(metric).backend,
        }
    }

    /// What a metric's proxies are started with: the server they forward to is the one the
    /// direct path reaches, except for TLS, where the proxies forward in plain TCP to the
    /// echo or bulk server behind the runner's own TLS servers; HTTP's is origin 01 (the
    /// templates name both origin servers).
    fn setup(&self, metric: Metric) -> Setup {
        let p = &self.ports;
        let backend = match metric {
            Metric::Bulk1 | Metric::Bulk4 => p.iperf,
            Metric::TcpRr | Metric::TcpCrr => p.netperf_data,
            Metric::Rr64 | Metric::Crr | Metric::Memory | Metric::TlsHandshakes(..) => p.echo,
            Metric::TlsBulk => p.bulk,
            Metric::Http(_) | Metric::HttpMemory | Metric::H2(_) | Metric::H2Memory => p.http[0],
        };
        Setup {
            family: metric.family(),
            backend,
            key: metric.key(),
        }
    }

    /// Starts the proxies of a metric all at once, then waits until each is ready.
    fn start_proxies(
        &self,
        targets: &[Target],
        setup: Setup,
        pinned: bool,
    ) -> Vec<(Target, Result<Proc>)> {
        let spawned: Vec<(Target, Result<Proc>)> = targets
            .iter()
            .map(|&t| (t, self.spawn_proxy(t, setup, pinned)))
            .collect();
        let ready: Vec<(Target, Result<Proc>)> = spawned
            .into_iter()
            .map(|(t, r)| (t, r.and_then(|p| self.proxy_ready(t, p))))
            .collect();
        // Let start-up work finish (appbroker's first monitor round, nginx's workers).
        std::thread::sleep(Duration::from_millis(200));
        ready
    }

    /// Starts one proxy and waits until it listens.
    fn start_proxy(&self, target: Target, setup: Setup, pinned: bool) -> Result<Proc> {
        let p = self.spawn_proxy(target, setup, pinned)?;
        let p = self.proxy_ready(target, p)?;
        std::thread::sleep(Duration::from_millis(200));
        Ok(p)
    }

    /// Waits until a proxy listens (and, for nginx, has its two workers).
    fn proxy_ready(&self, target: Target, mut proc: Proc) -> Result<Proc> {
        procs::wait_listening(&mut proc, self.ports.proxy(target), Duration::from_secs(10))?;
        if target == Target::Nginx {
            let end = Instant::now() + Duration::from_secs(10);
            while procs::children(proc.pid()).len() < 2 {
                if Instant::now() > end || !proc.alive() {
                    bail!("nginx did not start its 2 workers");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(proc)
    }

    /// Starts a proxy on its configuration for `setup`.
    fn spawn_proxy(&self, target: Target, setup: Setup, pinned: bool) -> Result<Proc> {
        let conf = self.fill(target, setup, "")?;
        let spec = match target {
            Target::Direct => bail!("the direct path has no proxy"),
            Target::Appbroker => {
                let exe = self.tools.appbroker.as_ref().context("no appbroker")?;
                Spec::new("appbroker", exe, &self.log_dir)
                    .arg("--config")
                    .arg(conf)
            }
            Target::Haproxy => {
                let exe = self.tools.haproxy.as_ref().context("no haproxy")?;
                Spec::new("haproxy", exe, &self.log_dir)
                    .arg("-db")
                    .arg("-f")
                    .arg(conf)
            }
            Target::Nginx => {
                let (exe, _) = self.tools.nginx.as_ref().context("no nginx")?;
                Spec::new("nginx", exe, &self.log_dir)
                    .arg("-c")
                    .arg(conf)
                    .arg("-p")
                    .arg(format!("{}/", self.run_dir.join("run").display()))
                    .arg("-e")
                    .arg(self.log_dir.join("nginx-error.log"))
            }
        };
        spec.pinned(pinned).spawn()
    }

    /// A target's template for `setup` (benches/, [`Family::template`]) with its `@...@`
    /// placeholders filled, written to target/bench/run/ under the template's name (with
    /// `.tag` before the extension when `tag` is given).
    fn fill(&self, target: Target, setup: Setup, tag: &str) -> Result<PathBuf> {
        let template = setup.family.template(target);
        let path = self.root.join("benches").join(template);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let run = self.run_dir.join("run");
        let show = |p: &Path| p.display().to_string();
        let (cert, key, bundle) = match &self.certs {
            Some(c) => {
                let f = c.files(setup.key);
                (show(&f.cert), show(&f.key), show(&f.bundle))
            }
            None => Default::default(),
        };
        let access_log = match (target, self.opts.access_log) {
            (Target::Haproxy, true) => "log stdout format raw local0\n    option httplog".into(),
            (Target::Haproxy, false) => "# no access log (the runner's --access-log)".into(),
            (Target::Nginx, true) => {
                format!("access_log {}/nginx-access.log;", show(&self.log_dir))
            }
            (Target::Nginx, false) => "access_log off;".into(),
            _ => String::new(),
        };
        let load_module = self
            .tools
            .nginx
            .as_ref()
            .map(|(_, line)| line.clone())
            .unwrap_or_default();
        let values = [
            ("@LISTEN_PORT@", self.ports.proxy(target).to_string()),
            ("@BACKEND_PORT@", setup.backend.to_string()),
            ("@SERVER_01_PORT@", self.ports.http[0].to_string()),
            ("@SERVER_02_PORT@", self.ports.http[1].to_string()),
            ("@COOKIE_01@", http::COOKIES[0].to_string()),
            ("@COOKIE_02@", http::COOKIES[1].to_string()),
            ("@CERT@", cert),
            ("@KEY@", key),
            ("@CERT_AND_KEY@", bundle),
            ("@LOG_REQUESTS@", u8::from(self.opts.access_log).to_string()),
            ("@ACCESS_LOG@", access_log),
            ("@RUN_DIR@", show(&run)),
            ("@LOG_DIR@", show(&self.log_dir)),
            ("@LOAD_MODULE@", load_module),
        ];
        let mut text = text;
        for (placeholder, value) in values {
            text = text.replace(placeholder, &value);
        }
        if let Some(left) = placeholder_left(&text) {
            bail!("benches/{template} has a placeholder the runner does not fill: {left}");
        }
        let name = match template.rsplit_once('.') {
            Some((stem, ext)) if !tag.is_empty() => format!("{stem}.{tag}.{ext}"),
            _ => template.to_string(),
        };
        let dest = run.join(name);
        std::fs::write(&dest, text)?;
        Ok(dest)
    }

    /// Gbit/s received and bytes moved, from iperf3's JSON.
    fn iperf3(&self, streams: u32, port: u16, pinned: bool) -> Result<(f64, f64)> {
        let iperf3 = self.tools.iperf3.as_ref().context("no iperf3")?;
        let mut p = Spec::new("iperf3-client", iperf3, &self.log_dir)
            .args(["-4", "-J", "-c", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .arg("-t")
            .arg(self.opts.secs.to_string())
            .arg("-P")
            .arg(streams.to_string())
            .pinned(pinned)
            .spawn()?;
        let status = p.wait_for(Duration::from_secs(self.opts.secs + 30))?;
        let out = p.stdout_text();
        let json: serde_json::Value = serde_json::from_str(&out).with_context(|| {
            format!("iperf3 output is not JSON: {}", procs::last_lines(&out, 3))
        })?;
        if let Some(err) = json.get("error").and_then(|e| e.as_str()) {
            bail!("iperf3: {err}");
        }
        if !status.success() {
            bail!("iperf3 exited with {status}");
        }
        let sum = &json["end"]["sum_received"];
        let bps = sum["bits_per_second"]
            .as_f64()
            .context("iperf3: no end.sum_received.bits_per_second")?;
        let bytes = sum["bytes"].as_f64().context("iperf3: no bytes")?;
        Ok((bps / 1e9, bytes))
    }

    /// A netperf TCP_RR or TCP_CRR test, through the proxy listening on `proxy` (via the
    /// connect shim) or direct.
    fn netperf(&self, test: &str, proxy: Option<u16>, pinned: bool) -> Result<NetperfResult> {
        let netperf = self.tools.netperf.as_ref().context("no netperf")?;
        let data = self.ports.netperf_data;
        let mut spec = Spec::new("netperf", netperf, &self.log_dir)
            .args(["-P", "0", "-H", "127.0.0.1", "-p"])
            .arg(self.ports.netserver.to_string())
            .args(["-t", test, "-j", "-l"])
            .arg(self.netperf_length(test))
            .args(["--", "-r", "1,1", "-P"])
            .arg(format!(",{data}"))
            .args(["-k", "THROUGHPUT,P50_LATENCY,P99_LATENCY,ELAPSED_TIME"])
            .pinned(pinned);
        if let Some(port) = proxy {
            let shim = self.tools.shim.as_ref().context("no connect shim")?;
            spec = spec
                .env("LD_PRELOAD", shim.display().to_string())
                .env("CONNECT_SHIM_FROM", format!("127.0.0.1:{data}"))
                .env("CONNECT_SHIM_TO", format!("127.0.0.1:{port}"));
        }
        let (out, err) = spec
            .spawn()?
            .finish(Duration::from_secs(self.opts.secs + 30))?;
        if proxy.is_some() && !err.contains("connect_shim: redirecting") {
            bail!("the connect shim redirected nothing: netperf did not go through the proxy");
        }
        let kv: HashMap<&str, f64> = out
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once('=')?;
                Some((k.trim(), v.trim().parse().ok()?))
            })
            .collect();
        let get = |k: &str| {
            kv.get(k)
                .copied()
                .ok_or_else(|| anyhow!("netperf printed no {k}: {}", procs::last_lines(&out, 3)))
        };
        Ok(NetperfResult {
            rate: get("THROUGHPUT")?,
            p50: get("P50_LATENCY")?,
            p99: get("P99_LATENCY")?,
            elapsed: get("ELAPSED_TIME")?,
        })
    }

    /// netperf's `-l`: the seconds of a measurement, except for TCP_CRR under `--quick`.
    /// netserver leaves a TCP_CRR test only when its own timer (the test's length plus 4 s of
    /// padding) ends its wait in accept(2), so every timed TCP_CRR run lasts 4 s longer than
    /// asked; a run of a fixed count of connections (`-l -N`) ends at once. `--quick` uses
    /// 5,000 connections (0.3 to 1.5 s here) to stay well under a minute.
    fn netperf_length(&self, test: &str) -> String {
        if test == "TCP_CRR" && self.opts.quick {
            "-5000".to_string()
        } else {
            self.opts.secs.to_string()
        }
    }

    /// Our own load generator, `--loadgen ARGS...`: its JSON line. A run where every attempt
    /// failed is an error saying the first failure; one with some failures is noted.
    fn run_loadgen(&mut self, args: &[String], pinned: bool) -> Result<serde_json::Value> {
        let kind = args.first().map(String::as_str).unwrap_or("?");
        let mut p = Spec::new(&format!("loadgen-{kind}"), &self.exe, &self.log_dir)
            .arg("--loadgen")
            .args(args)
            .pinned(pinned)
            .stdin_pipe()
            .spawn()?;
        let status = p.wait_for(Duration::from_secs(self.opts.secs + 60))?;
        let out = p.stdout_text();
        if !status.success() {
            bail!(
                "load generator exited with {status}: {}",
                procs::last_lines(&p.stderr_text(), 3)
            );
        }
        let json: serde_json::Value = serde_json::from_str(out.trim())
            .with_context(|| format!("load generator output: {out}"))?;
        let errors = json["errors"].as_f64().unwrap_or(0.0);
        if errors > 0.0 {
            let first = json["first_error"].as_str().unwrap_or("(not said)");
            let at = args.get(1).map(String::as_str).unwrap_or("?");
            if json["count"].as_f64() == Some(0.0) {
                bail!("every attempt failed ({errors}); the first: {first}");
            }
            eprintln!("bench: warning: {kind} to {at}: {errors} failed; the first: {first}");
            self.note(format!(
                "{kind} to {at}: {errors} attempts failed at least once; the first: {first}"
            ));
        }
        Ok(json)
    }

    /// `rr` or `crr`.
    fn loadgen(&mut self, args: &[String], pinned: bool) -> Result<LoadgenResult> {
        let json = self.run_loadgen(args, pinned)?;
        LoadgenResult::from_json(&json)
    }

    /// benches/memory.py, the reliability work's script:
    /// `python3 benches/memory.py --proxy-port P --proxy-pid PID --server-port S
    /// --connections N`. It starts its own echo servers on S (so the proxy is pointed at a
    /// port nothing else listens on), holds N idle connections through the proxy, measures
    /// the pid and its descendants (nginx's workers under the master), and prints one JSON
    /// line last, with `user_bytes_per_conn`, `kernel_total_bytes_per_conn` and
    /// `total_bytes_per_conn` among its fields.
    fn memory_script(&mut self, target: Target, pinned: bool) -> Result<Vec<(String, f64)>> {
        let server_port = self.ports.spare;
        let setup = Setup {
            backend: server_port,
            ..self.setup(Metric::Memory)
        };
        let mut proxy = self.start_proxy(target, setup, pinned)?;
        let (python, script) = self.tools.memory_py.clone().context("no memory.py")?;
        let mut p = Spec::new("memory-py", &python, &self.log_dir)
            .arg(script)
            .arg("--proxy-port")
            .arg(self.ports.proxy(target).to_string())
            .arg("--proxy-pid")
            .arg(proxy.pid().to_string())
            .arg("--server-port")
            .arg(server_port.to_string())
            .arg("--connections")
            .arg(self.opts.connections.to_string())
            .pinned(pinned)
            .spawn()?;
        let status = p.wait_for(Duration::from_secs(600));
        proxy.stop();
        let status = status?;
        let out = p.stdout_text();
        let _ = std::fs::write(
            self.log_dir
                .join(format!("memory-{}.{}.out", target.name(), self.memory_runs)),
            &out,
        );
        self.memory_runs += 1;
        let line = out.lines().rev().find(|l| l.trim_start().starts_with('{'));
        let Some(line) = line else {
            bail!(
                "memory.py exited with {status} and printed no JSON line: {}",
                procs::last_lines(&format!("{out}\n{}", p.stderr_text()), 3)
            );
        };
        if !status.success() {
            // It exits 1 when connections failed or were dropped; its summary says which.
            bail!(
                "memory.py exited with {status}: {}",
                procs::last_lines(&out, 4)
            );
        }
        let json: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("memory.py's last line is not JSON: {line}"))?;
        report::memory_values(&json)
            .ok_or_else(|| anyhow!("no user and kernel bytes per connection in {line}"))
    }

    /// The runner's own memory measurement (memory.py's stand-in for `memory`, and the only
    /// one for `http_memory`): hold `--connections` idle connections through the target
    /// (after one echo exchange each, or one keep-alive HTTP request with server 01's cookie)
    /// and read, before and while they are held, the proxy's RSS (all its processes) and the
    /// machine's kernel socket memory; the direct path's kernel growth (the clients' and the
    /// servers' sockets) is subtracted from each proxy's.
    fn memory_fallback(
        &mut self,
        metric: Metric,
        target: Target,
        pinned: bool,
        direct_kernel: &mut Option<f64>,
    ) -> Result<Vec<(String, f64)>> {
        let n = self.opts.connections;
        let mut proxy = match target {
            Target::Direct => None,
            _ => Some(self.start_proxy(target, self.setup(metric), pinned)?),
        };
        let port = match target {
            Target::Direct => self.direct_port(metric),
            _ => self.ports.proxy(target),
        };
        let (hold, prefix) = match metric {
            Metric::HttpMemory => ("http-hold", "http_mem"),
            Metric::H2Memory => ("h2-hold", "h2_mem"),
            _ => ("hold", "mem"),
        };
        // An HTTP/2 client trusts the run's CA and sends the cookie; an HTTP one the cookie.
        let ca = self.certs.as_ref().map(|c| c.ca.display().to_string());
        let extra: Vec<String> = match metric {
            Metric::HttpMemory => vec![http::COOKIES[0].to_string()],
            Metric::H2Memory => vec![ca.context("no certificates")?, http::COOKIES[0].to_string()],
            _ => Vec::new(),
        };
        let rss = |p: &Option<Proc>| p.as_ref().map(|p| procs::family_rss(p.pid()));
        let rss_before = rss(&proxy);
        let kernel_before = procs::kernel_socket_memory().context("cannot read /proc/meminfo")?;
        let mut holder = Spec::new(&format!("loadgen-{hold}"), &self.exe, &self.log_dir)
            .args(["--loadgen", hold])
            .arg(addr(port))
            .arg(n.to_string())
            .arg("120")
            .args(extra)
            .pinned(pinned)
            .stdin_pipe()
            .spawn()?;
        let end = Instant::now() + Duration::from_secs(120);
        let held: serde_json::Value = loop {
            let out = holder.stdout_text();
            if let Some(line) = out.lines().find(|l| l.contains("\"held\"")) {
                break serde_json::from_str(line)?;
            }
            if !holder.alive() {
                bail!(
                    "holding {n} connections failed: {}",
                    procs::last_lines(&holder.stderr_text(), 3)
                );
            }
            if Instant::now() > end {
                bail!("holding {n} connections took more than 120 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let count = held["held"].as_f64().unwrap_or(0.0);
        if count < n as f64 {
            bail!("only {count} of {n} connections could be held: {held}");
        }
        std::thread::sleep(Duration::from_millis(300));
        let rss_after = rss(&proxy);
        let kernel_after = procs::kernel_socket_memory().context("cannot read /proc/meminfo")?;
        holder.close_stdin();
        let _ = holder.wait_for(Duration::from_secs(10));
        if let Some(p) = proxy.as_mut() {
            p.stop();
        }
        let kernel = (kernel_after as f64 - kernel_before as f64) / count;
        if target == Target::Direct {
            *direct_kernel = Some(kernel);
            return Ok(Vec::new());
        }
        let user = match (rss_before, rss_after) {
            (Some(b), Some(a)) => (a as f64 - b as f64) / count,
            _ => 0.0,
        };
        let kernel = match direct_kernel {
            Some(d) => kernel - *d,
            None => {
                self.note(
                    "Memory without the direct path in the run: the kernel figure includes the \
                     clients' and servers' sockets."
                        .into(),
                );
                kernel
            }
        };
        Ok(vec![
            (format!("{prefix}_user"), user),
            (format!("{prefix}_kernel"), kernel),
            (format!("{prefix}_total"), user + kernel),
        ])
    }
}

/// The work a measurement did, for the proxy's CPU per unit of it: the row it goes in, the
/// units of work, and the scale from CPU seconds per unit to the row's unit.
struct CpuWork {
    key: String,
    units: f64,
    scale: f64,
}

impl CpuWork {
    fn new(key: String, units: f64, scale: f64) -> CpuWork {
        CpuWork { key, units, scale }
    }
}

/// Runs `measure` and adds the CPU time the proxy `pid` (with its children) spent meanwhile
/// per unit of the work it reports; the direct path (`None`) has no CPU row.
fn with_cpu<F>(pid: Option<i32>, clk_tck: f64, measure: F) -> Result<Vec<(String, f64)>>
where
    F: FnOnce() -> Result<(Vec<(String, f64)>, CpuWork)>,
{
    let before = pid.map(procs::family_cpu_ticks);
    let (mut values, work) = measure()?;
    if let (Some(pid), Some(before)) = (pid, before) {
        let ticks = procs::family_cpu_ticks(pid).saturating_sub(before);
        if work.units > 0.0 {
            let cpu_secs = ticks as f64 / clk_tck;
            values.push((work.key, cpu_secs * work.scale / work.units));
        }
    }
    Ok(values)
}

/// 127.0.0.1:`port`, as the load generator takes it.
fn addr(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// How `appbroker --check` ends the comment that stands for a secret's line.
const SECRET_NOT_PRINTED: &str = "(a secret is never printed)";

/// The keys of an INI text as (SECTION, KEY), upper-cased, comments left out (but a secret's).
fn ini_keys(text: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut keys = Vec::new();
    for line in text.lines().map(str::trim) {
        // A secret is printed as a comment (`; SESSION_SECRET=(set) (a secret is never
        // printed)`): the key is there all the same.
        let line = match line.strip_suffix(SECRET_NOT_PRINTED) {
            Some(secret) => secret.trim_start_matches(';').trim(),
            None => line,
        };
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_ascii_uppercase();
        } else if !line.starts_with(';')
            && !line.starts_with('#')
            && let Some((key, _)) = line.split_once('=')
        {
            keys.push((section.clone(), key.trim().to_ascii_uppercase()));
        }
    }
    keys
}

/// The first `@NAME@` left in a filled template, if any.
fn placeholder_left(text: &str) -> Option<&str> {
    let mut rest = text;
    while let Some(i) = rest.find('@') {
        let after = &rest[i + 1..];
        let len = after
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(after.len());
        if len > 0 && after[len..].starts_with('@') {
            return Some(&rest[i..i + len + 2]);
        }
        rest = after;
    }
    None
}

struct NetperfResult {
    rate: f64,
    p50: f64,
    p99: f64,
    elapsed: f64,
}

struct LoadgenResult {
    rate: f64,
    count: f64,
    p50: f64,
    p99: f64,
    p999: f64,
}

impl LoadgenResult {
    fn from_json(json: &serde_json::Value) -> Result<LoadgenResult> {
        let f = |k: &str| json[k].as_f64().ok_or_else(|| anyhow!("no {k} in {json}"));
        Ok(LoadgenResult {
            rate: f("rate")?,
            count: f("count")?,
            p50: f("p50_us")?,
            p99: f("p99_us")?,
            p999: f("p999_us")?,
        })
    }
}

/// The appbroker users run: `cargo build --release` of the binary alone, in a target
/// directory of its own. The binary `cargo bench` builds beside the bench (its
/// `CARGO_BIN_EXE_appbroker`, and target/release/appbroker after it) is built with the
/// features of the dev-dependencies too, tokio's `test-util` among them, whose clock takes a
/// lock at every `Instant::now`: not what is shipped.
fn build_appbroker(root: &Path, target_dir: &Path) -> Result<PathBuf> {
    let dir = target_dir.join("bench-appbroker");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!(
        "bench: building appbroker as shipped (cargo build --release) in {}",
        dir.display()
    );
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--release",
            "--quiet",
            "--bin",
            "appbroker",
            "--target-dir",
        ])
        .arg(&dir)
        .current_dir(root)
        .status()
        .context("cannot run cargo to build appbroker")?;
    if !status.success() {
        bail!("cargo build --release of appbroker failed ({status})");
    }
    Ok(dir.join("release").join("appbroker"))
}

/// The `load_module` line nginx needs for the stream module: empty when it is built in,
/// `None` when there is no stream module at all.
fn stream_module(nginx: &Path) -> Option<String> {
    let out = std::process::Command::new(nginx).arg("-V").output().ok()?;
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if text.contains("--with-stream ") || text.trim_end().ends_with("--with-stream") {
        return Some(String::new());
    }
    for dir in [
        "/usr/lib/nginx/modules",
        "/usr/lib64/nginx/modules",
        "/usr/share/nginx/modules",
        "/etc/nginx/modules",
        "/usr/local/nginx/modules",
    ] {
        let module = Path::new(dir).join("ngx_stream_module.so");
        if module.is_file() {
            return Some(format!("load_module {};", module.display()));
        }
    }
    None
}

/// Compiles benches/connect_shim.c into target/connect_shim.so.
fn build_shim(root: &Path, target_dir: &Path) -> Result<PathBuf> {
    let gcc = procs::find_program("gcc")
        .or_else(|| procs::find_program("cc"))
        .context("no C compiler (apt-get install gcc)")?;
    let out = target_dir.join("connect_shim.so");
    let status = std::process::Command::new(gcc)
        .args(["-O2", "-Wall", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(root.join("benches").join("connect_shim.c"))
        .arg("-ldl")
        .status()
        .context("cannot run the C compiler")?;
    if !status.success() {
        bail!("the C compiler failed on benches/connect_shim.c");
    }
    Ok(out)
}
