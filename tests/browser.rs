//! The STATUS page in a real browser: headless Chromium loads it from a running broker, the
//! test reads the DOM Chromium built, and a screenshot is left under target/ for a person.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use scraper::{Html, Selector};

/// Chromium's first start on a fresh profile can take a few seconds on a loaded machine; a
/// run longer than this has hung, and is killed.
const BROWSER_DEADLINE: Duration = Duration::from_secs(60);

/// `chromium` on the PATH (Debian's package installs /usr/bin/chromium).
fn find_chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("chromium"))
        .find(|candidate| candidate.is_file())
}

/// Runs headless Chromium on `url` with `args`, bounded by [`BROWSER_DEADLINE`]; returns its
/// standard output. Chromium starts helper processes; it runs in a process group of its own
/// so that a hung run is killed whole.
async fn chromium(binary: &Path, profile: &Path, url: &str, args: &[&str]) -> Vec<u8> {
    let mut command = tokio::process::Command::new(binary);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = command.spawn().expect("start chromium");
    let group = nix::unistd::Pid::from_raw(child.id().expect("chromium's pid") as i32);
    match tokio::time::timeout(BROWSER_DEADLINE, child.wait_with_output()).await {
        Ok(output) => {
            let output = output.expect("chromium's output");
            assert!(
                output.status.success(),
                "chromium failed ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            output.stdout
        }
        Err(_) => {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            panic!("chromium did not finish within {BROWSER_DEADLINE:?} on {url}; killed");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium (apt-get install chromium)"]
async fn status_page_renders_in_chromium() {
    let binary = find_chromium().expect("chromium on the PATH (apt-get install chromium)");

    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let ini = ini_for(&[&a, &b], "SORT_METHOD=ROUND_ROBIN");
    let broker = Broker::start(&ini).await;
    // Two clients held on a (a line above zero in the chart), b stopped and quarantined by
    // the clients that tried it (a highlighted row).
    b.stop().await;
    let mut held = Vec::new();
    let end = Instant::now() + DEADLINE;
    loop {
        let status = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/JSON", &[])
            .await
            .json();
        if status["servers"][1]["inquarantine"] == true && held.len() >= 2 {
            break;
        }
        assert!(
            Instant::now() < end,
            "b never quarantined:\n{}",
            broker.log_text()
        );
        held.push(hold(broker.addr()).await.0);
    }

    let profile = tempfile::tempdir().expect("profile dir");
    let url = format!("http://{}/TOTVS_BROKER_QUERY/STATUS", broker.addr());
    let dom = chromium(&binary, profile.path(), &url, &["--dump-dom"]).await;
    let dom = String::from_utf8(dom).expect("the DOM as UTF-8");
    let page = Html::parse_document(&dom);
    let select = |css: &str| {
        page.select(&Selector::parse(css).unwrap())
            .collect::<Vec<_>>()
    };

    // Chromium parsed our page into the table we meant: the header and one row per server,
    // each with its link and every cell, and b's row marked as quarantined.
    let rows = select("table.servers tr");
    assert_eq!(rows.len(), 3, "header and two servers:\n{dom}");
    let header: Vec<String> = select("table.servers th")
        .iter()
        .map(|th| th.text().collect())
        .collect();
    assert_eq!(header[..3], ["Server", "Connections", "Quarantine"]);
    for (row, server) in rows[1..].iter().zip([&a, &b]) {
        let cells: Vec<String> = row
            .select(&Selector::parse("td").unwrap())
            .map(|td| td.text().collect())
            .collect();
        assert_eq!(cells.len(), header.len(), "{}", row.html());
        assert_eq!(cells[0], server.address());
    }
    let quarantined: Vec<String> = select("table.servers tr.inQuarantine td:first-child")
        .iter()
        .map(|td| td.text().collect())
        .collect();
    assert_eq!(quarantined, [b.address()]);
    assert_eq!(
        rows[1]
            .select(&Selector::parse("td").unwrap())
            .nth(1)
            .unwrap()
            .text()
            .collect::<String>(),
        held.len().to_string(),
        "a's connections"
    );

    // The chart: inline SVG, one line per server.
    let chart = select("svg#connections-chart");
    assert_eq!(chart.len(), 1, "the chart:\n{dom}");
    let lines = chart[0]
        .select(&Selector::parse("polyline").unwrap())
        .count();
    assert_eq!(lines, 2, "one polyline per server");
    assert!(select("script").is_empty(), "no JavaScript on the page");

    // For a person to look at.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir");
    let screenshot = target.join("status-page.png");
    let _ = std::fs::remove_file(&screenshot);
    chromium(
        &binary,
        profile.path(),
        &url,
        &[
            &format!("--screenshot={}", screenshot.display()),
            "--window-size=1280,900",
            "--hide-scrollbars",
        ],
    )
    .await;
    let png = std::fs::read(&screenshot).expect("the screenshot was written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    eprintln!("screenshot of the STATUS page: {}", screenshot.display());
    drop(held);
}
