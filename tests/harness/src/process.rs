//! The real `appbroker` binary as a child process on a generated `appserver.ini`, with
//! everything it logs: for the tests of the command line, signals and the log format.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{DEADLINE, fill_placeholders, free_ports, until};

/// Gives the broker `command` runs its control socket and state file in `dir`, as systemd's
/// `RuntimeDirectory=` and `StateDirectory=` would: by default they are named after the
/// configuration file (`/run/appbroker/appserver.sock` as root), and brokers of tests running
/// at once, all on files called appserver.ini, would otherwise meet each other's.
pub fn own_admin_dirs(command: &mut Command, dir: &std::path::Path) {
    command
        .env("RUNTIME_DIRECTORY", dir)
        .env("STATE_DIRECTORY", dir);
}

/// The path of the binary under test. Cargo tells a test where it is as it runs it (this
/// crate, not a test, cannot read it at build time); a test run by hand finds it where cargo
/// builds it, above the test's own executable (`target/debug/deps/<test>`).
pub fn binary() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::var("CARGO_BIN_EXE_appbroker").unwrap_or_else(|_| {
            let test = std::env::current_exe().expect("the test's own path");
            let profile = test
                .parent()
                .and_then(Path::parent)
                .expect("the test runs from target/<profile>/deps");
            profile.join("appbroker").display().to_string()
        })
    })
}

/// A running `appbroker` process and everything it has logged.
pub struct Broker {
    /// The process; killed, with everything it started, when dropped.
    pub child: Child,
    /// Ports of the balancers, in the order of the `@PORT@`, `@PORT2@` placeholders.
    pub ports: Vec<u16>,
    /// Its directory, where its configuration file, control socket and state file are.
    pub dir: tempfile::TempDir,
    /// Its configuration file.
    pub config_path: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
    /// The threads reading the process's output; joined once it exits, so no line is lost.
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Broker {
    /// Starts the broker on `ini`, where `@PORT@` (and `@PORT2@` for a second balancer) stand
    /// for free ports, and waits for `broker ready`.
    pub async fn start(ini: &str) -> Broker {
        Broker::start_with(ini, &[]).await
    }

    /// As [`Broker::start`], with extra command-line arguments.
    pub async fn start_with(ini: &str, args: &[&str]) -> Broker {
        Broker::start_exe(Path::new(binary()), ini, args).await
    }

    /// As [`Broker::start_with`], running the binary at `exe` (an [`Installed`] copy).
    pub async fn start_exe(exe: &Path, ini: &str, args: &[&str]) -> Broker {
        for _ in 0..5 {
            let mut broker = Broker::spawn_exe(exe, ini, args);
            let ready = broker.wait_until(|lines| {
                lines
                    .iter()
                    .any(|l| l.contains("broker ready") || l.contains("cannot listen on"))
            });
            if ready.await {
                if broker.has_log("broker ready") {
                    return broker;
                }
                if broker.has_log("address already in use") {
                    kill_tree(&mut broker.child);
                    continue; // someone took the port between free_ports() and the bind
                }
            }
            panic!("broker did not start:\n{}", broker.log_text());
        }
        panic!("no free port after 5 tries");
    }

    /// Spawns the broker without waiting for anything.
    pub fn spawn(ini: &str, args: &[&str]) -> Broker {
        Broker::spawn_exe(Path::new(binary()), ini, args)
    }

    /// As [`Broker::spawn`], running the binary at `exe`.
    fn spawn_exe(exe: &Path, ini: &str, args: &[&str]) -> Broker {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports = free_ports();
        let config_path = dir.path().join("appserver.ini");
        std::fs::write(&config_path, fill_placeholders(ini, &ports, dir.path()))
            .expect("write ini");
        let mut command = Command::new(exe);
        command.arg("--config").arg(&config_path).args(args);
        Broker::spawn_command(dir, config_path, ports, command)
    }

    /// Spawns the broker on a file already written.
    pub fn spawn_file(
        dir: tempfile::TempDir,
        config_path: PathBuf,
        ports: Vec<u16>,
        args: &[&str],
    ) -> Broker {
        let mut command = Command::new(binary());
        command.arg("--config").arg(&config_path).args(args);
        Broker::spawn_command(dir, config_path, ports, command)
    }

    /// Spawns `command`, which runs the broker on `config_path` (through a shell that lowers
    /// its limits first, say), and reads its output as [`Broker::spawn_file`] does.
    pub fn spawn_command(
        dir: tempfile::TempDir,
        config_path: PathBuf,
        ports: Vec<u16>,
        mut command: Command,
    ) -> Broker {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        Broker::spawn_command_keeping(dir, config_path, ports, command)
    }

    /// As [`Broker::spawn_command`], keeping the standard output and error `command` was
    /// given (a closed pipe, say); only those set to `Stdio::piped()` are read.
    pub fn spawn_command_keeping(
        dir: tempfile::TempDir,
        config_path: PathBuf,
        ports: Vec<u16>,
        mut command: Command,
    ) -> Broker {
        command.env_remove("RUST_LOG").stdin(Stdio::null());
        own_admin_dirs(&mut command, dir.path());
        let mut child = command.spawn().expect("spawn appbroker");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let lines = Arc::clone(&lines);
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            }));
        }
        Broker {
            child,
            ports,
            dir,
            config_path,
            lines,
            readers,
        }
    }

    /// The first balancer's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[0]))
    }

    /// The second balancer's address.
    pub fn addr2(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[1]))
    }

    /// Every line logged so far (stdout and stderr).
    pub fn logs(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The log as one text, for assertion messages.
    pub fn log_text(&self) -> String {
        self.logs().join("\n")
    }

    /// Whether a line logged so far holds `needle`.
    pub fn has_log(&self, needle: &str) -> bool {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    /// How many lines logged so far hold `needle`.
    pub fn count_logs(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits until a line containing `needle` is logged; returns it.
    pub async fn wait_for_log(&self, needle: &str) -> String {
        wait_for_line(&self.lines, needle).await
    }

    /// Waits until `count` lines contain `needle`.
    pub async fn wait_for_logs(&self, needle: &str, count: usize) {
        until(
            &format!("{count} log lines containing {needle:?}"),
            async || {
                let enough = self.count_logs(needle) >= count;
                enough
                    .then_some(())
                    .ok_or_else(|| format!("log:\n{}", self.log_text()))
            },
        )
        .await
    }

    /// Waits until `condition` holds for the log, or the process exits, or the deadline passes.
    /// True when the condition held.
    async fn wait_until(&mut self, condition: impl Fn(&[String]) -> bool) -> bool {
        let end = Instant::now() + DEADLINE;
        loop {
            if condition(&self.lines.lock().unwrap()) {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                self.drain_output();
                return condition(&self.lines.lock().unwrap());
            }
            if Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Once the process has exited: waits until its output is read to the end.
    fn drain_output(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The broker's resident memory (`VmRSS` in `/proc/<pid>/status`) in bytes; `None` once
    /// the process is gone. A test that bounds it reads it with `expect`: a bound on a figure
    /// that could not be read would hold anything.
    pub fn resident_bytes(&self) -> Option<u64> {
        status_bytes_of(&self.pid().to_string(), "VmRSS")
    }

    /// Sends a signal to the broker.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("send signal");
    }

    /// Waits for the broker to exit.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let status = until("the broker to exit", async || {
            let exited = self.child.try_wait().expect("try_wait");
            exited.ok_or_else(|| format!("log:\n{}", self.log_text()))
        })
        .await;
        self.drain_output();
        status
    }
}

impl Drop for Broker {
    /// Ends the process and every process it started (a supervisor's brokers, an upgrade's
    /// check), even when the test panicked: a test leaves nothing running behind it.
    fn drop(&mut self) {
        kill_tree(&mut self.child);
    }
}

/// The binary under test at a path of the test's own, which the test replaces as an install
/// does (a new file renamed into place): by a script of its own, the "new binary" of an
/// upgrade, or by the binary again. A supervisor started from [`Installed::path`] vets
/// whatever is there when it is upgraded; it restarts a broker from its own image, never from
/// the file there.
pub struct Installed {
    dir: tempfile::TempDir,
    /// Where it is installed.
    pub path: PathBuf,
}

impl Installed {
    /// The binary under test, installed: hard-linked (it is large) from beside the build,
    /// copied where a link cannot be made.
    pub fn install() -> Installed {
        // Under target/, as the build is: a hard link cannot cross file systems.
        let target = Path::new(binary())
            .parent()
            .and_then(Path::parent)
            .expect("the binary is in target/<profile>");
        let tmp = target.join("tmp");
        std::fs::create_dir_all(&tmp).expect("target/tmp");
        let dir = tempfile::tempdir_in(tmp).expect("temp dir");
        let installed = Installed {
            path: dir.path().join("appbroker"),
            dir,
        };
        installed.install_binary();
        installed
    }

    /// The binary under test, installed again.
    pub fn install_binary(&self) {
        let next = self.dir.path().join("appbroker.next");
        let _ = std::fs::remove_file(&next);
        if std::fs::hard_link(binary(), &next).is_err() {
            std::fs::copy(binary(), &next).expect("copy the binary");
        }
        std::fs::rename(&next, &self.path).expect("install the binary");
    }

    /// A script installed instead: `body` (after `#!/bin/sh` unless it names its own
    /// interpreter), where `@REAL@` stands for the binary under test and `@DIR@` for a
    /// directory it may write to (pid files).
    pub fn install_script(&self, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let next = self.dir.path().join("appbroker.next");
        let text = body
            .replace("@REAL@", binary())
            .replace("@DIR@", &self.dir.path().display().to_string());
        let text = if text.starts_with("#!") {
            text
        } else {
            format!("#!/bin/sh\n{text}")
        };
        std::fs::write(&next, format!("{text}\n")).expect("write the script");
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755))
            .expect("make it executable");
        std::fs::rename(&next, &self.path).expect("install the script");
    }

    /// A file of the test's own beside it (`check.pid`, written by a script).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Processes a test started outside any [`Broker`]'s tree (a script's, reparented when its
/// supervisor went, or one the test stopped), killed when this is dropped, even when the
/// test panicked.
#[derive(Default)]
pub struct Strays(pub Vec<i32>);

impl Drop for Strays {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// SIGKILLs `child` and all its descendants, reaps `child`, and waits (a few seconds at
/// most) until the descendants are gone too. It is stopped first (SIGSTOP) so that it starts
/// no new process between the look at `/proc` and the kill; the descendants, killed while it
/// is stopped, are reaped by init once it is gone.
pub fn kill_tree(child: &mut Child) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let root = child.id() as i32;
    let mut killed = Vec::new();
    if let Ok(None) = child.try_wait() {
        let _ = kill(Pid::from_raw(root), Signal::SIGSTOP);
        killed = descendants(root);
        for &pid in &killed {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let end = Instant::now() + Duration::from_secs(5);
    while killed.iter().any(|&pid| running(pid)) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until a line of `lines` (a process's output, as its readers push it) contains
/// `needle`; returns it. Fails the test with the whole output after [`DEADLINE`].
pub async fn wait_for_line(lines: &Mutex<Vec<String>>, needle: &str) -> String {
    until(&format!("a line containing {needle:?}"), async || {
        let lines = lines.lock().unwrap();
        let found = lines.iter().find(|l| l.contains(needle)).cloned();
        found.ok_or_else(|| format!("log:\n{}", lines.join("\n")))
    })
    .await
}

/// `field` (`VmRSS`, `VmHWM`) of `/proc/<pid>/status` in bytes, `pid` a number or `self`.
/// Fails the test when `/proc` cannot tell: a memory bound that read 0 would hold anything,
/// and Linux is the target.
pub fn status_bytes(pid: &str, field: &str) -> u64 {
    status_bytes_of(pid, field)
        .unwrap_or_else(|| panic!("{field} of /proc/{pid}/status cannot be read"))
}

/// [`status_bytes`], or `None` when the process is gone or `/proc` cannot tell.
fn status_bytes_of(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let kib: u64 = value.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// True while process `pid` exists and is no zombie.
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

/// Every live descendant of process `root` (children first), from the parent pids in
/// `/proc/*/stat`.
pub fn descendants(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let ppid = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut at = 0;
    while at < found.len() {
        let parent = found[at];
        found.extend(
            parents
                .iter()
                .filter(|&&(_, ppid)| ppid == parent)
                .map(|&(pid, _)| pid),
        );
        at += 1;
    }
    found.remove(0);
    found
}

/// Runs the binary with `args` to completion, returning (exit code, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run appbroker");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// Runs `command` to completion, standard input closed, within [`DEADLINE`]: a command still
/// running then is killed and the test fails (rather than hanging with it). Returns (exit
/// code, stdout, stderr); the code is -1 when a signal ended it.
pub fn run_bounded(command: Command) -> (i32, String, String) {
    run_bounded_for(command, DEADLINE)
}

/// [`run_bounded`] within `limit`: for a command whose answer comes after a wait of its own
/// (an upgrade whose new broker misses its start deadline answers past that deadline).
pub fn run_bounded_for(mut command: Command, limit: Duration) -> (i32, String, String) {
    let mut child = command
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the command");
    let read = |stream: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut stream) = stream {
                let _ = stream.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).to_string()
        })
    };
    let stdout = read(child.stdout.take().map(|s| Box::new(s) as _));
    let stderr = read(child.stderr.take().map(|s| Box::new(s) as _));
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (
        status.code().unwrap_or(-1),
        stdout.join().expect("stdout reader"),
        stderr.join().expect("stderr reader"),
    )
}
