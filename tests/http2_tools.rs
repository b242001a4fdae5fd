//! HTTP/2 through the broker with clients no one here wrote: curl `--http2` (ALPN `h2`, its
//! cookie jar keeping 20 requests on one server), `nghttp` and `h2load` (Debian's
//! nghttp2-client), Chromium loading the demo's page, script and WebSocket over HTTP/2 (and
//! over HTTP/1.1 with `HTTP2=0`), and hostile clients driven by Python's `h2` package
//! (tests/http2_hostile.py: CONTINUATION flood, oversized headers, malformed pseudo-headers,
//! DATA after `END_STREAM`, PING and SETTINGS floods) while curl is served meanwhile. Each
//! needs its tool: missing, the test is skipped, and fails under `CI` ([`find_program`]).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use harness::*;

/// The most one tool's run may take: longer, it hung (killed).
const TOOL_DEADLINE: Duration = Duration::from_secs(60);

/// A certificate for `localhost` and 127.0.0.1, and the section lines that serve it.
struct Tls {
    dir: tempfile::TempDir,
    lines: String,
}

impl Tls {
    fn new() -> Tls {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let params = rcgen::CertificateParams::new(names).unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.path().join("broker.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("broker.key"), key.serialize_pem()).unwrap();
        let lines = format!(
            "SSL_CERTIFICATE={0}/broker.pem\nSSL_KEY={0}/broker.key\n",
            dir.path().display()
        );
        Tls { dir, lines }
    }

    fn pem(&self) -> PathBuf {
        self.dir.path().join("broker.pem")
    }

    /// An HTTP balancer on `@PORT@` with this certificate, `extra` lines, and `servers`.
    fn ini(&self, extra: &str, servers: &[SocketAddr]) -> String {
        http_ini(servers, &format!("{}{extra}", self.lines))
    }
}

/// Runs `program` with `args` to its end, within [`TOOL_DEADLINE`]: its exit code, standard
/// output and error.
async fn run(program: &Path, args: &[String]) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(TOOL_DEADLINE, command.output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} hung; killed", program.display()))
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// curl over HTTP/2 to `path` on the broker at `addr`, trusting `pem`, with `more` switches:
/// its output (the `-w` line last).
async fn curl(curl: &Path, pem: &Path, addr: SocketAddr, path: &str, more: &[&str]) -> String {
    let port = addr.port();
    let mut args: Vec<String> = [
        "-sS",
        "--http2",
        "--max-time",
        "20",
        "--cacert",
        &pem.display().to_string(),
        "--resolve",
        &format!("localhost:{port}:127.0.0.1"),
        "-w",
        "\n%{http_version} %{http_code}",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    args.extend(more.iter().map(ToString::to_string));
    args.push(format!("https://localhost:{port}{path}"));
    let (code, out, err) = run(curl, &args).await;
    assert_eq!(code, 0, "curl {args:?}: {err}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl"]
async fn curl_speaks_h2_and_its_cookie_jar_keeps_twenty_requests_on_one_server() {
    let Some(program) = find_program("curl") else {
        return;
    };
    let tls = Tls::new();
    let (one, two) = (Origin::start().await, Origin::start().await);
    let broker = InProcess::start(&tls.ini("", &[one.addr, two.addr])).await;
    let jar = tls.dir.path().join("cookies.txt");
    let jar = jar.display().to_string();
    for i in 0..20 {
        let path = format!("/page/{i}");
        let out = curl(
            &program,
            &tls.pem(),
            broker.addr(),
            &path,
            &["-b", &jar, "-c", &jar],
        )
        .await;
        assert!(out.ends_with("\n2 200"), "HTTP/2 and a 200: {out:?}");
    }
    let (a, b) = (
        one.seen.lock().unwrap().len(),
        two.seen.lock().unwrap().len(),
    );
    assert!(
        (a, b) == (20, 0) || (a, b) == (0, 20),
        "all 20 on the server the cookie names: {a} and {b}"
    );
    // Without the jar, HTTP/1.1 still: the broker offers both.
    let old = curl(&program, &tls.pem(), broker.addr(), "/old", &["--http1.1"]).await;
    assert!(old.ends_with("\n1.1 200"), "{old:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nghttp2-client"]
async fn nghttp_and_h2load_are_served_whole() {
    let (Some(nghttp), Some(h2load)) = (find_program("nghttp"), find_program("h2load")) else {
        return;
    };
    let tls = Tls::new();
    let origin = Origin::start().await;
    let broker = InProcess::start(&tls.ini("", &[origin.addr])).await;
    let base = format!("https://127.0.0.1:{}", broker.addr().port());
    // nghttp: three streams on one connection, a body up, the answers' sizes as it read them.
    let upload = tls.dir.path().join("upload");
    std::fs::write(&upload, vec![b'u'; 100_000]).unwrap();
    let args: Vec<String> = vec![
        "-n".into(),
        "-s".into(),
        format!("{base}/bytes/300000"),
        format!("{base}/a"),
        format!("{base}/b"),
    ];
    let (code, out, err) = run(&nghttp, &args).await;
    assert_eq!(code, 0, "nghttp: {out}\n{err}");
    assert_eq!(out.matches(" 200 ").count(), 3, "three 200s:\n{out}");
    let args = vec![format!("-d{}", upload.display()), format!("{base}/posted")];
    let (code, out, err) = run(&nghttp, &args).await;
    assert_eq!(code, 0, "nghttp -d: {out}\n{err}");
    let posted = origin.seen.lock().unwrap().last().unwrap().body.len();
    assert_eq!(posted, 100_000);
    // h2load: 2000 requests, 4 connections of 16 streams each.
    let args: Vec<String> = ["-n", "2000", "-c", "4", "-m", "16", &format!("{base}/load")]
        .iter()
        .map(ToString::to_string)
        .collect();
    let (code, out, err) = run(&h2load, &args).await;
    assert_eq!(code, 0, "h2load: {out}\n{err}");
    assert!(out.contains("2000 succeeded, 0 failed, 0 errored"), "{out}");
    assert!(out.contains("status codes: 2000 2xx"), "{out}");
    assert!(out.contains("Application protocol: h2"), "{out}");
}

/// Requests one after another through curl until `stop`: each must be a 200 over HTTP/2
/// (the broker serves everyone else during an attack). How many were served.
fn bystander(
    pem: PathBuf,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    let program = find_program("curl").expect("curl");
    tokio::spawn(async move {
        let mut served = 0;
        while !stop.load(Ordering::SeqCst) || served == 0 {
            let out = curl(&program, &pem, addr, "/bystander", &[]).await;
            assert!(out.ends_with("\n2 200"), "a bystander served: {out:?}");
            served += 1;
        }
        served
    })
}

/// What tests/http2_hostile.py saw the broker do.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Outcome {
    goaway: Option<u32>,
    resets: std::collections::HashMap<String, u32>,
    statuses: std::collections::HashMap<String, u16>,
    closed: bool,
    sent: u64,
    blocked: bool,
    /// The malformed requests, each on a connection of its own.
    cases: std::collections::HashMap<String, Case>,
}

/// What the broker did to one malformed request, and to a good one sent after it.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Case {
    reset: Option<u32>,
    status: Option<u16>,
    goaway: Option<u32>,
    closed: bool,
    good: Option<u16>,
}

/// The targets of the attacker's requests that reached the origin (the bystanders' and the
/// last check's left out).
fn reached(origin: &Origin) -> Vec<String> {
    let seen = origin.seen.lock().unwrap();
    let attacker = seen
        .iter()
        .filter(|s| s.target != "/bystander" && s.target != "/after");
    attacker.map(|s| s.target.clone()).collect()
}

/// HTTP/2 error codes (RFC 9113 §7).
const PROTOCOL_ERROR: u32 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Runs `attack` of tests/http2_hostile.py against a broker of one origin while curl is served
/// meanwhile; what the attacker saw, and the origin (to say what reached it).
async fn attack(attack: &str) -> Option<(Outcome, Origin)> {
    let (Some(python), Some(_)) = (find_program("python3"), find_program("curl")) else {
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/http2_hostile.py");
    let has_h2 = run(
        &python,
        &["-c".into(), "import h2, hyperframe, hpack".into()],
    )
    .await;
    if has_h2.0 != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "Python's h2 package is missing (pip install h2): {}",
            has_h2.2
        );
        eprintln!("skipped: Python's h2 package is missing (pip install h2)");
        return None;
    }
    let tls = Tls::new();
    let origin = Origin::start().await;
    let broker = InProcess::start(&tls.ini("", &[origin.addr])).await;
    let stop = Arc::new(AtomicBool::new(false));
    let others = bystander(tls.pem(), broker.addr(), Arc::clone(&stop));
    let args = vec![
        script.display().to_string(),
        attack.to_string(),
        broker.addr().port().to_string(),
    ];
    let (code, out, err) = run(&python, &args).await;
    stop.store(true, Ordering::SeqCst);
    assert_eq!(code, 0, "{attack}: {out}\n{err}");
    let served = within("the bystander's last request", others)
        .await
        .unwrap();
    eprintln!("{attack}: {out} ({served} bystander requests served meanwhile)");
    // And after it, the broker serves a new connection at once.
    let program = find_program("curl").unwrap();
    let after = curl(&program, &tls.pem(), broker.addr(), "/after", &[]).await;
    assert!(after.ends_with("\n2 200"), "{after:?}");
    let outcome = serde_json::from_str(out.trim()).unwrap();
    Some((outcome, origin))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs python3 with h2, curl"]
async fn a_continuation_flood_is_cut_within_the_header_list_size() {
    let Some((seen, origin)) = attack("continuation").await else {
        return;
    };
    // The header list is bounded at 64 KiB: the broker ends the connection; what the flood
    // sent before it saw that is the 64 KiB and what the loopback's socket buffers took
    // meanwhile (a few MiB), far from the 64 MiB it would send.
    assert!(seen.sent < 16 * 1024 * 1024, "{seen:?}");
    assert!(
        seen.closed || seen.goaway.is_some() || !seen.resets.is_empty(),
        "{seen:?}"
    );
    assert!(
        !seen.statuses.contains_key("1") || seen.statuses["1"] == 431,
        "{seen:?}"
    );
    assert_eq!(reached(&origin), [] as [&str; 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs python3 with h2, curl"]
async fn an_oversized_header_is_refused_and_the_connection_serves_on() {
    let Some((seen, origin)) = attack("oversized").await else {
        return;
    };
    let refused = seen.resets.contains_key("1") || seen.statuses.get("1") == Some(&431);
    assert!(refused, "{seen:?}");
    assert_eq!(seen.statuses.get("3"), Some(&200), "{seen:?}");
    assert_eq!(
        reached(&origin),
        ["/next"],
        "the big request reached no server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs python3 with h2, curl"]
async fn malformed_pseudo_headers_and_fields_are_stream_errors_and_reach_no_server() {
    let Some((seen, origin)) = attack("pseudo").await else {
        return;
    };
    assert_eq!(seen.cases.len(), 10, "{seen:?}");
    for (name, case) in &seen.cases {
        // RFC 9113 §8.1.1: a malformed request is a stream error (PROTOCOL_ERROR), which the
        // `h2` crate makes a connection error for some (its choice, which §5.4.1 allows):
        // either way, refused, and the connection serves on when only the stream was.
        let stream_error = case.reset == Some(PROTOCOL_ERROR) || case.status == Some(400);
        let connection_error = case.goaway == Some(PROTOCOL_ERROR) || case.closed;
        assert!(stream_error || connection_error, "{name}: {case:?}");
        if !connection_error {
            assert_eq!(
                case.good,
                Some(200),
                "{name}: the connection serves on: {case:?}"
            );
        }
    }
    let reached = reached(&origin);
    assert!(reached.iter().all(|t| t == "/good"), "{reached:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs python3 with h2, curl"]
async fn data_after_end_stream_is_refused() {
    let Some((seen, _origin)) = attack("data_after_end").await else {
        return;
    };
    // RFC 9113 §5.1: DATA on a half-closed (remote) stream is STREAM_CLOSED, a stream error
    // or a connection error at the receiver's choice.
    assert!(
        seen.goaway.is_some() || seen.resets.contains_key("1"),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs python3 with h2, curl"]
async fn a_ping_flood_is_held_back_or_cut() {
    let Some((seen, _origin)) = attack("ping").await else {
        return;
    };
    // The broker stops reading a client that reads none of its answers (its acks wait for
    // the socket), or ends the connection: it never queues 256 MiB of acks.
    assert!(
        seen.blocked || seen.closed || seen.goaway.is_some(),
        "{seen:?}"
    );
    assert!(
        seen.goaway.is_none_or(|code| code == ENHANCE_YOUR_CALM),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs python3 with h2, curl"]
async fn a_settings_flood_is_held_back_or_cut() {
    let Some((seen, _origin)) = attack("settings").await else {
        return;
    };
    assert!(
        seen.blocked || seen.closed || seen.goaway.is_some(),
        "{seen:?}"
    );
}

/// The count in `metrics` of the client connections of `protocol` since start.
fn connections_of(metrics: &str, protocol: &str) -> u64 {
    let wanted = format!(
        "appbroker_http_protocol_connections_total{{balancer=\"BALANCE_HTTP\",protocol=\"{protocol}\"}} "
    );
    let line = metrics.lines().find(|l| l.starts_with(&wanted));
    let line = line.unwrap_or_else(|| panic!("{wanted} in:\n{metrics}"));
    line[wanted.len()..].trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium, curl"]
async fn chromium_loads_the_page_its_script_and_its_websocket_over_one_h2_connection() {
    use appbroker::demo::web::Resource;
    let (Some(binary), Some(curl_program)) = (find_chromium(), find_program("curl")) else {
        return;
    };
    // Offered, the browser takes HTTP/2 for all three; with HTTP2=0, HTTP/1.1 for all three.
    for (extra, protocol, other) in [("", "h2", "http/1.1"), ("HTTP2=0\n", "http/1.1", "h2")] {
        let servers = web_stand_ins().await;
        let tls = Tls::new();
        let addresses = [servers[0].address, servers[1].address];
        let broker = InProcess::start(&tls.ini(extra, &addresses)).await;
        let profile = tempfile::tempdir().unwrap();
        let url = format!("https://localhost:{}/", broker.addr().port());
        let trust = ["--ignore-certificate-errors"];
        let mut browser = DevTools::open_with(&binary, profile.path(), &url, &trust).await;
        let echoed = |t: &str| t.contains("holds this WebSocket; echo: hello from the browser");
        let shown = browser.text_until("the WebSocket's echo", echoed).await;
        let navigation = "performance.getEntriesByType('navigation')[0].nextHopProtocol";
        assert_eq!(browser.evaluate(navigation).await, protocol, "{shown}");
        let script = "performance.getEntriesByType('resource')\
                      .filter(r => r.name.endsWith('.js')).map(r => r.nextHopProtocol)[0]";
        assert_eq!(browser.evaluate(script).await, protocol, "{shown}");
        // The WebSocket too: no connection of the other protocol was ever opened (curl reads
        // the figures over HTTP/2 when it is offered, over HTTP/1.1 when not).
        let metrics = curl(
            &curl_program,
            &tls.pem(),
            broker.addr(),
            "/TOTVS_BROKER_QUERY/METRICS",
            &[],
        )
        .await;
        assert_eq!(connections_of(&metrics, other), 0, "{protocol}: {metrics}");
        assert!(connections_of(&metrics, protocol) >= 1, "{metrics}");
        // Page, script and WebSocket, each on the server the cookie names.
        let served: Vec<Vec<Resource>> = servers
            .iter()
            .map(|s| {
                s.record()
                    .unwrap()
                    .served()
                    .iter()
                    .map(|r| r.resource)
                    .collect()
            })
            .collect();
        let (held, idle) = if served[0].is_empty() { (1, 0) } else { (0, 1) };
        for wanted in [Resource::Page, Resource::Script, Resource::WebSocket] {
            assert!(served[held].contains(&wanted), "{protocol}: {served:?}");
        }
        assert!(served[idle].is_empty(), "{protocol}: {served:?}");
    }
}
