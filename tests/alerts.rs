//! Alerts and restarts through the real binary, on loopback: a quarantine entered and left POSTed
//! to a webhook receiver of the test's own in JSON and in text, over HTTP and HTTPS (an rcgen CA);
//! a receiver that hangs, refuses or fails delays no client and no reload, and is logged once; an
//! attempt cut at `ALERT_TIMEOUT` and retried; no server available and back, with the counts;
//! `broker_stopping` delivered before the broker ends; an operator's action with who took it; the
//! queue's bound and `alerts_dropped`; the daily certificate check's `certificate_expiring`;
//! `ALERT_COMMAND` with the event on its standard input and its variables, without the broker's
//! own, at most four at once; secrets in no output; and `RESTART_COMMAND`: once per cooldown, once
//! for an AppServer two balancers list, for an HTTP server the response timeouts quarantined,
//! never for an operator's quarantine nor while every server is down, one exiting non-zero
//! logged with its exit code and counted as `failed`, killed at its timeout, at most the parallel
//! limit at once, held back by `RESTART_ONLY_WITH_ADDRESS`, shown on the page, the JSON and `ctl
//! show`, and run by hand with `ctl restart`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use appbroker::balancer::events::Event;
use appbroker::balancer::rules::overrides::{Hold, Mode};
use harness::*;

/// A TCP balancer section on `port` (a placeholder) over `servers` (ids 01, 02...), checked
/// by the monitor every 100 ms, with `extra` lines.
fn section(name: &str, port: &str, servers: &[&TestServer], extra: &str) -> String {
    let mut text = format!(
        "[{name}]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT={port}\n\
         QUERY_ALLOW=127.0.0.1\nMONITOR_INTERVAL=100ms\n{extra}\n"
    );
    for (i, s) in servers.iter().enumerate() {
        text.push_str(&format!("REMOTE_SERVER_{:02}={}\n", i + 1, s.ini()));
    }
    text
}

/// One balancer on `@PORT@` over `servers`, `general` lines in `[General]`.
fn one(general: &str, servers: &[&TestServer], extra: &str) -> String {
    format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n{general}\n{}",
        section("BALANCE_SMART_CLIENT_DESKTOP", "@PORT@", servers, extra)
    )
}

/// `appbroker ARGS --config <the broker's file>` with the broker's directories, run to its
/// end: (exit code, stdout, stderr).
async fn cli(broker: &Broker, args: &[&str]) -> (i32, String, String) {
    let mut command = std::process::Command::new(binary());
    command.args(args).arg("--config").arg(&broker.config_path);
    own_admin_dirs(&mut command, broker.dir.path());
    tokio::task::spawn_blocking(move || run_bounded(command))
        .await
        .unwrap()
}

/// The lines of `file` in the broker's directory (none while it does not exist).
fn lines_of(broker: &Broker, file: &str) -> Vec<String> {
    std::fs::read_to_string(broker.dir.path().join(file))
        .map(|t| t.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The value of `series` (a METRICS family with its labels) on the broker's METRICS, 0 when
/// it is not there.
async fn metric(broker: &Broker, series: &str) -> f64 {
    let metrics = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/METRICS", &[])
        .await
        .text();
    let prefix = format!("{series} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0.0)
}

/// `at` and `until` are RFC 3339 with an offset.
fn assert_rfc3339(value: &serde_json::Value) {
    let text = value.as_str().unwrap_or_else(|| panic!("{value} is text"));
    assert!(
        chrono::DateTime::parse_from_rfc3339(text).is_ok(),
        "{text} is RFC 3339"
    );
}

#[tokio::test]
async fn a_quarantine_and_its_end_are_posted_as_json_and_as_text() {
    let json = WebhookReceiver::start().await;
    let text = WebhookReceiver::start().await;
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n{}{}",
        section(
            "BALANCE_SMART_CLIENT_DESKTOP",
            "@PORT@",
            &[&a, &b],
            &format!(
                "ALERT_WEBHOOK=http://127.0.0.1:{}/hooks/json?token=abc",
                json.addr.port()
            )
        ),
        section(
            "BALANCE_WEB_SERVICES",
            "@PORT2@",
            &[&a, &b],
            &format!(
                "ALERT_WEBHOOK=http://127.0.0.1:{}/hooks/text\nALERT_WEBHOOK_FORMAT=text\n\
                 ALERT_EVENTS=quarantine_entered, quarantine_left",
                text.addr.port()
            )
        ),
    );
    let broker = Broker::start(&ini).await;
    let started = json.wait_for("broker_started").await;
    assert_eq!(started["balancer"], "", "{started}");
    assert_eq!(started["broker"], appbroker::alerts::host_name().as_str());
    assert_rfc3339(&started["at"]);

    a.stop().await;
    let entered = json.wait_for("quarantine_entered").await;
    assert_eq!(
        entered["balancer"], "BALANCE_SMART_CLIENT_DESKTOP",
        "{entered}"
    );
    assert_eq!(entered["server"], a.address().as_str());
    assert_eq!(entered["id"], "01");
    assert!(
        entered["reason"].as_str().unwrap().starts_with("monitor: "),
        "{entered}"
    );
    assert_rfc3339(&entered["until"]);
    let line = text.wait_for_text("in quarantine until").await;
    let host = appbroker::alerts::host_name();
    assert!(
        line.starts_with(&format!(
            "appbroker@{host}: [BALANCE_WEB_SERVICES] server {} (01) in quarantine until",
            a.address()
        )),
        "{line}"
    );

    a.resume().await;
    let left = json.wait_for("quarantine_left").await;
    assert_eq!(left["reason"], "monitor check passed", "{left}");
    let line = text.wait_for_text("out of quarantine").await;
    assert!(line.ends_with("(monitor check passed)"), "{line}");

    let posted = json.posted();
    assert!(posted.iter().all(|p| p.target == "/hooks/json?token=abc"));
    assert!(posted.iter().all(|p| p.content_type == "application/json"));
    assert!(
        posted
            .iter()
            .all(|p| p.body["balancer"] != "BALANCE_WEB_SERVICES"),
        "each balancer's alerts go to its own receiver"
    );
    assert!(
        text.posted().iter().all(|p| p.body["text"].is_string()),
        "ALERT_EVENTS keeps broker_started from the text receiver"
    );
    assert!(
        !broker.log_text().contains("token=abc"),
        "{}",
        broker.log_text()
    );
}

#[tokio::test]
async fn the_daily_certificate_check_sends_certificate_expiring() {
    use rcgen::{CertificateParams, KeyPair};
    let receiver = WebhookReceiver::start().await;
    let server = TestServer::start("a").await;
    // An expired certificate: a warning at start, never a refusal; the daily check says so.
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 15);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let files = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (files.path().join("b.pem"), files.path().join("b.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let extra = format!(
        "MONITORING_TYPE=DISABLED\nSSL_CERTIFICATE={}\nSSL_KEY={}\nALERT_WEBHOOK=http://127.0.0.1:{}/",
        cert_path.display(),
        key_path.display(),
        receiver.addr.port()
    );
    let broker = InProcess::start(&one("", &[&server], &extra)).await;
    receiver.wait_for("broker_started").await;
    let balancers = broker.broker.control().balancers();
    appbroker::broker::check_certificate(&balancers[0], std::time::SystemTime::now());
    let expiring = receiver.wait_for("certificate_expiring").await;
    assert_eq!(
        expiring["balancer"], "BALANCE_SMART_CLIENT_DESKTOP",
        "{expiring}"
    );
    assert!(
        expiring["reason"].as_str().unwrap().contains("expired"),
        "{expiring}"
    );
    // 2021-01-14 or 15, by the offset of the local time.
    assert_rfc3339(&expiring["until"]);
    assert!(
        expiring["until"].as_str().unwrap().starts_with("2021-01-1"),
        "{expiring}"
    );
}

/// A CA, and a server configuration for `localhost` and 127.0.0.1 issued by it.
fn tls_receiver_config() -> (String, tokio_rustls::TlsAcceptor) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ca = CertifiedIssuer::self_signed(params, ca_key).unwrap();
    let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(appbroker::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    (ca.pem(), tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[tokio::test]
async fn no_server_available_and_back_say_how_many_and_a_stopping_broker_says_so() {
    let receiver = WebhookReceiver::start().await;
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let extra = format!("ALERT_WEBHOOK=http://127.0.0.1:{}/", receiver.addr.port());
    let mut broker = Broker::start(&one("", &[&a, &b], &extra)).await;
    receiver.wait_for("broker_started").await;
    a.stop().await;
    b.stop().await;
    let none = receiver.wait_for("no_servers_available").await;
    assert_eq!(none["balancer"], "BALANCE_SMART_CLIENT_DESKTOP", "{none}");
    assert_eq!(
        (none["available"].as_u64(), none["total"].as_u64()),
        (Some(0), Some(2)),
        "{none}"
    );
    assert!(none.get("server").is_none(), "{none}");
    b.resume().await;
    let again = receiver.wait_for("servers_available_again").await;
    assert_eq!(
        (again["available"].as_u64(), again["total"].as_u64()),
        (Some(1), Some(2)),
        "{again}"
    );
    // SIGTERM: the drain starts with broker_stopping, delivered before the broker ends.
    broker.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(broker.wait_exit().await.success());
    let events = receiver.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("broker_stopping"),
        "{events:?}"
    );
    let stopping = receiver.wait_for("broker_stopping").await;
    assert_eq!(stopping["balancer"], "", "{stopping}");
    assert_rfc3339(&stopping["at"]);
}

#[tokio::test]
async fn an_https_webhook_is_verified_with_alert_webhook_ca_and_refused_without_it() {
    let (ca_pem, acceptor) = tls_receiver_config();
    let receiver = WebhookReceiver::start_tls(acceptor).await;
    let files = tempfile::tempdir().unwrap();
    let ca = files.path().join("alert-ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    let server = TestServer::start("a").await;
    let port = receiver.addr.port();
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n{}{}",
        section(
            "BALANCE_SMART_CLIENT_DESKTOP",
            "@PORT@",
            &[&server],
            &format!(
                "ALERT_WEBHOOK=https://localhost:{port}/trusted\nALERT_WEBHOOK_CA={}",
                ca.display()
            )
        ),
        // The system's roots do not know the test's CA.
        section(
            "BALANCE_WEB_SERVICES",
            "@PORT2@",
            &[&server],
            &format!("ALERT_WEBHOOK=https://127.0.0.1:{port}/untrusted")
        ),
    );
    let broker = Broker::start(&ini).await;
    receiver.wait_for("broker_started").await;
    let line = broker
        .wait_for_log(&format!(
            "webhook https://127.0.0.1:{port} failed to take broker_started"
        ))
        .await;
    assert!(line.contains("TLS"), "{line}");
    assert!(!line.contains("untrusted"), "the path is not shown: {line}");
    let posted = receiver.posted();
    assert!(posted.iter().all(|p| p.target == "/trusted"), "{posted:?}");
    assert_eq!(posted[0].host, format!("localhost:{port}"));
}

#[tokio::test]
async fn a_receiver_that_hangs_delays_no_client_no_check_and_no_reload() {
    let receiver = WebhookReceiver::start().await;
    receiver.always(Reply::Hang);
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let extra = format!(
        "ALERT_WEBHOOK=http://127.0.0.1:{}/\nALERT_TIMEOUT=300s",
        receiver.addr.port()
    );
    let broker = Broker::start(&one("", &[&a, &b], &extra)).await;
    // broker_started hangs at the receiver, for ALERT_TIMEOUT (5 minutes): long past this test.
    eventually("the receiver holds broker_started", || {
        receiver.hanging.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    a.stop().await;
    broker
        .wait_for_log(&format!("putting server {} in quarantine", a.address()))
        .await;
    // A client is served while the receiver still holds the first alert.
    let answers = ask_many(broker.addr(), 4).await;
    assert!(answers.iter().all(|a| a == "b"), "{answers:?}");
    // The monitor goes on: the server's return is seen and logged.
    a.resume().await;
    broker
        .wait_for_log(&format!("releasing server {} from quarantine", a.address()))
        .await;
    // A reload is applied.
    let (code, stdout, stderr) = cli(&broker, &["ctl", "reload"]).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(
        receiver.hanging.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert_eq!(receiver.posted().len(), 1, "one alert at a time, in order");
    // Released, the receiver gets the rest in order.
    receiver.release();
    receiver.wait_for("quarantine_left").await;
    let events = receiver.events();
    let entered = events
        .iter()
        .position(|e| e == "quarantine_entered")
        .unwrap();
    let left = events.iter().position(|e| e == "quarantine_left").unwrap();
    assert!(
        events[0] == "broker_started" && entered < left,
        "{events:?}"
    );
}

#[tokio::test]
async fn a_receiver_that_refuses_delays_no_client() {
    // A port that refuses: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let extra = format!("ALERT_WEBHOOK=http://127.0.0.1:{port}/");
    let broker = Broker::start(&one("", &[&a, &b], &extra)).await;
    a.stop().await;
    broker
        .wait_for_log(&format!("putting server {} in quarantine", a.address()))
        .await;
    // Clients are served while broker_started is still tried (1 + 2 + 4 s of back-off).
    let answers = ask_many(broker.addr(), 4).await;
    assert!(answers.iter().all(|a| a == "b"), "{answers:?}");
    assert!(!broker.has_log("failed to take"), "{}", broker.log_text());
    broker
        .wait_for_log(&format!(
            "alerts: webhook http://127.0.0.1:{port} failed to take"
        ))
        .await;
    assert_eq!(
        broker.count_logs("failed to take"),
        1,
        "{}",
        broker.log_text()
    );
}

#[tokio::test]
async fn a_failing_receiver_is_retried_and_logged_once_per_episode() {
    let receiver = WebhookReceiver::start().await;
    // The first attempt fails with 503 and is retried a second later.
    receiver.then(&[Reply::Status(503)]);
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let extra = format!("ALERT_WEBHOOK=http://127.0.0.1:{}/", receiver.addr.port());
    let broker = Broker::start(&one("", &[&a, &b], &extra)).await;
    receiver.wait_for("broker_started").await;
    eventually("broker_started posted twice", || {
        receiver.posted().len() == 2
    })
    .await;
    assert_eq!(receiver.events(), ["broker_started", "broker_started"]);
    assert!(
        !broker.has_log("failed to take"),
        "a retry that succeeds is no failure"
    );
    // Refused (400: not worth a retry), alert after alert.
    receiver.always(Reply::Status(400));
    a.stop().await;
    receiver.wait_for("quarantine_entered").await;
    a.resume().await;
    receiver.wait_for("quarantine_left").await;
    let name = format!("webhook http://127.0.0.1:{}", receiver.addr.port());
    broker
        .wait_for_log(&format!("alerts: {name} failed to take"))
        .await;
    assert_eq!(
        broker.count_logs("failed to take"),
        1,
        "{}",
        broker.log_text()
    );
    // Counted: the broker's own with an empty balancer, the balancer's with its name.
    let series = |balancer: &str, event: &str, outcome: &str| {
        format!(
            "appbroker_alerts_total{{balancer=\"{balancer}\",event=\"{event}\",outcome=\"{outcome}\"}}"
        )
    };
    assert_eq!(
        metric(&broker, &series("", "broker_started", "delivered")).await,
        1.0
    );
    let desktop = "BALANCE_SMART_CLIENT_DESKTOP";
    let failed = series(desktop, "quarantine_entered", "failed");
    assert_eq!(metric(&broker, &failed).await, 1.0);
    // It takes one again: said once.
    receiver.always(Reply::Ok);
    a.stop().await;
    broker
        .wait_for_log(&format!("alerts: {name} takes alerts again"))
        .await;
    assert_eq!(
        broker.count_logs("failed to take"),
        1,
        "{}",
        broker.log_text()
    );
}

#[tokio::test]
async fn an_attempt_past_alert_timeout_is_cut_and_retried_and_an_operator_is_named() {
    let receiver = WebhookReceiver::start().await;
    // The first attempt gets no answer: uncut, it would hold every alert after it.
    receiver.then(&[Reply::Hang]);
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let extra = format!(
        "ALERT_WEBHOOK=http://127.0.0.1:{}/\nALERT_TIMEOUT=1s",
        receiver.addr.port()
    );
    let broker = Broker::start(&one("", &[&a, &b], &extra)).await;
    eventually(
        "broker_started posted again once ALERT_TIMEOUT cut the first",
        || receiver.posted().len() == 2,
    )
    .await;
    assert_eq!(receiver.events(), ["broker_started", "broker_started"]);
    assert!(!broker.has_log("failed to take"), "{}", broker.log_text());
    // An operator's action names who took it, as the log does.
    let section = "SMART_CLIENT_DESKTOP";
    let (code, _, err) = cli(
        &broker,
        &["ctl", "disable", section, "01", "--reason", "patch"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let disabled = receiver.wait_for("server_disabled").await;
    let uid = format!("uid {}", nix::unistd::getuid());
    assert_eq!(disabled["who"], uid.as_str(), "{disabled}");
    assert_eq!(disabled["server"], a.address().as_str(), "{disabled}");
    assert!(
        disabled["reason"].as_str().unwrap().contains("patch"),
        "{disabled}"
    );
    let (code, _, err) = cli(&broker, &["ctl", "enable", section, "01"]).await;
    assert_eq!(code, 0, "{err}");
    let enabled = receiver.wait_for("server_enabled").await;
    assert_eq!(enabled["who"], uid.as_str(), "{enabled}");
}

#[tokio::test]
async fn at_most_four_alert_commands_run_at_once() {
    let mut servers = Vec::new();
    for name in ["a", "b", "c", "d", "e", "f"] {
        servers.push(TestServer::start(name).await);
    }
    // Each command writes how many run as it starts, then holds for two seconds.
    let extra = "ALERT_COMMAND=mkdir -p @DIR@/running; touch @DIR@/running/$$; \
                 ls @DIR@/running | wc -l >> @DIR@/counts; sleep 2; rm @DIR@/running/$$";
    let listed: Vec<&TestServer> = servers.iter().collect();
    let broker = Broker::start(&one("", &listed, extra)).await;
    eventually("broker_started run", || {
        !lines_of(&broker, "counts").is_empty()
    })
    .await;
    // Seven alerts at once: each server's quarantine_entered, and no_servers_available.
    for server in &mut servers {
        server.stop().await;
    }
    eventually("eight commands run", || {
        lines_of(&broker, "counts").len() == 8
    })
    .await;
    let counts: Vec<usize> = lines_of(&broker, "counts")
        .iter()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let most = counts.iter().copied().max().unwrap();
    assert!(most <= 4, "{most} commands ran at once: {counts:?}");
    assert!(most >= 2, "the commands ran one at a time: {counts:?}");
}

#[tokio::test]
async fn past_a_thousand_alerts_waiting_the_oldest_are_dropped_and_counted() {
    let receiver = WebhookReceiver::start().await;
    receiver.always(Reply::Hang);
    let server = TestServer::start("a").await;
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\n\
         LOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\nMONITORING_TYPE=DISABLED\n\
         ALERT_WEBHOOK=http://127.0.0.1:{}/\nALERT_TIMEOUT=300s\nREMOTE_SERVER_01={}\n",
        receiver.addr.port(),
        server.ini()
    );
    let broker = InProcess::start(&ini).await;
    eventually("the receiver holds broker_started", || {
        receiver.hanging.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let balancers = broker.broker.control().balancers();
    let balancer = &balancers[0];
    let target = balancer.find_server("01").unwrap();
    // 1,200 alerts: 600 holds and 600 ends of them.
    for n in 0..600 {
        let hold = Hold {
            mode: Mode::Disabled,
            reason: format!("round {n}"),
            by: "test".into(),
            since_wall_ms: 0,
        };
        balancer.hold(&target, hold);
        balancer.enable(&target, "test");
    }
    // Each round says the server was disabled, that no server was available, that it was
    // enabled, and that servers were available again: 2,400 alerts behind broker_started,
    // which the receiver holds.
    broker
        .events
        .wait_for("alerts dropped", |e| {
            matches!(e, Event::AlertsDropped { .. })
        })
        .await;
    receiver.release();
    let counted = || {
        let posted = receiver.posted();
        let dropped: u64 = posted
            .iter()
            .filter_map(|p| p.body["dropped"].as_u64())
            .sum();
        let kept = posted
            .iter()
            .filter(|p| p.body["dropped"].is_null())
            .count() as u64;
        (posted, dropped, kept)
    };
    let every = Duration::from_millis(20);
    let accounted = "every alert delivered or counted as dropped";
    let (posted, dropped, kept) = poll(accounted, every, DEADLINE, async || {
        let (posted, dropped, kept) = counted();
        if dropped + kept == 1 + 2400 {
            return Ok((posted, dropped, kept));
        }
        Err(format!(
            "{dropped} dropped, {kept} kept, of {} posted; the last: {:?}",
            posted.len(),
            posted.last()
        ))
    })
    .await;
    assert!(dropped >= 1400, "{dropped} dropped");
    assert!(
        kept <= 1 + 1000,
        "{kept} delivered: more than the queue holds"
    );
    assert_eq!(posted[0].body["event"], "broker_started");
    assert_eq!(
        posted.last().unwrap().body["event"],
        "servers_available_again",
        "the newest are kept"
    );
    assert!(posted.iter().any(|p| p.body["event"] == "alerts_dropped"));
    let metrics = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/METRICS", &[])
        .await
        .text();
    let counted = |event: &str, outcome: &str| -> u64 {
        let prefix = format!(
            "appbroker_alerts_total{{balancer=\"BALANCE_SMART_CLIENT_DESKTOP\",event=\"{event}\",outcome=\"{outcome}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0)
    };
    let events = [
        "server_disabled",
        "no_servers_available",
        "server_enabled",
        "servers_available_again",
    ];
    let dropped_counted: u64 = events.iter().map(|e| counted(e, "dropped")).sum();
    assert_eq!(dropped_counted, dropped, "{metrics}");
}

#[tokio::test]
async fn alert_command_gets_the_event_on_stdin_and_its_variables_not_the_brokers_own() {
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let extra = "ALERT_COMMAND=cat > @DIR@/$APPBROKER_EVENT.json; env > @DIR@/$APPBROKER_EVENT.env";
    // Supervised: the broker's environment holds the supervisor's variables.
    let broker = Broker::start_with(&one("", &[&a, &b], extra), &["--supervise"]).await;
    eventually("broker_started run", || {
        !lines_of(&broker, "broker_started.env").is_empty()
    })
    .await;
    let env = lines_of(&broker, "broker_started.env");
    assert!(
        env.contains(&"APPBROKER_EVENT=broker_started".to_string()),
        "{env:?}"
    );
    assert!(env.contains(&"APPBROKER_BALANCER=".to_string()), "{env:?}");
    for internal in ["APPBROKER_LISTENERS", "APPBROKER_READY_FD"] {
        assert!(
            !env.iter().any(|l| l.starts_with(&format!("{internal}="))),
            "{internal} reached the command: {env:?}"
        );
    }
    a.stop().await;
    eventually("quarantine_entered run", || {
        !lines_of(&broker, "quarantine_entered.env").is_empty()
    })
    .await;
    let env = lines_of(&broker, "quarantine_entered.env");
    let port = a.addr.port();
    for wanted in [
        "APPBROKER_BALANCER=BALANCE_SMART_CLIENT_DESKTOP".to_string(),
        format!("APPBROKER_SERVER={}", a.address()),
        "APPBROKER_SERVER_ID=01".to_string(),
        "APPBROKER_SERVER_HOST=127.0.0.1".to_string(),
        format!("APPBROKER_SERVER_PORT={port}"),
    ] {
        assert!(env.contains(&wanted), "{wanted} in {env:?}");
    }
    assert!(
        env.iter()
            .any(|l| l.starts_with("APPBROKER_REASON=monitor: "))
    );
    eventually("its JSON written", || {
        !lines_of(&broker, "quarantine_entered.json").is_empty()
    })
    .await;
    let json: serde_json::Value =
        serde_json::from_str(&lines_of(&broker, "quarantine_entered.json").join("\n")).unwrap();
    assert_eq!(json["event"], "quarantine_entered");
    assert_eq!(json["server"], a.address().as_str());
}

#[tokio::test]
async fn secrets_are_in_no_output() {
    let receiver = WebhookReceiver::start().await;
    let server = TestServer::start("a").await;
    let secrets = format!(
        "ALERT_WEBHOOK=http://127.0.0.1:{}/hook/SECRET-TOKEN-1\n\
         ALERT_COMMAND=curl -H 'token: SECRET-TOKEN-2' https://api.example.invalid || true\n\
         RESTART_COMMAND=sshpass -p SECRET-TOKEN-3 ssh appserver true\n",
        receiver.addr.port()
    );
    let mut broker = Broker::start(&one(&secrets, &[&server], "")).await;
    receiver.wait_for("broker_started").await;
    let (code, check, check_err) = cli(&broker, &["--check"]).await;
    assert_eq!(code, 0, "{check_err}");
    assert!(
        check.contains(&format!("(set: http://127.0.0.1:{})", receiver.addr.port())),
        "{check}"
    );
    let pages = [
        http_get(broker.addr(), "/TOTVS_BROKER_QUERY/CFG", &[])
            .await
            .text(),
        http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[])
            .await
            .text(),
        http_get(broker.addr(), "/TOTVS_BROKER_QUERY/JSON", &[])
            .await
            .text(),
    ];
    // A reload that changes each secret says so without showing them.
    let changed = std::fs::read_to_string(&broker.config_path)
        .unwrap()
        .replace("SECRET-TOKEN-", "SECRET-TOKEN-X");
    std::fs::write(&broker.config_path, changed).unwrap();
    let (code, reload, reload_err) = cli(&broker, &["ctl", "reload"]).await;
    assert_eq!(code, 0, "{reload_err}");
    assert!(
        reload.contains("ALERT_WEBHOOK changed (not shown)"),
        "{reload}"
    );
    assert!(
        reload.contains("RESTART_COMMAND changed (not shown)"),
        "{reload}"
    );
    broker.signal(nix::sys::signal::Signal::SIGTERM);
    broker.wait_exit().await;
    let outputs = [check, check_err, reload, reload_err, broker.log_text()];
    for (n, output) in outputs.iter().chain(pages.iter()).enumerate() {
        assert!(
            !output.contains("SECRET-TOKEN"),
            "output {n} holds a secret:\n{output}"
        );
    }
}

#[tokio::test]
async fn restart_command_runs_once_per_cooldown_shows_on_the_page_and_by_hand_with_force() {
    let receiver = WebhookReceiver::start().await;
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let extra = format!(
        "ALERT_WEBHOOK=http://127.0.0.1:{}/\nRESTART_COMMAND=echo \"$APPBROKER_SERVER_ID \
         $APPBROKER_SERVER $APPBROKER_REASON\" >> @DIR@/restarts; echo restarted it\n\
         RESTART_AFTER=1s\nRESTART_COOLDOWN=60m",
        receiver.addr.port()
    );
    let broker = Broker::start(&one("", &[&a, &b], &extra)).await;
    a.stop().await;
    let ran = receiver.wait_for("restart_ran").await;
    assert_eq!(ran["server"], a.address().as_str(), "{ran}");
    assert_eq!(ran["exit"], 0);
    assert_eq!(ran["reason"], "exit 0");
    assert_eq!(ran["output"], "restarted it");
    let restarts = lines_of(&broker, "restarts");
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert!(
        restarts[0].starts_with(&format!("01 {} in quarantine (monitor) for ", a.address())),
        "{restarts:?}"
    );
    broker
        .wait_for_log(&format!("restart of server {} (01): exit 0", a.address()))
        .await;
    // On the JSON, the page and `ctl show`.
    let json = query_json(broker.addr()).await;
    let entry = server_json(&json, &a.address()).unwrap();
    assert_eq!(entry["last_restart"]["outcome"], "exit 0", "{entry}");
    let page = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .text();
    assert!(
        page.contains("restarted ") && page.contains(", exit 0</small>"),
        "{page}"
    );
    let (_, show, _) = cli(&broker, &["ctl", "show"]).await;
    assert!(
        show.contains("restarted ") && show.contains(", exit 0"),
        "{show}"
    );
    // Within the cooldown: refused by hand, run with --force.
    let (code, out, err) = cli(&broker, &["ctl", "restart", "SMART_CLIENT_DESKTOP", "01"]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("RESTART_COOLDOWN (") && err.contains("--force"),
        "{err}"
    );
    let (code, out, err) = cli(
        &broker,
        &["ctl", "restart", "SMART_CLIENT_DESKTOP", "01", "--force"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("RESTART_COMMAND ran: exit 0; its last lines: restarted it"),
        "{out}"
    );
    let restarts = lines_of(&broker, "restarts");
    assert_eq!(restarts.len(), 2, "{restarts:?}");
    assert!(restarts[1].contains("asked by uid"), "{restarts:?}");
    // The automatic ones stay within the cooldown, the forced one counting too.
    assert_eq!(
        receiver
            .events()
            .iter()
            .filter(|e| *e == "restart_ran")
            .count(),
        2
    );
    let series = |outcome: &str| {
        format!(
            "appbroker_restarts_total{{balancer=\"BALANCE_SMART_CLIENT_DESKTOP\",outcome=\"{outcome}\"}}"
        )
    };
    assert_eq!(metric(&broker, &series("ok")).await, 2.0);
    assert!(
        metric(&broker, &series("skipped")).await >= 1.0,
        "the refusal within the cooldown is counted"
    );
}

#[tokio::test]
async fn no_restart_for_an_operators_quarantine_and_one_for_an_appserver_two_balancers_list() {
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    let restart = "RESTART_COMMAND=echo \"$APPBROKER_BALANCER $APPBROKER_SERVER_ID\" >> \
                   @DIR@/restarts\nRESTART_AFTER=1s\nRESTART_MAX_PARALLEL=2";
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n{restart}\n{}{}",
        section("BALANCE_SMART_CLIENT_DESKTOP", "@PORT@", &[&a, &b, &c], ""),
        section("BALANCE_WEB_SERVICES", "@PORT2@", &[&a, &b, &c], ""),
    );
    let broker = Broker::start(&ini).await;
    // 02 out on an operator's word, before 01 fails: due first, were it a health quarantine.
    let (code, _, err) = cli(
        &broker,
        &["ctl", "quarantine", "SMART_CLIENT_DESKTOP", "02", "10m"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    a.stop().await;
    eventually("01 restarted", || !lines_of(&broker, "restarts").is_empty()).await;
    broker.wait_for_log("restart of server").await;
    let restarts = lines_of(&broker, "restarts");
    assert_eq!(
        restarts.len(),
        1,
        "once for 01, though both balancers list it: {restarts:?}"
    );
    assert!(restarts[0].ends_with(" 01"), "{restarts:?}");
    // Both balancers show it beside the server.
    for addr in [broker.addr(), broker.addr2()] {
        let json = query_json(addr).await;
        let entry = server_json(&json, &a.address()).unwrap();
        assert_eq!(entry["last_restart"]["outcome"], "exit 0", "{entry}");
        let operators = server_json(&json, &b.address()).unwrap();
        assert!(operators["last_restart"].is_null(), "{operators}");
    }
}

#[tokio::test]
async fn a_server_quarantined_by_http_timeouts_is_restarted_and_an_operators_is_not() {
    // 01 accepts and never answers; 02 answers; 03 is put out by an operator.
    let hung = FaultServer::start("hung", Behaviour::Hang).await;
    let answers = Scripted::start().await;
    let held = Scripted::start().await;
    let extra = "SORT_METHOD=ROUND_ROBIN\nHTTP_RESPONSE_TIMEOUT=200ms\n\
                 HTTP_TIMEOUTS_TO_QUARANTINE=1\nQUARANTINE_TIME=600\nRESTART_COMMAND=echo \
                 \"$APPBROKER_SERVER_ID $APPBROKER_SERVER $APPBROKER_REASON\" >> @DIR@/restarts\n\
                 RESTART_AFTER=1s";
    let ini = http_ini(&[hung.addr, answers.addr, held.addr], extra);
    let broker = Broker::start(&ini).await;
    let (code, _, err) = cli(&broker, &["ctl", "quarantine", "HTTP", "03", "10m"]).await;
    assert_eq!(code, 0, "{err}");
    // Round robin over 01 and 02: within a few requests one reaches 01 and times out.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let status = raw_request(broker.addr(), &get_of("/ok")).await.status;
        statuses.push(status);
        if status == 504 {
            break;
        }
    }
    assert_eq!(statuses.last(), Some(&504), "{statuses:?}");
    broker
        .wait_for_log(&format!("restart of server {} (01): exit 0", hung.addr))
        .await;
    // 03's quarantine is older, so its restart, were it due, would have run first (one at
    // a time by default).
    let restarts = lines_of(&broker, "restarts");
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert!(
        restarts[0].starts_with(&format!("01 {} in quarantine (timeout) for ", hung.addr)),
        "{restarts:?}"
    );
    let json = query_json(broker.addr()).await;
    let entry = server_json(&json, &hung.addr.to_string()).unwrap();
    assert_eq!(entry["last_restart"]["outcome"], "exit 0", "{entry}");
    let operators = server_json(&json, &held.addr.to_string()).unwrap();
    assert!(operators["last_restart"].is_null(), "{operators}");
    let ok = "appbroker_restarts_total{balancer=\"BALANCE_HTTP\",outcome=\"ok\"}";
    assert_eq!(metric(&broker, ok).await, 1.0);
}

#[tokio::test]
async fn no_restart_while_every_server_is_down_and_one_when_another_is_back() {
    let mut a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let extra = "RESTART_COMMAND=echo $APPBROKER_SERVER_ID >> @DIR@/restarts\nRESTART_AFTER=1s\n\
                 QUARANTINE_TIME=1m";
    let broker = Broker::start(&one("", &[&a, &b], extra)).await;
    b.stop().await;
    a.stop().await;
    broker
        .wait_for_log("no restart while every server is in quarantine")
        .await;
    assert!(lines_of(&broker, "restarts").is_empty());
    b.resume().await;
    eventually("01 restarted once 02 is back", || {
        lines_of(&broker, "restarts") == ["01"]
    })
    .await;
    assert_eq!(broker.count_logs("no restart while every server"), 1);
    let skipped =
        "appbroker_restarts_total{balancer=\"BALANCE_SMART_CLIENT_DESKTOP\",outcome=\"skipped\"}";
    assert_eq!(metric(&broker, skipped).await, 1.0);
}

#[tokio::test]
async fn a_restart_past_its_timeout_is_killed() {
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let extra = "RESTART_COMMAND=echo started; sleep 60; echo never\nRESTART_AFTER=1s\n\
                 RESTART_TIMEOUT=1s";
    let broker = Broker::start(&one("", &[&a, &b], extra)).await;
    a.stop().await;
    let line = broker
        .wait_for_log(&format!("restart of server {} (01) failed", a.address()))
        .await;
    assert!(
        line.ends_with("failed: killed after 1s (its timeout); its last lines: started"),
        "{line}"
    );
    let json = query_json(broker.addr()).await;
    let entry = server_json(&json, &a.address()).unwrap();
    assert_eq!(
        entry["last_restart"]["exit"],
        serde_json::Value::Null,
        "{entry}"
    );
    assert_eq!(
        entry["last_restart"]["outcome"],
        "killed after 1s (its timeout)"
    );
    let timeouts =
        "appbroker_restarts_total{balancer=\"BALANCE_SMART_CLIENT_DESKTOP\",outcome=\"timeout\"}";
    assert_eq!(metric(&broker, timeouts).await, 1.0);
}

#[tokio::test]
async fn a_restart_exiting_non_zero_is_logged_with_its_exit_code_and_counted_as_failed() {
    let receiver = WebhookReceiver::start().await;
    let mut a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let extra = format!(
        "ALERT_WEBHOOK=http://127.0.0.1:{}/\nRESTART_COMMAND=echo connection refused >&2; \
         exit 3\nRESTART_AFTER=1s",
        receiver.addr.port()
    );
    let broker = Broker::start(&one("", &[&a, &b], &extra)).await;
    a.stop().await;
    let line = broker
        .wait_for_log(&format!("restart of server {} (01) failed", a.address()))
        .await;
    assert!(line.contains("failed: exit 3 in "), "{line}");
    assert!(
        line.ends_with("; its last lines: connection refused"),
        "{line}"
    );
    let ran = receiver.wait_for("restart_ran").await;
    assert_eq!(ran["exit"], 3, "{ran}");
    assert_eq!(ran["reason"], "exit 3", "{ran}");
    let series = |outcome: &str| {
        format!(
            "appbroker_restarts_total{{balancer=\"BALANCE_SMART_CLIENT_DESKTOP\",outcome=\"{outcome}\"}}"
        )
    };
    assert_eq!(metric(&broker, &series("failed")).await, 1.0);
    assert_eq!(metric(&broker, &series("ok")).await, 0.0);
    assert_eq!(metric(&broker, &series("timeout")).await, 0.0);
}

#[tokio::test]
async fn at_most_restart_max_parallel_restarts_run_at_once() {
    let mut down = Vec::new();
    for name in ["a", "b", "c"] {
        down.push(TestServer::start(name).await);
    }
    let up = TestServer::start("d").await;
    // A lock directory says whether two ran at once.
    let extra = "RESTART_COMMAND=if mkdir @DIR@/lock; then sleep 0.3; rmdir @DIR@/lock; \
                 else echo overlap >> @DIR@/overlaps; fi; echo $APPBROKER_SERVER_ID >> \
                 @DIR@/restarts\nRESTART_AFTER=1s\nRESTART_MAX_PARALLEL=1";
    let servers: Vec<&TestServer> = down.iter().chain([&up]).collect();
    let broker = Broker::start(&one("", &servers, extra)).await;
    for server in &mut down {
        server.stop().await;
    }
    eventually("the three restarted", || {
        lines_of(&broker, "restarts").len() == 3
    })
    .await;
    assert!(lines_of(&broker, "overlaps").is_empty(), "two ran at once");
}

#[tokio::test]
async fn restart_only_with_address_restarts_where_the_address_is_and_nowhere_else() {
    for (address, here) in [("127.0.0.1", true), ("192.0.2.77", false)] {
        let mut a = TestServer::start("a").await;
        let b = TestServer::start("b").await;
        let extra = format!(
            "RESTART_COMMAND=echo $APPBROKER_SERVER_ID >> @DIR@/restarts\nRESTART_AFTER=1s\n\
             RESTART_ONLY_WITH_ADDRESS={address}"
        );
        let broker = Broker::start(&one("", &[&a, &b], &extra)).await;
        a.stop().await;
        if here {
            eventually("restarted", || lines_of(&broker, "restarts") == ["01"]).await;
            continue;
        }
        broker
            .wait_for_log("192.0.2.77 (RESTART_ONLY_WITH_ADDRESS) is not on this host")
            .await;
        let (code, _, err) = cli(&broker, &["ctl", "restart", "SMART_CLIENT_DESKTOP", "01"]).await;
        assert_eq!(code, 1);
        assert!(err.contains("is not on this host"), "{err}");
        assert!(lines_of(&broker, "restarts").is_empty());
    }
}

#[test]
fn the_alert_keys_are_documented() {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
            .unwrap();
    for event in appbroker::config::AlertEvent::ALL {
        assert!(
            docs.contains(&format!("\"event\": \"{}\"", event.as_str())),
            "docs/operations.md shows no example of {}",
            event.as_str()
        );
    }
    let _ = Duration::ZERO;
}
