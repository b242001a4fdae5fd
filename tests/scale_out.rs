//! Several active brokers behind a front balancer, as docs/high-availability.md's scale-out
//! recipe sets them up: HAProxy (`mode tcp`, `send-proxy-v2`, `check`) in front of two
//! appbroker processes with `PROXY_PROTOCOL=1` and one `SESSION_SECRET`, in front of two TCP
//! servers and two web servers. A TCP client's own address is in the log of each broker its
//! connections land on; an HTTP session whose requests alternate between the brokers stays on
//! its server and is never given a new cookie; with one broker killed, HAProxy's check sends
//! new connections and the session's next requests to the other, the session intact, and a
//! connection open through the killed broker is cut while one through the other goes on. And
//! contrib/ctl-all, which does an operator's `appbroker ctl` on every broker, through a
//! stand-in `ssh` that runs it here.
//!
//! The HAProxy test needs haproxy: `#[ignore]`d with that, run by `.ci/run` (which installs
//! it), failing under `CI` when it is missing.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use harness::*;
use tokio::net::TcpStream;

/// One broker's file: a TCP balancer on `@PORT@` over `servers`, an HTTP balancer on
/// `@PORT2@` over `origins`, both behind the front balancer's PROXY protocol, and the secret
/// every broker of the fleet shares.
fn broker_ini(servers: &[&TestServer], origins: &[&Origin]) -> String {
    let servers = servers.iter().map(|s| s.ini());
    let origins = origins.iter().map(|o| server_value(o.addr));
    Ini::new()
        .general(&session_secret_line())
        .general("PROXY_PROTOCOL=1")
        .balancer("BALANCE_SMART_CLIENT_DESKTOP", "@PORT@", "", servers)
        .balancer("BALANCE_HTTP", "@PORT2@", "", origins)
        .text()
}

/// HAProxy in the foreground on a configuration of its own; killed when dropped.
struct FrontBalancer {
    child: Child,
    /// Where TCP clients connect: spread over the brokers' TCP balancers.
    tcp: SocketAddr,
    /// Where browsers connect: spread over the brokers' HTTP balancers.
    http: SocketAddr,
    _dir: tempfile::TempDir,
}

impl FrontBalancer {
    /// The recipe's configuration (docs/high-availability.md), its checks made fast for a
    /// test: each broker checked every 200 ms, out after one failure.
    fn config(tcp: SocketAddr, http: SocketAddr, brokers: &[&Broker]) -> String {
        let mut text = String::from(
            "global\n    maxconn 256\n\
             defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    \
             timeout server 30s\n    retries 2\n    option redispatch\n",
        );
        for (name, bind, port_of) in [
            ("tcp", tcp, Broker::addr as fn(&Broker) -> SocketAddr),
            ("http", http, Broker::addr2),
        ] {
            text.push_str(&format!(
                "frontend {name}_front\n    bind {bind}\n    default_backend {name}_brokers\n\
                 backend {name}_brokers\n    balance roundrobin\n"
            ));
            for (i, broker) in brokers.iter().enumerate() {
                text.push_str(&format!(
                    "    server broker{i} {} send-proxy-v2 check inter 200ms fall 1 rise 1\n",
                    port_of(broker)
                ));
            }
        }
        text
    }

    /// Starts `haproxy` in front of `brokers` and waits until it takes connections.
    async fn start(haproxy: &PathBuf, brokers: &[&Broker]) -> FrontBalancer {
        let dir = tempfile::tempdir().unwrap();
        let tcp = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, FrontBalancer::config(tcp, http, brokers)).unwrap();
        let checked = Command::new(haproxy)
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output();
        let checked = checked.expect("run haproxy -c");
        assert!(
            checked.status.success(),
            "haproxy refuses its configuration: {}",
            String::from_utf8_lossy(&checked.stderr)
        );
        let child = Command::new(haproxy)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy");
        let front = FrontBalancer {
            child,
            tcp,
            http,
            _dir: dir,
        };
        within("haproxy's ports", async {
            while TcpStream::connect(tcp).await.is_err() || TcpStream::connect(http).await.is_err()
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
        front
    }
}

impl Drop for FrontBalancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One page through the front balancer, fetched on a connection of its own so that round
/// robin alternates the brokers: its status line and the broker's cookie it set, if any.
struct Page {
    status: String,
    set_cookie: Option<String>,
}

/// GETs `path` through `front` with `cookie`, on a new connection.
async fn get(front: SocketAddr, path: &str, cookie: Option<&str>) -> Page {
    let cookie = cookie
        .map(|c| format!("Cookie: TOTVS_BROKER_SH_001={c}\r\n"))
        .unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: app\r\n{cookie}Connection: close\r\n\r\n");
    let answer = within("an answer", raw_exchange(front, request.as_bytes())).await;
    let status = answer.lines().next().unwrap_or_default().to_string();
    let set_cookie = answer
        .lines()
        .take_while(|line| !line.is_empty())
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            if !name.eq_ignore_ascii_case("set-cookie") {
                return None;
            }
            let value = value.trim().strip_prefix("TOTVS_BROKER_SH_001=")?;
            Some(value.split(';').next().unwrap_or_default().to_string())
        });
    Page { status, set_cookie }
}

/// Which of `origins` saw a request for `path`.
fn served_by(origins: &[&Origin], path: &str) -> Vec<usize> {
    (0..origins.len())
        .filter(|&i| origins[i].seen().iter().any(|seen| seen.target == path))
        .collect()
}

/// Which of `brokers` logged the request for `path`.
fn relayed_by(brokers: &[&Broker], path: &str) -> Vec<usize> {
    let needle = format!("path={path} ");
    (0..brokers.len())
        .filter(|&i| brokers[i].has_log(&needle))
        .collect()
}

/// Sends a line through the front balancer's TCP port and closes; the client's own address.
async fn tcp_client(front: SocketAddr) -> SocketAddr {
    let mut stream = TcpStream::connect(front).await.unwrap();
    let local = stream.local_addr().unwrap();
    within("the server's echo", exchange(&mut stream, "hello"))
        .await
        .expect("an echo through the front balancer");
    local
}

/// Which of `brokers` logged a connection of `client`.
fn logged_client(brokers: &[&Broker], client: SocketAddr) -> Vec<usize> {
    let needle = format!("client={client} ");
    (0..brokers.len())
        .filter(|&i| {
            brokers[i]
                .logs()
                .iter()
                .any(|line| line.contains(&needle) || line.ends_with(&format!("client={client}")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs haproxy"]
async fn brokers_behind_haproxy_share_clients_and_sessions() {
    let Some(haproxy) = find_program("haproxy") else {
        return;
    };
    let (s1, s2) = (TestServer::start("s1").await, TestServer::start("s2").await);
    let (w1, w2) = (Origin::start().await, Origin::start().await);
    let origins = [&w1, &w2];
    let ini = broker_ini(&[&s1, &s2], &origins);
    let (a, mut b) = (Broker::start(&ini).await, Broker::start(&ini).await);
    let front = FrontBalancer::start(&haproxy, &[&a, &b]).await;

    // TCP: the client's own address, as it sees it, in the log of whichever broker took
    // each of its connections; round robin lands them on both.
    let mut landed = [false, false];
    for _ in 0..6 {
        let client = tcp_client(front.tcp).await;
        let brokers = [&a, &b];
        eventually("the connection's line in a broker's log", || {
            logged_client(&brokers, client).len() == 1
        })
        .await;
        landed[logged_client(&brokers, client)[0]] = true;
    }
    assert_eq!(landed, [true, true], "connections landed on both brokers");

    // HTTP: the first answer gives the cookie; its requests, alternating between the
    // brokers, stay on its server and are given no new cookie.
    let first = get(front.http, "/session/0", None).await;
    assert!(first.status.contains(" 200"), "{}", first.status);
    let cookie = first.set_cookie.expect("the first answer sets the cookie");
    let home = served_by(&origins, "/session/0");
    assert_eq!(home.len(), 1);
    let mut via = [0usize; 2];
    for i in 1..=8 {
        let path = format!("/session/{i}");
        let page = get(front.http, &path, Some(&cookie)).await;
        assert!(page.status.contains(" 200"), "{path}: {}", page.status);
        assert_eq!(page.set_cookie, None, "{path}: a new cookie");
        assert_eq!(served_by(&origins, &path), home, "{path} left its server");
        eventually("the request's line", || {
            relayed_by(&[&a, &b], &path).len() == 1
        })
        .await;
        via[relayed_by(&[&a, &b], &path)[0]] += 1;
    }
    assert!(
        via[0] > 0 && via[1] > 0,
        "requests through both brokers: {via:?}"
    );

    // One broker killed: HAProxy's check takes it out, and new connections and the
    // session's requests go to the other, the session intact.
    // Two connections held through the front balancer, one on each broker (round robin):
    // the one through the killed broker is cut, the other goes on.
    let (mut held, _) = hold(front.tcp).await;
    let (mut other, _) = hold(front.tcp).await;
    kill_tree(&mut b.child);
    eventually("the connection through the killed broker cut", || {
        ended_stream(&held) || ended_stream(&other)
    })
    .await;
    if ended_stream(&held) {
        std::mem::swap(&mut held, &mut other);
    }
    assert!(!ended_stream(&held), "both held connections were cut");
    let survivor = held.local_addr().unwrap();
    within("the survivor's echo", exchange(&mut held, "still here"))
        .await
        .expect("the connection through the surviving broker goes on");
    drop(held);
    eventually("the held connection's line in the survivor's log", || {
        logged_client(&[&a], survivor) == [0]
    })
    .await;
    let mut n = 100;
    let mut in_a_row = 0;
    within("every request through the surviving broker", async {
        while in_a_row < 6 {
            n += 1;
            let path = format!("/session/{n}");
            let page = get(front.http, &path, Some(&cookie)).await;
            if page.status.contains(" 200") {
                assert_eq!(page.set_cookie, None, "{path}: a new cookie");
                assert_eq!(served_by(&origins, &path), home, "{path} left its server");
                assert_eq!(relayed_by(&[&a, &b], &path), [0]);
                in_a_row += 1;
            } else {
                in_a_row = 0; // sent to the dead broker before the check saw it go
            }
        }
    })
    .await;
    for _ in 0..4 {
        let client = tcp_client(front.tcp).await;
        eventually("the connection's line in the survivor's log", || {
            logged_client(&[&a], client) == [0]
        })
        .await;
    }
}

/// A stand-in for `ssh` that runs the remote command on this machine, in the directory of
/// the broker named by the host (`$FLEET/hosts/HOST`, a link to it), so that `appbroker ctl`
/// there finds that broker's `appserver.ini` and control socket. It records its arguments,
/// and refuses a host that has no directory as ssh does (exit 255).
const FAKE_SSH: &str = r#"#!/bin/sh
echo "$*" >> "$FLEET/ssh-arguments"
while [ $# -gt 0 ]; do
    case "$1" in -n) shift ;; -o) shift 2 ;; *) break ;; esac
done
host=$1; shift
if [ ! -d "$FLEET/hosts/$host" ]; then
    echo "ssh: connect to host $host port 22: Connection refused" >&2
    exit 255
fi
cd "$FLEET/hosts/$host" || exit 255
RUNTIME_DIRECTORY=$PWD STATE_DIRECTORY=$PWD exec sh -c "$*"
"#;

/// A directory standing for a fleet of broker hosts: `bin/ssh` ([`FAKE_SSH`]) and a link per
/// host to its broker's directory.
fn fleet(hosts: &[(&str, &Broker)]) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let fleet = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(fleet.path().join("bin")).unwrap();
    std::fs::create_dir_all(fleet.path().join("hosts")).unwrap();
    let ssh = fleet.path().join("bin/ssh");
    std::fs::write(&ssh, FAKE_SSH).unwrap();
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (host, broker) in hosts {
        std::os::unix::fs::symlink(broker.dir.path(), fleet.path().join("hosts").join(host))
            .unwrap();
    }
    fleet
}

/// Runs contrib/ctl-all with `args` over `fleet`: (exit code, standard output, standard error).
fn ctl_all(fleet: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/ctl-all");
    let path = std::env::var("PATH").unwrap_or_default();
    let mut command = Command::new("sh");
    command
        .arg(script)
        .args(args)
        .env("PATH", format!("{}:{path}", fleet.join("bin").display()))
        .env("FLEET", fleet)
        .env("APPBROKER_CTL", format!("{} ctl", binary()));
    run_bounded(command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_all_runs_one_command_on_every_broker_and_reports_each() {
    let (s1, s2) = (TestServer::start("s1").await, TestServer::start("s2").await);
    let ini = ini_for(&[&s1, &s2], "");
    let (a, b) = (Broker::start(&ini).await, Broker::start(&ini).await);
    let fleet = fleet(&[("a", &a), ("b", &b)]);

    let (code, out, err) = ctl_all(
        fleet.path(),
        &[
            "a",
            "b",
            "--",
            "disable",
            "BALANCE_SMART_CLIENT_DESKTOP",
            "01",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("== a: exit 0") && out.contains("== b: exit 0"),
        "{out}"
    );
    let arguments = std::fs::read_to_string(fleet.path().join("ssh-arguments")).unwrap();
    assert!(
        arguments.contains("BatchMode=yes") && arguments.contains("ConnectTimeout=5"),
        "{arguments}"
    );
    // Each broker was told: a client through either goes to the other server.
    for broker in [&a, &b] {
        for _ in 0..3 {
            assert_eq!(ask(broker.addr()).await.unwrap(), "s2");
        }
    }

    // A host list from a file, one host down: the others are done, each answer reported,
    // and the exit says that one failed.
    let hosts = fleet.path().join("brokers");
    std::fs::write(&hosts, "# the fleet\na\n\ngone\nb\n").unwrap();
    let hosts = hosts.display().to_string();
    let (code, out, err) = ctl_all(
        fleet.path(),
        &[
            "-f",
            &hosts,
            "--",
            "enable",
            "BALANCE_SMART_CLIENT_DESKTOP",
            "01",
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("== a: exit 0") && out.contains("== b: exit 0"),
        "{out}"
    );
    assert!(
        out.contains("== gone: exit 255") && out.contains("Connection refused"),
        "{out}"
    );
    for broker in [&a, &b] {
        let answers = ask_many(broker.addr(), 4).await;
        assert!(answers.iter().any(|name| name == "s1"), "{answers:?}");
    }

    // A refusal on one host is that host's exit code, its reason printed under it.
    let (code, out, _) = ctl_all(fleet.path(), &["a", "--", "disable", "NO_SUCH", "01"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("== a: exit ") && !out.contains("== a: exit 0"),
        "{out}"
    );
}
