//! The pair of docs/high-availability.md on a [`Lan`]: broker hosts `a` and `b`, each running
//! the real appbroker and keepalived with contrib/keepalived/'s files; a `servers` host with
//! two echo servers that the brokers balance and two web servers behind their `[BALANCE_HTTP]`;
//! a `client` host that sends a client to the virtual address every 50 ms and records what each
//! one got, and asks the web servers through it with or without the broker's cookie.
//!
//! Addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for network tests; they
//! live only in the test's namespaces, as do the fixed ports (nothing else listens there).
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::header::{CONNECTION, COOKIE, HOST, SET_COOKIE};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{DEADLINE, Host, Inside, Lan, kill_now, run, wait_for};

/// The address clients connect to, held by one broker host at a time.
pub const VIRTUAL_ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// The broker's port on both hosts (LOCAL_SERVER_PORT).
pub const PORT: u16 = 5000;
/// The echo servers, by name, on the `servers` host.
pub const SERVERS: [(&str, u16); 2] = [("s1", 7001), ("s2", 7002)];
/// The HTTP balancer's port on both hosts (`[BALANCE_HTTP]`'s LOCAL_SERVER_PORT).
pub const HTTP_PORT: u16 = 8080;
/// The web servers, by name, on the `servers` host: `[BALANCE_HTTP]`'s REMOTE_SERVER_01 and
/// _02, in this order.
pub const WEB_SERVERS: [(&str, u16); 2] = [("w1", 8001), ("w2", 8002)];
/// The broker's session cookie: `<REMOTE_SERVER id>.<22 base64url characters>`.
pub const COOKIE_NAME: &str = "TOTVS_BROKER_SH_001";
const SERVERS_ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 30);
const CLIENT_ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 20);
/// Time between two clients of [`Clients`] (the pair's client loop).
pub const CLIENT_EVERY: Duration = Duration::from_millis(50);
/// Bound on one client's exchange: past it the attempt counts as failed. Above the 1 s of a
/// first SYN retransmission, so an attempt caught by a takeover can still get through.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on a whole client loop: 3 minutes of clients.
const MAX_ATTEMPTS: u64 = 3600;

/// The contrib/keepalived/ files, as shipped.
fn contrib(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("contrib/keepalived")
        .join(file)
}

/// The broker configuration both hosts run, the same file on each as in production.
/// SHUTDOWN_GRACE is above keepalived's fall x interval (2 s): a broker stopping gracefully
/// fails its check and gives the address away while it still accepts. The check runs
/// `appbroker ping`, over the control socket: `QUERY_ALLOW=198.18.0.20` (the client host
/// alone) in the balancers makes every test here prove that it does not need the query port.
/// The hosts share one file system here, unlike real ones: each has the file in a directory of
/// its own, and the control socket and state file are named relative to it, not
/// `/run/appbroker`. The `[BALANCE_HTTP]` section is the same on both hosts too, so the two
/// brokers agree on what a cookie's server id names, and so is `SESSION_SECRET`
/// (contrib/keepalived/appbroker-pair.conf says so), so each takes the cookies the other signed.
fn broker_ini() -> String {
    let mut ini = String::from(
        "[General]\nConsoleLog=1\nSHUTDOWN_GRACE=5s\nSHUTDOWN_TIMEOUT=2s\n\
         CONTROL_SOCKET=appbroker.sock\nSTATE_FILE=appbroker.state\n\
         SESSION_SECRET=the pair's session secret, the same on both hosts\n",
    );
    let sections = [
        ("BALANCE_SMART_CLIENT_DESKTOP", PORT, &SERVERS),
        ("BALANCE_HTTP", HTTP_PORT, &WEB_SERVERS),
    ];
    for (section, port, servers) in sections {
        ini.push_str(&format!(
            "\n[{section}]\nLOCAL_SERVER_ADDRESS=0.0.0.0\nQUERY_ALLOW={CLIENT_ADDRESS}\n\
             LOCAL_SERVER_PORT={port}\n"
        ));
        for (i, (_, port)) in servers.iter().enumerate() {
            ini.push_str(&format!(
                "REMOTE_SERVER_{:02}={SERVERS_ADDRESS} {port}\n",
                i + 1
            ));
        }
    }
    ini
}

/// Where broker host `name` keeps its appserver.ini: a directory of its own, as each real host
/// has its own /etc and /run, so that its control socket (named relative to the file) is its
/// own.
fn host_config(dir: &Path, name: &str) -> PathBuf {
    dir.join(name).join("appserver.ini")
}

/// How a pair is set up: what the test changes from contrib's files.
#[derive(Debug, Clone)]
pub struct Settings {
    /// keepalived's advert_int on both hosts; `None` keeps contrib's.
    pub advert_int: Option<&'static str>,
}

/// One broker host: its namespace, its appbroker and its keepalived.
pub struct BrokerHost {
    pub host: Host,
    /// `a` or `b`, as in contrib/keepalived/keepalived-<name>.conf.
    pub name: &'static str,
    broker: Option<Child>,
    keepalived: Child,
    dir: PathBuf,
}

/// Where `program` (`appbroker`, `keepalived`) of the broker host `name` writes its output.
fn log_file(dir: &Path, program: &str, name: &str) -> PathBuf {
    dir.join(format!("{program}-{name}.log"))
}

impl BrokerHost {
    /// Starts appbroker on `config` and waits for `broker ready` in its log.
    fn start_broker(host: &Host, dir: &Path, name: &str, config: &Path) -> Child {
        let log = log_file(dir, "appbroker", name);
        let before = std::fs::read_to_string(&log).map_or(0, |l| l.len());
        let config = config.to_str().expect("a UTF-8 path");
        let mut child = host.spawn(env!("CARGO_BIN_EXE_appbroker"), &["--config", config], &log);
        let ready = || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.get(before..)
                .is_some_and(|t| t.contains("broker ready"))
        };
        wait_for(
            &format!("appbroker on host {name} to be ready"),
            DEADLINE,
            || (ready() || child.try_wait().ok().flatten().is_some()).then_some(()),
            || std::fs::read_to_string(&log).unwrap_or_default(),
        );
        assert!(
            ready(),
            "appbroker on host {name} exited at start:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        child
    }

    /// The broker's process id (`ID` in its JSON).
    pub fn broker_pid(&self) -> u32 {
        self.broker.as_ref().expect("the broker runs").id()
    }

    /// SIGKILLs the broker: a crash, with nothing said to anyone.
    pub fn kill_broker(&mut self) {
        let mut broker = self.broker.take().expect("the broker runs");
        kill_now(&mut broker);
    }

    /// Waits for the broker to exit (after a signal the test sent), failing the test past the
    /// deadline.
    pub fn wait_broker_exit(&mut self) {
        let broker = self.broker.as_mut().expect("the broker runs");
        wait_for(
            "the broker to exit",
            DEADLINE,
            || broker.try_wait().ok().flatten(),
            String::new,
        );
        self.broker = None;
    }

    /// Starts the broker again (after [`BrokerHost::kill_broker`]).
    pub fn restart_broker(&mut self) {
        assert!(self.broker.is_none(), "the broker of {} runs", self.name);
        let config = host_config(&self.dir, self.name);
        self.broker = Some(Self::start_broker(
            &self.host, &self.dir, self.name, &config,
        ));
    }

    /// keepalived's log so far.
    pub fn keepalived_text(&self) -> String {
        std::fs::read_to_string(log_file(&self.dir, "keepalived", self.name)).unwrap_or_default()
    }

    /// The broker's log so far.
    pub fn broker_text(&self) -> String {
        std::fs::read_to_string(log_file(&self.dir, "appbroker", self.name)).unwrap_or_default()
    }

    /// The VRRP states keepalived entered so far, in order (`MASTER`, `BACKUP`, `FAULT`).
    pub fn states(&self) -> Vec<String> {
        self.keepalived_text()
            .lines()
            .filter_map(|line| {
                let rest = line.split("(appbroker) Entering ").nth(1)?;
                Some(rest.strip_suffix(" STATE")?.to_owned())
            })
            .collect()
    }

    /// The state keepalived is in now, as its log says.
    pub fn state(&self) -> Option<String> {
        self.states().pop()
    }

    /// Whether this host holds the virtual address now.
    pub fn holds_address(&self) -> bool {
        self.host.holds(VIRTUAL_ADDRESS)
    }
}

/// The whole setup; everything is stopped and removed when dropped.
pub struct Pair {
    pub brokers: [BrokerHost; 2],
    pub servers: Servers,
    /// The client host's runtime: [`Clients`] and queries run there.
    pub client: Inside,
    /// Fields drop in order: the processes and runtimes above before their namespaces.
    pub lan: Lan,
}

impl Pair {
    /// Builds the LAN, starts the echo servers, both brokers and both keepalived, and waits
    /// until one broker host holds the address and the other is its BACKUP.
    pub fn start(settings: &Settings) -> Pair {
        let mut lan = Lan::new().unwrap_or_else(|why| {
            panic!(
                "cannot create network namespaces ({why}); these tests need root \
                 (CAP_NET_ADMIN, CAP_SYS_ADMIN), iproute2 and keepalived: run them as .ci/run does"
            )
        });
        for (program, package) in [("keepalived", "keepalived"), ("curl", "curl")] {
            if let Err(e) = run(program, &["--version"]) {
                panic!("{e}; these tests need {program}: apt-get install {package}");
            }
        }
        let dir = lan.dir().to_owned();
        let addresses = [Ipv4Addr::new(198, 18, 0, 11), Ipv4Addr::new(198, 18, 0, 12)];
        let hosts = [lan.host("a", addresses[0]), lan.host("b", addresses[1])];
        let servers = Servers::start(lan.host("servers", SERVERS_ADDRESS).runtime());
        let client = lan.host("client", CLIENT_ADDRESS).runtime();

        // keepalived refuses a check script that a non-root user could change, and the
        // checkout may sit in such a directory: the script runs from the temporary
        // directory (root's, mode 0700), copied byte for byte.
        let check = dir.join("appbroker-check");
        std::fs::copy(contrib("appbroker-check"), &check).expect("copy appbroker-check");
        let [host_a, host_b] = hosts;
        let brokers =
            [(host_a, "a", addresses[1]), (host_b, "b", addresses[0])].map(|(host, name, peer)| {
                let config = host_config(&dir, name);
                std::fs::create_dir_all(config.parent().expect("a directory"))
                    .expect("make the host's directory");
                std::fs::write(&config, broker_ini()).expect("write appserver.ini");
                let broker = BrokerHost::start_broker(&host, &dir, name, &config);
                let conf = keepalived_conf(name, &host, peer, &check, &config, settings);
                let conf_path = dir.join(format!("keepalived-{name}.conf"));
                std::fs::write(&conf_path, conf).expect("write keepalived.conf");
                let keepalived = start_keepalived(&host, &dir, name, &conf_path);
                BrokerHost {
                    host,
                    name,
                    broker: Some(broker),
                    keepalived,
                    dir: dir.clone(),
                }
            });
        let pair = Pair {
            brokers,
            servers,
            client,
            lan,
        };
        let active = pair.active();
        let backup = 1 - active;
        wait_for(
            "the other host to be the BACKUP",
            DEADLINE,
            || (pair.brokers[backup].state().as_deref() == Some("BACKUP")).then_some(()),
            || pair.explain(),
        );
        pair
    }

    /// The index of the host holding the virtual address, once exactly one does.
    pub fn active(&self) -> usize {
        wait_for(
            "exactly one broker host to hold the virtual address",
            DEADLINE,
            || match self.brokers.each_ref().map(|b| b.holds_address()) {
                [true, false] => Some(0),
                [false, true] => Some(1),
                _ => None,
            },
            || self.explain(),
        )
    }

    /// The index in [`Pair::brokers`] of the host `name` (`a` or `b`).
    pub fn index_of(&self, name: &str) -> usize {
        self.brokers
            .iter()
            .position(|b| b.name == name)
            .unwrap_or_else(|| panic!("no broker host {name}"))
    }

    /// Both hosts' keepalived and broker logs, for a failing assertion.
    pub fn explain(&self) -> String {
        let mut text = String::new();
        for broker in &self.brokers {
            text.push_str(&format!(
                "--- host {} holds the address: {}; keepalived:\n{}\n--- appbroker on {}:\n{}\n",
                broker.name,
                broker.holds_address(),
                broker.keepalived_text(),
                broker.name,
                broker.broker_text()
            ));
        }
        text
    }

    /// Starts a client every [`CLIENT_EVERY`] from the client host to the virtual address.
    pub fn clients(&self) -> Clients {
        let target = SocketAddr::from((VIRTUAL_ADDRESS, PORT));
        Clients::start(&self.client, target, Asks::Line)
    }

    /// Starts a browser's request every [`CLIENT_EVERY`] from the client host to the HTTP
    /// balancer at the virtual address, each on a new connection with the broker's cookie
    /// `cookie`. The cookie is valid while its server lives: an answer that sets it anew
    /// counts as wrong.
    pub fn browser(&self, cookie: &str) -> Clients {
        let target = SocketAddr::from((VIRTUAL_ADDRESS, HTTP_PORT));
        let asks = Asks::Page {
            cookie: cookie.to_owned(),
        };
        Clients::start(&self.client, target, asks)
    }

    /// `GET /TOTVS_BROKER_QUERY/JSON` from the client host through the virtual address, on
    /// the balancer of `port` ([`PORT`], [`HTTP_PORT`]): the answer of whichever broker holds
    /// the address.
    pub fn query_json(&self, port: u16) -> serde_json::Value {
        let target = SocketAddr::from((VIRTUAL_ADDRESS, port));
        let answer = run_inside(&self.client, async move {
            let mut stream = TcpStream::connect(target).await?;
            stream
                .write_all(b"GET /TOTVS_BROKER_QUERY/JSON HTTP/1.0\r\n\r\n")
                .await?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        })
        .unwrap_or_else(|e| panic!("the JSON query through the virtual address failed: {e}"));
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("the JSON query's answer does not parse ({e}):\n{answer}"))
    }

    /// Connects to the virtual address from the client host and keeps the connection.
    pub fn hold(&self) -> Held {
        let target = SocketAddr::from((VIRTUAL_ADDRESS, PORT));
        let stream = run_inside(&self.client, TcpStream::connect(target))
            .unwrap_or_else(|e| panic!("cannot connect to {target}: {e}"));
        Held {
            stream: Arc::new(tokio::sync::Mutex::new(BufReader::new(stream))),
            sent: 0,
        }
    }

    /// Sends one more line on `held` and reads the answer.
    pub fn exchange(&self, held: &mut Held) -> Outcome {
        held.sent += 1;
        let (stream, sent) = (Arc::clone(&held.stream), format!("held {}", held.sent));
        run_inside(&self.client, async move {
            let mut stream = stream.lock().await;
            let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, ask(&mut stream, &sent));
            judge(answer.await, &sent)
        })
    }

    /// `GET path` from the client host to the HTTP balancer at the virtual address, with the
    /// broker's cookie `cookie` if given, on a new connection (as a browser after a takeover).
    pub fn get(&self, path: &str, cookie: Option<&str>) -> Page {
        let target = SocketAddr::from((VIRTUAL_ADDRESS, HTTP_PORT));
        let (path, cookie) = (path.to_owned(), cookie.map(str::to_owned));
        run_inside(&self.client, async move {
            let answer =
                tokio::time::timeout(ATTEMPT_TIMEOUT, fetch(target, &path, cookie.as_deref()));
            judge_page(answer.await, &path)
        })
    }
}

/// A client connection held open through the virtual address, as SmartClient holds one for
/// a whole session.
pub struct Held {
    stream: Arc<tokio::sync::Mutex<BufReader<TcpStream>>>,
    sent: u64,
}

/// Runs `future` on `inside`'s thread (so its sockets are made in that namespace) and returns
/// its output.
pub fn run_inside<T: Send + 'static>(
    inside: &Inside,
    future: impl Future<Output = T> + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    inside.handle.spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv_timeout(DEADLINE)
        .expect("a task inside a namespace finished in time")
}

/// contrib/keepalived/keepalived-<name>.conf with this host's values: every `$NAME=` line the
/// test knows a value for is replaced (and must be there), the others kept as shipped, and
/// the include points at contrib/keepalived/appbroker-pair.conf.
fn keepalived_conf(
    name: &str,
    host: &Host,
    peer: Ipv4Addr,
    check: &Path,
    config: &Path,
    settings: &Settings,
) -> String {
    let shipped = contrib(&format!("keepalived-{name}.conf"));
    let text = std::fs::read_to_string(&shipped).expect("read the shipped keepalived.conf");
    let mut values = vec![
        ("INTERFACE", "eth0".to_owned()),
        ("SELF", host.address.to_string()),
        ("PEER", peer.to_string()),
        ("VIRTUAL_ADDRESS", format!("{VIRTUAL_ADDRESS}/24")),
        (
            "CHECK",
            format!(
                "{} --config {} --appbroker {}",
                check.display(),
                config.display(),
                env!("CARGO_BIN_EXE_appbroker")
            ),
        ),
    ];
    if let Some(advert_int) = settings.advert_int {
        values.push(("ADVERT_INT", advert_int.to_owned()));
    }
    let mut replaced = Vec::new();
    let mut out = String::new();
    for line in text.lines() {
        let defined = line
            .strip_prefix('$')
            .and_then(|l| l.split_once('='))
            .and_then(|(key, _)| values.iter().find(|(k, _)| *k == key));
        if let Some((key, value)) = defined {
            out.push_str(&format!("${key}={value}\n"));
            replaced.push(*key);
        } else if line.starts_with("include ") {
            out.push_str(&format!(
                "include {}\n",
                contrib("appbroker-pair.conf").display()
            ));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    for (key, _) in &values {
        assert!(
            replaced.contains(key),
            "{} has no ${key}= line for the test to fill in",
            shipped.display()
        );
    }
    out
}

/// Starts keepalived inside `host` on `conf`: in the foreground (`-n`, so the test holds its
/// process), VRRP only (`-P`), logging to its standard output only (`-l -G`: nothing to the
/// host's syslog), with its pid files in the test's directory (`-p -r -c -b`), so it shares
/// nothing with another keepalived of this machine.
fn start_keepalived(host: &Host, dir: &Path, name: &str, conf: &Path) -> Child {
    let path = |p: PathBuf| p.to_str().expect("a UTF-8 path").to_owned();
    let mut args: Vec<String> = ["-n", "-l", "-G", "-D", "-P", "-f"]
        .map(String::from)
        .into();
    args.push(path(conf.to_owned()));
    for (option, file) in [
        ("-p", ""),
        ("-r", "-vrrp"),
        ("-c", "-checkers"),
        ("-b", "-bfd"),
    ] {
        args.push(option.to_owned());
        args.push(path(dir.join(format!("keepalived-{name}{file}.pid"))));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    host.spawn("keepalived", &args, &log_file(dir, "keepalived", name))
}

impl Drop for BrokerHost {
    fn drop(&mut self) {
        if let Some(mut broker) = self.broker.take() {
            kill_now(&mut broker);
        }
        kill_now(&mut self.keepalived);
    }
}

/// The stand-in servers on the `servers` host: the echo servers and the web servers.
pub struct Servers {
    /// The runtime serving them, on the `servers` host.
    _inside: Inside,
    running: Vec<Running>,
}

/// One stand-in server, and how to stop it.
struct Running {
    name: &'static str,
    stop: CancellationToken,
    /// Told once the listener and every connection are closed.
    stopped: std::sync::mpsc::Receiver<()>,
}

/// What a stand-in server speaks on each connection it accepts.
#[derive(Clone, Copy)]
enum Speaks {
    /// [`echo`]: lines, for the TCP balancer.
    Lines,
    /// [`web_page`]: HTTP/1.1, for the HTTP balancer.
    Http,
}

impl Servers {
    fn start(inside: Inside) -> Servers {
        let servers = (SERVERS.iter().map(|&s| (s, Speaks::Lines)))
            .chain(WEB_SERVERS.iter().map(|&s| (s, Speaks::Http)));
        let running = servers
            .map(|((name, port), speaks)| {
                let listener = run_inside(&inside, async move {
                    TcpListener::bind((SERVERS_ADDRESS, port)).await
                })
                .unwrap_or_else(|e| panic!("cannot listen on {SERVERS_ADDRESS}:{port}: {e}"));
                let stop = CancellationToken::new();
                let (stopped_tx, stopped) = std::sync::mpsc::channel();
                inside
                    .handle
                    .spawn(serve(name, speaks, listener, stop.clone(), stopped_tx));
                Running {
                    name,
                    stop,
                    stopped,
                }
            })
            .collect();
        Servers {
            _inside: inside,
            running,
        }
    }

    /// Stops the server `name` as a crashed AppServer stops: its listener closed (the next
    /// connect is refused) and every connection it had cut. Returns once that is done.
    pub fn stop(&mut self, name: &str) {
        let index = self
            .running
            .iter()
            .position(|r| r.name == name)
            .unwrap_or_else(|| panic!("no server {name} running"));
        let running = self.running.remove(index);
        running.stop.cancel();
        running
            .stopped
            .recv_timeout(DEADLINE)
            .expect("the server stopped in time");
    }
}

/// Serves `listener` until `stop`, each connection as `speaks` says. Sends on `stopped` once
/// the listener and every connection are closed.
async fn serve(
    name: &'static str,
    speaks: Speaks,
    listener: TcpListener,
    stop: CancellationToken,
    stopped: std::sync::mpsc::Sender<()>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                match speaks {
                    Speaks::Lines => connections.spawn(echo(name, stream, peer)),
                    Speaks::Http => connections.spawn(web_page(name, stream, peer)),
                };
            }
        }
    }
    drop(listener);
    connections.shutdown().await;
    let _ = stopped.send(());
}

/// Each line `L` the client sends comes back as `<name> via <client's address>: L`, so a
/// client learns which server answered and through which broker host.
async fn echo(name: &'static str, stream: TcpStream, peer: SocketAddr) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = format!("{name} via {}: {line}\n", peer.ip());
        if write.write_all(reply.as_bytes()).await.is_err() {
            break;
        }
    }
}

/// Answers every request (keep-alive included, as the broker's pool uses it) `200 OK` with
/// the body `<name> via <client's address>: <path>`: the echo's words, over HTTP. It also
/// says `with the broker's cookie` when the request still carried [`COOKIE_NAME`], which the
/// broker must remove (its own session cookie), so such an answer is judged wrong.
async fn web_page(name: &'static str, stream: TcpStream, peer: SocketAddr) {
    let service = service_fn(move |request: Request<hyper::body::Incoming>| async move {
        let leaked = request
            .headers()
            .get_all(COOKIE)
            .iter()
            .any(|c| c.to_str().is_ok_and(|c| c.contains(COOKIE_NAME)));
        let mut body = format!("{name} via {}: {}", peer.ip(), request.uri().path());
        if leaked {
            body.push_str(" with the broker's cookie");
        }
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(body))))
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// What one client got.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The line came back from `server`, relayed by the broker host at `via`.
    Served { server: String, via: Ipv4Addr },
    /// No answer: refused, reset, timed out, closed... (the error's words).
    Failed(String),
    /// An answer that is not the echo of what this client sent: never acceptable.
    Wrong(String),
}

impl Outcome {
    /// Whether this is an answer relayed by the broker host at `via`.
    pub fn served_via(&self, via: Ipv4Addr) -> bool {
        matches!(self, Outcome::Served { via: v, .. } if *v == via)
    }
}

/// One client of the loop.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Its number in the loop (what it sent: `attempt <n>`).
    pub n: u64,
    pub started: Instant,
    pub ended: Instant,
    pub outcome: Outcome,
}

/// A client every [`CLIENT_EVERY`] to the virtual address, each one connecting, sending a
/// line (or a request) and reading the answer (the pair's client loop), bounded in count
/// ([`MAX_ATTEMPTS`]) and each in time ([`ATTEMPT_TIMEOUT`]). Stopped when dropped.
pub struct Clients {
    done: Arc<Mutex<Vec<Attempt>>>,
    /// How many clients the loop has started.
    started: Arc<AtomicUsize>,
    stop: CancellationToken,
}

/// What each client of a [`Clients`] loop asks.
#[derive(Clone)]
enum Asks {
    /// The line `attempt <n>` of the echo servers, through the TCP balancer.
    Line,
    /// `GET /attempt/<n>` with the broker's cookie `cookie`, through the HTTP balancer.
    Page { cookie: String },
}

impl Clients {
    fn start(inside: &Inside, target: SocketAddr, asks: Asks) -> Clients {
        let done = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let (record, count, until) = (Arc::clone(&done), Arc::clone(&started), stop.clone());
        inside.handle.spawn(async move {
            let mut every = tokio::time::interval(CLIENT_EVERY);
            for n in 0..MAX_ATTEMPTS {
                tokio::select! {
                    () = until.cancelled() => break,
                    _ = every.tick() => {}
                }
                let (record, asks) = (Arc::clone(&record), asks.clone());
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let started = Instant::now();
                    let outcome = match asks {
                        Asks::Line => attempt(target, n).await,
                        Asks::Page { cookie } => page_attempt(target, n, &cookie).await,
                    };
                    let ended = Instant::now();
                    let attempt = Attempt {
                        n,
                        started,
                        ended,
                        outcome,
                    };
                    record.lock().expect("the record").push(attempt);
                });
            }
        });
        Clients {
            done,
            started,
            stop,
        }
    }

    /// Stops the loop and waits until every client it started has finished: what comes next
    /// meets none of them. Returns every attempt.
    pub fn stop(self) -> Vec<Attempt> {
        self.stop.cancel();
        wait_for(
            "the clients started to finish",
            DEADLINE,
            || {
                let done = self.done.lock().expect("the record").len();
                (done == self.started.load(Ordering::SeqCst)).then_some(())
            },
            String::new,
        );
        self.attempts()
    }

    /// Every attempt finished so far, in the order they started.
    pub fn attempts(&self) -> Vec<Attempt> {
        let mut attempts = self.done.lock().expect("the record").clone();
        attempts.sort_by_key(|a| a.n);
        attempts
    }

    /// Waits until an attempt that started after `since` satisfies `condition`, and returns
    /// it.
    pub fn wait_for(
        &self,
        what: &str,
        since: Instant,
        condition: impl Fn(&Attempt) -> bool,
        explain: impl FnOnce() -> String,
    ) -> Attempt {
        wait_for(
            what,
            DEADLINE,
            || {
                self.attempts()
                    .into_iter()
                    .find(|a| a.started > since && condition(a))
            },
            explain,
        )
    }

    /// Waits until `count` attempts that started after `since` have finished.
    pub fn wait_count(&self, count: usize, since: Instant) {
        wait_for(
            &format!("{count} clients after the mark"),
            DEADLINE,
            || {
                let done = self.attempts().iter().filter(|a| a.started > since).count();
                (done >= count).then_some(())
            },
            String::new,
        );
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One client: connect, send `attempt <n>`, read the answer, within [`ATTEMPT_TIMEOUT`].
async fn attempt(target: SocketAddr, n: u64) -> Outcome {
    let sent = format!("attempt {n}");
    let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, async {
        let mut stream = BufReader::new(TcpStream::connect(target).await?);
        ask(&mut stream, &sent).await
    });
    judge(answer.await, &sent)
}

/// One browser's request: `GET /attempt/<n>` with the broker's cookie `cookie`, within
/// [`ATTEMPT_TIMEOUT`]; wrong when the answer sets the cookie anew.
async fn page_attempt(target: SocketAddr, n: u64, cookie: &str) -> Outcome {
    let path = format!("/attempt/{n}");
    let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, fetch(target, &path, Some(cookie)));
    let page = judge_page(answer.await, &path);
    match page.set_cookie {
        Some(set) => Outcome::Wrong(format!("cookie set anew to {set}: {:?}", page.outcome)),
        None => page.outcome,
    }
}

/// Sends `sent` as a line on `stream` and reads one line back.
async fn ask(stream: &mut BufReader<TcpStream>, sent: &str) -> std::io::Result<String> {
    stream
        .get_mut()
        .write_all(format!("{sent}\n").as_bytes())
        .await?;
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    Ok(line)
}

/// What the answer to `sent` says: served by which server through which broker host, or
/// what went wrong.
fn judge(
    answer: Result<std::io::Result<String>, tokio::time::error::Elapsed>,
    sent: &str,
) -> Outcome {
    let line = match answer {
        Err(_) => return Outcome::Failed(format!("no answer within {ATTEMPT_TIMEOUT:?}")),
        Ok(Err(e)) => return Outcome::Failed(e.to_string()),
        Ok(Ok(line)) if line.is_empty() => {
            return Outcome::Failed("closed without an answer".to_owned());
        }
        Ok(Ok(line)) => line,
    };
    served(&line, &format!(": {sent}\n"), &SERVERS)
}

/// `Served` when `answer` is `<name> via <broker host's address><end>` and `name` one of
/// `servers`; `Wrong` otherwise.
fn served(answer: &str, end: &str, servers: &[(&str, u16)]) -> Outcome {
    let served = answer
        .strip_suffix(end)
        .and_then(|head| head.split_once(" via "))
        .and_then(|(server, via)| Some((server, via.parse::<Ipv4Addr>().ok()?)));
    match served {
        Some((server, via)) if servers.iter().any(|(s, _)| *s == server) => Outcome::Served {
            server: server.to_owned(),
            via,
        },
        _ => Outcome::Wrong(answer.to_owned()),
    }
}

/// What one request to the HTTP balancer got.
#[derive(Debug, Clone)]
pub struct Page {
    /// Which web server answered through which broker host, or what went wrong (a status
    /// other than 200 is a failure, its words the status).
    pub outcome: Outcome,
    /// The value of the broker's cookie in the answer's `Set-Cookie`, when it set one.
    pub set_cookie: Option<String>,
}

/// An HTTP answer as [`fetch`] read it.
struct Answer {
    status: StatusCode,
    /// The `Set-Cookie` line, if any.
    set_cookie: Option<String>,
    body: String,
}

/// One `GET path` on a new connection to `target`, `cookie` (a value of [`COOKIE_NAME`])
/// sent with it; `Err` says what went wrong.
async fn fetch(target: SocketAddr, path: &str, cookie: Option<&str>) -> Result<Answer, String> {
    let stream = TcpStream::connect(target).await.map_err(|e| words(&e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| words(&e))?;
    tokio::spawn(connection);
    let mut request = Request::get(path)
        .header(HOST, target.to_string())
        .header(CONNECTION, "close");
    if let Some(cookie) = cookie {
        request = request.header(COOKIE, format!("{COOKIE_NAME}={cookie}"));
    }
    let request = request.body(Empty::<Bytes>::new()).map_err(|e| words(&e))?;
    let response = sender.send_request(request).await.map_err(|e| words(&e))?;
    let status = response.status();
    let set_cookie = response
        .headers()
        .get(SET_COOKIE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| words(&e))?
        .to_bytes();
    Ok(Answer {
        status,
        set_cookie,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// An error and its causes, `: `-separated: hyper's own words (`connection error`) say little
/// without the I/O error beneath.
fn words(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(&format!(": {e}"));
        cause = e.source();
    }
    text
}

/// What the answer to `GET path` says: served by which web server through which broker host,
/// with which cookie set, or what went wrong. A `Set-Cookie` that is not the broker's cookie
/// as the broker writes it (`<id>.<22 base64url>; Path=/; HttpOnly; SameSite=Lax`) is wrong.
fn judge_page(
    answer: Result<Result<Answer, String>, tokio::time::error::Elapsed>,
    path: &str,
) -> Page {
    let failed = |why: String| Page {
        outcome: Outcome::Failed(why),
        set_cookie: None,
    };
    let Answer {
        status,
        set_cookie,
        body,
    } = match answer {
        Err(_) => return failed(format!("no answer within {ATTEMPT_TIMEOUT:?}")),
        Ok(Err(e)) => return failed(e),
        Ok(Ok(answer)) => answer,
    };
    if status != StatusCode::OK {
        return failed(format!("status {status}: {body}"));
    }
    let value = set_cookie.as_deref().map(|line| {
        line.strip_prefix(&format!("{COOKIE_NAME}="))
            .and_then(|rest| rest.strip_suffix("; Path=/; HttpOnly; SameSite=Lax"))
            .filter(|value| {
                value.split_once('.').is_some_and(|(id, random)| {
                    id.len() == 2
                        && random.len() == 22
                        && random
                            .bytes()
                            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
                })
            })
    });
    match value {
        Some(None) => Page {
            outcome: Outcome::Wrong(format!("Set-Cookie: {}", set_cookie.unwrap_or_default())),
            set_cookie: None,
        },
        value => Page {
            outcome: served(&body, &format!(": {path}"), &WEB_SERVERS),
            set_cookie: value.flatten().map(str::to_owned),
        },
    }
}

/// The `REMOTE_SERVER` id of the web server `name` in `[BALANCE_HTTP]` (`01`, `02`): what
/// the broker's cookie starts with.
pub fn web_server_id(name: &str) -> String {
    let index = WEB_SERVERS
        .iter()
        .position(|(s, _)| *s == name)
        .unwrap_or_else(|| panic!("no web server {name}"));
    format!("{:02}", index + 1)
}
