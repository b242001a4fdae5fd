//! Every process the benchmark starts, and the /proc readings it takes of them.
//!
//! Each child is started in a process group of its own (so nginx's workers, haproxy's threads
//! and netserver's per-test children go with it), recorded in a registry, and killed on every
//! way out: a normal return (`Drop`), a panic (the panic hook), SIGINT, SIGTERM or SIGHUP (a
//! signal thread). Where util-linux's `setpriv --pdeathsig` is available, each child is also
//! sent SIGTERM when the runner dies, which covers a SIGKILL of the runner itself (SIGTERM
//! rather than SIGKILL, so that nginx's master stops its workers on the way out).

use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Process groups of the children alive now.
static GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// The wrappers every child is started through: `setpriv --pdeathsig TERM` when available,
/// and `taskset -c 0` when pinned.
static WRAPPERS: OnceLock<Wrappers> = OnceLock::new();

struct Wrappers {
    setpriv: Option<PathBuf>,
    taskset: Option<PathBuf>,
}

/// Records the wrapper programs found on this machine.
pub fn init_wrappers(setpriv: Option<PathBuf>, taskset: Option<PathBuf>) {
    let _ = WRAPPERS.set(Wrappers { setpriv, taskset });
}

/// Kills every registered process group at once (SIGKILL). Safe to call from any thread and
/// more than once.
pub fn kill_all() {
    let groups: Vec<i32> = match GROUPS.lock() {
        Ok(mut g) => std::mem::take(&mut *g),
        Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
    };
    for pgid in groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

fn register(pgid: i32) {
    if let Ok(mut g) = GROUPS.lock() {
        g.push(pgid);
    }
}

fn unregister(pgid: i32) {
    if let Ok(mut g) = GROUPS.lock() {
        g.retain(|&p| p != pgid);
    }
}

/// Kills every child on a panic and on SIGINT, SIGTERM and SIGHUP (then exits 130, 143, 129).
pub fn install_exit_handlers() -> Result<()> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        kill_all();
    }));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the signal thread's runtime")?;
    use tokio::signal::unix::{SignalKind, signal};
    let (mut int, mut term, mut hup) = runtime.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        ))
    })?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let code = runtime.block_on(async {
                tokio::select! {
                    _ = int.recv() => 130,
                    _ = term.recv() => 143,
                    _ = hup.recv() => 129,
                }
            });
            eprintln!("\nbench: interrupted; stopping every process it started");
            kill_all();
            std::process::exit(code);
        })
        .context("cannot start the signal thread")?;
    Ok(())
}

/// What to start.
pub struct Spec {
    /// A short name for messages and log files.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(String, String)>,
    /// Under `taskset -c 0`.
    pub pinned: bool,
    /// Give the child a pipe as standard input, held open until it is stopped: our own
    /// server and load-generator modes exit when it closes (the runner is gone).
    pub stdin_pipe: bool,
    /// Standard output and error go to `<log_base>.out` and `<log_base>.err`.
    pub log_base: PathBuf,
}

impl Spec {
    pub fn new(name: &str, program: &Path, log_dir: &Path) -> Spec {
        Spec {
            name: name.to_string(),
            program: program.to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
            pinned: false,
            stdin_pipe: false,
            log_base: log_dir.join(name),
        }
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Spec {
        self.args.push(arg.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Spec {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: &str, value: impl Into<String>) -> Spec {
        self.env.push((key.to_string(), value.into()));
        self
    }

    pub fn pinned(mut self, pinned: bool) -> Spec {
        self.pinned = pinned;
        self
    }

    pub fn stdin_pipe(mut self) -> Spec {
        self.stdin_pipe = true;
        self
    }

    /// The command line as it will run, wrappers included, for messages.
    fn argv(&self) -> Result<Vec<OsString>> {
        let mut argv: Vec<OsString> = Vec::new();
        if let Some(w) = WRAPPERS.get() {
            if let Some(setpriv) = &w.setpriv {
                argv.extend([setpriv.clone().into(), "--pdeathsig".into(), "TERM".into()]);
            }
            if self.pinned {
                match &w.taskset {
                    Some(taskset) => argv.extend([taskset.clone().into(), "-c".into(), "0".into()]),
                    None => bail!("pinned mode needs taskset (util-linux)"),
                }
            }
        } else if self.pinned {
            bail!("pinned mode needs taskset (util-linux)");
        }
        argv.push(self.program.clone().into());
        argv.extend(self.args.iter().cloned());
        Ok(argv)
    }

    /// Starts the process in a process group of its own and registers it.
    pub fn spawn(self) -> Result<Proc> {
        let argv = self.argv()?;
        let out = File::create(self.log_base.with_extension("out"))
            .with_context(|| format!("cannot create {}.out", self.log_base.display()))?;
        let err = File::create(self.log_base.with_extension("err"))
            .with_context(|| format!("cannot create {}.err", self.log_base.display()))?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdout(out)
            .stderr(err)
            .stdin(if self.stdin_pipe {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .process_group(0);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.program.display()))?;
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        register(pid);
        Ok(Proc {
            name: self.name,
            child: Some(child),
            pid,
            log_base: self.log_base,
        })
    }
}

/// A running child, stopped (with its whole process group) when dropped.
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    pid: i32,
    log_base: PathBuf,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Waits for the process to exit by itself, at most `limit`; past it, kills it and fails.
    pub fn wait_for(&mut self, limit: Duration) -> Result<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            let Some(child) = self.child.as_mut() else {
                bail!("{} was already stopped", self.name);
            };
            if let Some(status) = child.try_wait()? {
                self.child = None;
                unregister(self.pid);
                // Anything it left in its group (netserver's children...) goes too.
                let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
                return Ok(status);
            }
            if Instant::now() >= end {
                self.stop();
                bail!("{} did not finish within {:?}; killed", self.name, limit);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for a load generator to finish by itself (at most `limit`): its standard output
    /// and error when it exited with success, else an error naming it, its status and the
    /// last lines it printed.
    pub fn finish(&mut self, limit: Duration) -> Result<(String, String)> {
        let status = self.wait_for(limit)?;
        let (out, err) = (self.stdout_text(), self.stderr_text());
        if !status.success() {
            bail!(
                "{} exited with {status}: {}",
                self.name,
                last_lines(&format!("{out}\n{err}"), 3)
            );
        }
        Ok((out, err))
    }

    /// Closes the child's standard input (our own modes exit on that).
    pub fn close_stdin(&mut self) {
        if let Some(c) = self.child.as_mut() {
            drop(c.stdin.take());
        }
    }

    /// SIGTERM to the group, up to 5 s for the leader to exit, then SIGKILL to the group.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let group = Pid::from_raw(self.pid);
        drop(child.stdin.take());
        let _ = killpg(group, Signal::SIGTERM);
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = killpg(group, Signal::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
        unregister(self.pid);
    }

    pub fn stdout_text(&self) -> String {
        read_text(&self.log_base.with_extension("out"))
    }

    pub fn stderr_text(&self) -> String {
        read_text(&self.log_base.with_extension("err"))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A file's text, or empty.
pub fn read_text(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

/// Fields of /proc/<pid>/stat after the command name: index 0 is field 3 (state).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// utime + stime of a process (all its threads), in clock ticks.
pub fn cpu_ticks(pid: i32) -> Option<u64> {
    let f = stat_fields(pid)?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The direct children of `pid` (nginx's workers under its master).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(f) = stat_fields(child)
            && f.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(pid)
        {
            out.push(child);
        }
    }
    out
}

/// A process and its children (for nginx, the master and its workers).
pub fn family(pid: i32) -> Vec<i32> {
    let mut all = vec![pid];
    all.extend(children(pid));
    all
}

/// utime + stime summed over a process and its children, in clock ticks.
pub fn family_cpu_ticks(pid: i32) -> u64 {
    family(pid).into_iter().filter_map(cpu_ticks).sum()
}

/// VmRSS of a process and its children, in bytes.
pub fn family_rss(pid: i32) -> u64 {
    family(pid)
        .into_iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
            let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .sum()
}

/// Kernel memory that sockets take, machine-wide, in bytes: slab (socket, inode, file and
/// epoll objects) plus the TCP buffer pages in /proc/net/sockstat.
pub fn kernel_socket_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let slab_kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("Slab:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let sockstat = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let tcp_pages: u64 = sockstat
        .lines()
        .find(|l| l.starts_with("TCP:"))
        .and_then(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "mem")?;
            words.get(i + 1)?.parse().ok()
        })
        .unwrap_or(0);
    Some(slab_kb * 1024 + tcp_pages * 4096)
}

/// Is something listening on 127.0.0.1:port (or 0.0.0.0:port)? Read from /proc/net/tcp, so
/// checking makes no connection (a stray connection would confuse iperf3's server).
pub fn listening(port: u16) -> bool {
    let wanted = [
        format!("0100007F:{port:04X}"),
        format!("00000000:{port:04X}"),
    ];
    let Ok(text) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    text.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[3] == "0A" && wanted.iter().any(|w| w == f[1])
    })
}

/// Waits until `port` is listening and `proc` still runs, at most `limit`.
pub fn wait_listening(proc: &mut Proc, port: u16, limit: Duration) -> Result<()> {
    let end = Instant::now() + limit;
    loop {
        if !proc.alive() {
            bail!(
                "{} exited at start: {}",
                proc.name,
                last_lines(&proc.stderr_text(), 5)
            );
        }
        if listening(port) {
            return Ok(());
        }
        if Instant::now() >= end {
            bail!(
                "{} is not listening on port {port} after {limit:?}",
                proc.name
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The last `n` non-empty lines of a text, joined with " | ".
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
pub fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// Finds a program on PATH or in the sbin directories (haproxy and nginx live in /usr/sbin,
/// which a non-root PATH may lack).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for extra in ["/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/bin", "/bin"] {
        dirs.push(PathBuf::from(extra));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The first line a program prints for a version flag (stdout or stderr), for the report.
pub fn version_line(program: &Path, flag: &str) -> String {
    match Command::new(program).arg(flag).output() {
        Ok(o) => {
            let mut text = String::from_utf8_lossy(&o.stdout).to_string();
            text.push_str(&String::from_utf8_lossy(&o.stderr));
            text.lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_string()
        }
        Err(_) => String::new(),
    }
}
