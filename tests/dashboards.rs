//! contrib/grafana/appbroker.json and contrib/prometheus/appbroker.rules.yml held to METRICS:
//! every `appbroker_*` metric they use is a family a broker answers (a TLS port and an HTTP
//! balancer, so that every family is there), so neither a dashboard panel nor an alerting rule
//! goes blank when a family is renamed; and Prometheus's own `promtool check rules` takes the
//! rules.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::collections::BTreeSet;
use std::path::Path;

use harness::*;

/// The `appbroker_*` names in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("appbroker_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// The series names `metrics` (Prometheus text) declares, a histogram's `_bucket`, `_sum`
/// and `_count` included.
fn families(metrics: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        names.insert(name.to_string());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// A certificate for `localhost` and its key, as PEM files in `dir`; the lines that serve it.
fn tls_lines(dir: &Path) -> String {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.join("broker.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("broker.key"), key.serialize_pem()).unwrap();
    format!(
        "SSL_CERTIFICATE={}\nSSL_KEY={}\nSSL_PLAIN_ON_SAME_PORT=1\n",
        dir.join("broker.pem").display(),
        dir.join("broker.key").display()
    )
}

#[tokio::test]
async fn every_metric_the_dashboard_and_the_rules_use_is_one_metrics_answers() {
    let files = tempfile::tempdir().unwrap();
    let server = TestServer::start("a").await;
    let origin = Origin::start().await;
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\n\
         LOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\nQUERY_ALLOW=127.0.0.1\n{}\
         REMOTE_SERVER_01={}\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT2@\nQUERY_ALLOW=127.0.0.1\nREMOTE_SERVER_01=127.0.0.1 {}\n",
        tls_lines(files.path()),
        server.ini(),
        origin.addr.port()
    );
    let broker = InProcess::start(&ini).await;
    let mut answered = BTreeSet::new();
    for addr in [broker.addr(), broker.addr2()] {
        let metrics = http_get(addr, "/TOTVS_BROKER_QUERY/METRICS", &[])
            .await
            .text();
        answered.extend(families(&metrics));
    }
    assert!(answered.contains("appbroker_tls_certificate_expiry_seconds"));
    assert!(answered.contains("appbroker_http_request_duration_seconds_bucket"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in [
        "contrib/grafana/appbroker.json",
        "contrib/prometheus/appbroker.rules.yml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let used = metric_names(&text);
        assert!(used.len() >= 5, "{file} uses {used:?}");
        let unknown: Vec<&String> = used.difference(&answered).collect();
        assert!(
            unknown.is_empty(),
            "{file} uses {unknown:?}, which METRICS does not answer ({answered:?})"
        );
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("contrib/grafana/appbroker.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "appbroker");
}

#[test]
#[ignore = "needs promtool (Prometheus)"]
fn promtool_takes_the_alerting_rules() {
    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/prometheus/appbroker.rules.yml");
    let mut command = std::process::Command::new("promtool");
    command.arg("check").arg("rules").arg(&rules);
    let (code, stdout, stderr) = run_bounded(command);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("SUCCESS"), "{stdout}");
}
