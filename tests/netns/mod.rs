//! Network namespaces standing in for machines on one LAN, for the tests that need several
//! hosts (tests/ha_pair.rs): a switch namespace holding a bridge, one namespace per host joined
//! to it by a veth pair, processes started inside a host (`ip netns exec`), sockets made inside
//! it (a thread that entered it runs a tokio runtime), and the faults a LAN has: a cable pulled,
//! two hosts that stop hearing each other.
//!
//! Nothing is added to the namespace the tests run in: the bridge, every link and address live
//! in the namespaces made here, so their traffic never leaves them and their addresses cannot
//! collide with anything. Each [`Lan`] names its namespaces `abha<pid>-<n>-<role>` (and its
//! temporary directory `abha<pid>-<n>-...`); dropping it ends the processes left in them and
//! deletes them, even when the test failed or panicked, and a new `Lan` first deletes those of
//! test processes that died without dropping theirs.
//!
//! Linux only, and root: making namespaces needs CAP_SYS_ADMIN and CAP_NET_ADMIN.
pub mod pair;

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// What every namespace of these tests is named after, so a later run finds the stale ones.
const PREFIX: &str = "abha";

/// How long any wait of these tests may take before the test fails. Generous: it only bounds a
/// failing test, a passing one goes on as soon as its condition holds.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `condition` every 10 ms until it returns `Some`, or fails the test after `deadline`
/// with `what` and the state `explain` describes.
pub fn wait_for<T>(
    what: &str,
    deadline: Duration,
    mut condition: impl FnMut() -> Option<T>,
    explain: impl FnOnce() -> String,
) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(value) = condition() {
            return value;
        }
        if Instant::now() > end {
            panic!(
                "timed out after {deadline:?} waiting for {what}\n{}",
                explain()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `program` with `args`: its standard output, or what went wrong.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// `run("ip", args)`, failing the test when it fails: past the first namespace, a step that
/// fails means the test cannot go on.
fn ip(args: &[&str]) -> String {
    run("ip", args).unwrap_or_else(|e| panic!("{e}"))
}

/// A bridge in a namespace of its own, and the hosts plugged into it.
pub struct Lan {
    /// `abha<pid>-<n>-`: every namespace of this LAN starts with it.
    prefix: String,
    /// The namespace holding the bridge `lan`; a host's link ends there as port `p-<role>`.
    switch: String,
    /// Every namespace made, the switch's included, to delete when dropped.
    made: Vec<String>,
    /// A directory for the files of the processes run on the LAN (configurations, logs, pid
    /// files), named with the prefix too.
    dir: tempfile::TempDir,
}

/// One machine on a [`Lan`]: a namespace whose `eth0` is plugged into the bridge.
pub struct Host {
    /// The namespace's name.
    pub netns: String,
    /// What the test calls it (`a`, `b`, `client`...): the end of the namespace's name.
    pub role: String,
    /// Its address on the LAN (a /24).
    pub address: Ipv4Addr,
}

impl Lan {
    /// Deletes the namespaces of earlier test runs that died, then makes the switch. `Err`
    /// when namespaces cannot be made here (not root, no `ip`): the caller fails the test
    /// saying what it needs.
    pub fn new() -> Result<Lan, String> {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        remove_stale();
        let prefix = format!(
            "{PREFIX}{}-{}-",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        );
        let dir = tempfile::Builder::new()
            .prefix(&prefix)
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        let switch = format!("{prefix}switch");
        run("ip", &["netns", "add", &switch])?;
        // From here on the LAN is dropped on any failure, which deletes what was made.
        let lan = Lan {
            prefix,
            made: vec![switch.clone()],
            switch,
            dir,
        };
        let sw = lan.switch.as_str();
        ip(&["-n", sw, "link", "add", "lan", "type", "bridge"]);
        ip(&["-n", sw, "link", "set", "lan", "up"]);
        Ok(lan)
    }

    /// The LAN's directory, removed with it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Makes the host `role` with `address`/24 on `eth0`, plugged into the bridge, and its
    /// loopback up.
    pub fn host(&mut self, role: &str, address: Ipv4Addr) -> Host {
        let netns = format!("{}{role}", self.prefix);
        ip(&["netns", "add", &netns]);
        self.made.push(netns.clone());
        let (sw, port) = (self.switch.as_str(), format!("p-{role}"));
        let cidr = format!("{address}/24");
        let steps: [&[&str]; 5] = [
            &[
                "-n", sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &netns,
            ],
            &["-n", sw, "link", "set", &port, "master", "lan", "up"],
            &["-n", &netns, "addr", "add", &cidr, "dev", "eth0"],
            &["-n", &netns, "link", "set", "eth0", "up"],
            &["-n", &netns, "link", "set", "lo", "up"],
        ];
        for step in steps {
            ip(step);
        }
        Host {
            netns,
            role: role.to_owned(),
            address,
        }
    }

    /// Pulls `host`'s cable: its port on the switch goes down, and with it the carrier of the
    /// host's `eth0`, as when a cable or a switch port fails.
    pub fn unplug(&self, host: &Host) {
        let port = format!("p-{}", host.role);
        ip(&["-n", &self.switch, "link", "set", &port, "down"]);
    }

    /// Plugs `host`'s cable back.
    pub fn plug(&self, host: &Host) {
        let port = format!("p-{}", host.role);
        ip(&["-n", &self.switch, "link", "set", &port, "up"]);
    }

    /// Stops (`true`) or restores traffic between the hosts `hosts` while each still reaches
    /// every other host: the partition that makes a split brain. (The bridge's isolated ports
    /// forward only to ports that are not isolated.)
    pub fn isolate(&self, hosts: &[&Host], isolated: bool) {
        let state = if isolated { "on" } else { "off" };
        for host in hosts {
            let port = format!("p-{}", host.role);
            let args = [
                "netns",
                "exec",
                &self.switch,
                "bridge",
                "link",
                "set",
                "dev",
                &port,
                "isolated",
                state,
            ];
            ip(&args);
        }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for netns in self.made.iter().rev() {
            delete(netns);
        }
    }
}

impl Host {
    /// Starts `program` with `args` inside this host, its standard output and error appended
    /// to `log`. The child is the program itself: `ip netns exec` replaces itself with it.
    pub fn spawn(&self, program: &str, args: &[&str], log: &Path) -> Child {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", log.display()));
        let err = file.try_clone().expect("clone a file handle");
        Command::new("ip")
            .args(["netns", "exec", &self.netns, program])
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program} in {}: {e}", self.netns))
    }

    /// Whether `address` is configured on this host's `eth0` now.
    pub fn holds(&self, address: Ipv4Addr) -> bool {
        let shown = ip(&["-n", &self.netns, "-4", "-o", "addr", "show", "dev", "eth0"]);
        let needle = format!("inet {address}/");
        shown.contains(&needle)
    }

    /// A thread inside this host running a tokio runtime: the sockets its tasks make belong
    /// to this host.
    pub fn runtime(&self) -> Inside {
        let path = format!("/var/run/netns/{}", self.netns);
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open the namespace");
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("enter the namespace");
            // One thread: every task, so every socket, is made on this one, in the namespace.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            handle_tx.send(runtime.handle().clone()).expect("send");
            let _ = runtime.block_on(stop_rx);
        });
        let handle = handle_rx.recv().expect("the namespace thread started");
        Inside {
            handle,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

/// A tokio runtime on a thread inside a [`Host`]; stopped (its tasks dropped) when dropped.
pub struct Inside {
    pub handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Inside {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Ends a child process at once and reaps it (a no-op when it has exited already).
pub fn kill_now(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends `signal` to the process `pid`.
pub fn signal(pid: u32, signal: Signal) {
    let pid = i32::try_from(pid).expect("a pid fits an i32");
    kill(Pid::from_raw(pid), signal).unwrap_or_else(|e| panic!("kill -{signal} {pid}: {e}"));
}

/// Ends every process left inside `netns` (all started by these tests, or by what they
/// started: keepalived's children and scripts), then deletes it.
fn delete(netns: &str) {
    let me = std::process::id();
    // A killed keepalived may start no new check, but one already forking can appear after
    // the first sweep: sweep until the namespace is empty.
    for _ in 0..50 {
        let pids = run("ip", &["netns", "pids", netns]).unwrap_or_default();
        let pids: Vec<u32> = pids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|&p| p != me)
            .collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = run("ip", &["netns", "del", netns]);
}

/// Deletes the namespaces and directories of test processes that are gone (a run killed
/// before its `Lan`s were dropped), leaving those of runs still going.
fn remove_stale() {
    let namespaces = run("ip", &["netns", "list"]).unwrap_or_default();
    for name in namespaces
        .lines()
        .filter_map(|l| l.split_whitespace().next())
    {
        if let Some(pid) = left_by_dead_process(name) {
            eprintln!("deleting namespace {name}, left by test process {pid}");
            delete(name);
        }
    }
    let temp = std::env::temp_dir();
    for entry in std::fs::read_dir(&temp).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if left_by_dead_process(&name).is_some() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The pid in `name` when it is one of [`Lan`]'s names (`abha<pid>-...`) and that process
/// is gone.
fn left_by_dead_process(name: &str) -> Option<u32> {
    let pid: u32 = name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()?;
    let gone = pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists();
    gone.then_some(pid)
}
