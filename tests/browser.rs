//! The STATUS page in a real browser: headless Chromium loads it from a running broker, the
//! test reads the DOM Chromium built and the layout it computed at a desktop's width (1280
//! px) and a phone's (390 px), and screenshots of both are left under target/ for a person.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::*;
use scraper::{Html, Selector};

/// A broker of two servers, in `language`: two clients held on a (a line above zero in the
/// chart), b stopped and quarantined by the clients that tried it (a highlighted row).
struct Scene {
    broker: Broker,
    a: TestServer,
    b: TestServer,
    _held: Vec<tokio::net::TcpStream>,
}

async fn scene(language: &str) -> Scene {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let ini = ini_for(&[&a, &b], "SORT_METHOD=ROUND_ROBIN")
        .replace("[General]\n", &format!("[General]\nLANGUAGE={language}\n"));
    let broker = Broker::start(&ini).await;
    b.stop().await;
    let mut held = Vec::new();
    poll("b quarantined", Duration::ZERO, DEADLINE, async || {
        let status = query_json(broker.addr()).await;
        if status["servers"][1]["inquarantine"] == true && held.len() >= 2 {
            return Ok(());
        }
        held.push(hold(broker.addr()).await.0);
        Err(broker.log_text())
    })
    .await;
    Scene {
        broker,
        a,
        b,
        _held: held,
    }
}

/// Where screenshots are left: target/.
fn screenshot_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .join(name)
}

/// Takes a screenshot of `url` at `width` x `height` into target/`name`.
async fn screenshot(
    binary: &Path,
    profile: &Path,
    url: &str,
    (width, height): (u32, u32),
    name: &str,
) {
    let path = screenshot_path(name);
    let _ = std::fs::remove_file(&path);
    chromium(
        binary,
        profile,
        url,
        &[
            &format!("--screenshot={}", path.display()),
            &format!("--window-size={width},{height}"),
            "--hide-scrollbars",
        ],
    )
    .await;
    let png = std::fs::read(&path).expect("the screenshot was written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    eprintln!(
        "screenshot of the STATUS page at {width} px: {}",
        path.display()
    );
}

/// What Chromium laid out, in CSS pixels, as the script below measures it once loaded.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // read through Debug in messages
struct Layout {
    viewport_width: f64,
    viewport_height: f64,
    /// The page's full width: above the viewport's, the page scrolls sideways.
    scroll_width: f64,
    table_top: f64,
    table_right: f64,
    /// Heights of the table's rows, the header's first.
    row_heights: Vec<f64>,
    quarantined_row_height: f64,
    /// Which chart shows: `wide`, `narrow`.
    charts_shown: Vec<String>,
    chart_height: f64,
    /// The smallest rendered height of the shown chart's axis labels.
    smallest_label: f64,
    /// Columns of the table shown, by their header.
    columns_shown: Vec<String>,
    /// Every header, shown or not.
    headers: Vec<String>,
    /// The data rows' cells, as laid out.
    rows: Vec<Vec<Cell>>,
    /// The summary line's text.
    summary: String,
    /// How much wider the table is than its card's room for it (it scrolls inside the card).
    table_overflow: f64,
}

/// One data cell as Chromium laid it out.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // read through Debug in messages
struct Cell {
    /// Its computed `text-align` and `white-space`.
    align: String,
    white_space: String,
    /// The lines its text takes.
    lines: u32,
    shown: bool,
    text: String,
}

/// Measures the layout of the page shown in the frame `#page` once everything has loaded
/// (the page itself runs no script); the result goes in an attribute of the outer `<body>`,
/// which `--dump-dom` shows.
const MEASURE: &str = "<script>addEventListener('load', () => {
  const w = document.getElementById('page').contentWindow, d = w.document;
  const table = d.querySelector('table.servers');
  const rows = [...table.querySelectorAll('tr')];
  const shown = e => w.getComputedStyle(e).display !== 'none';
  // The lines an element's text takes: its text's fragments, grouped by where they sit.
  const lines = e => {
    const walk = d.createTreeWalker(e, NodeFilter.SHOW_TEXT), middles = [];
    while (walk.nextNode()) {
      const range = d.createRange();
      range.selectNodeContents(walk.currentNode);
      for (const r of range.getClientRects()) if (r.width > 0) middles.push((r.top + r.bottom) / 2);
    }
    middles.sort((a, b) => a - b);
    return middles.filter((m, i) => i === 0 || m - middles[i - 1] > 6).length;
  };
  const charts = [...d.querySelectorAll('.chart > svg')].filter(shown);
  const labels = charts.flatMap(c => [...c.querySelectorAll('text')]).map(t => t.getBoundingClientRect().height);
  document.body.setAttribute('data-layout', JSON.stringify({
    viewportWidth: w.innerWidth, viewportHeight: w.innerHeight,
    scrollWidth: d.documentElement.scrollWidth,
    tableTop: table.getBoundingClientRect().top, tableRight: table.getBoundingClientRect().right,
    rowHeights: rows.map(r => r.getBoundingClientRect().height),
    quarantinedRowHeight: (d.querySelector('td.inQuarantine') || d.querySelector('tr.inQuarantine > td'))
      .parentElement.getBoundingClientRect().height,
    chartsShown: charts.map(c => c.getAttribute('class') || ''),
    chartHeight: charts.length ? charts[0].getBoundingClientRect().height : 0,
    smallestLabel: labels.length ? Math.min(...labels) : 0,
    columnsShown: [...rows[0].children].filter(shown).map(th => th.textContent),
    headers: [...rows[0].children].map(th => th.textContent),
    rows: rows.slice(1).map(r => [...r.children].map(td => {
      const style = w.getComputedStyle(td);
      return {
        align: style.textAlign, whiteSpace: style.whiteSpace, shown: shown(td), text: td.innerText,
        lines: lines(td),
      };
    })),
    summary: d.querySelector('.summary').innerText,
    tableOverflow: table.parentElement.scrollWidth - table.parentElement.clientWidth,
  }));
});</script>";

/// The layout of `html` on a screen of `width` x `height` CSS pixels: the page shown in a
/// frame of that size (a headless window cannot be made narrower than 500 px), without the
/// scroll bar a phone does not have, measured.
async fn layout(binary: &Path, profile: &Path, html: &str, (width, height): (u32, u32)) -> Layout {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("measure.html");
    let quoted = html.replace('&', "&amp;").replace('"', "&quot;");
    std::fs::write(
        &file,
        format!(
            "<!DOCTYPE html><html><body style='margin:0'><iframe id='page' scrolling='no' \
             style='border:0;width:{width}px;height:{height}px' srcdoc=\"{quoted}\"></iframe>\
             {MEASURE}</body></html>"
        ),
    )
    .unwrap();
    let dom = chromium(
        binary,
        profile,
        &format!("file://{}", file.display()),
        &[
            "--dump-dom",
            "--window-size=1400,1000",
            // Lets the load handler run before the DOM is dumped.
            "--virtual-time-budget=5000",
        ],
    )
    .await;
    let dom = String::from_utf8(dom).expect("the DOM as UTF-8");
    let page = Html::parse_document(&dom);
    let body = page
        .select(&Selector::parse("body").unwrap())
        .next()
        .expect("a body");
    let json = body
        .value()
        .attr("data-layout")
        .unwrap_or_else(|| panic!("the measuring script did not run:\n{dom}"));
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// Chromium parsed our page into the table we meant: the header and one row per server, each
/// with its link and every cell, and b's row marked as quarantined; the charts inline SVG,
/// one stepped line per server in each. Returns the header's cells.
fn the_dom_is_the_page_we_meant(dom: &str, a: &TestServer, b: &TestServer) -> Vec<String> {
    let page = Html::parse_document(dom);
    let select = |css: &str| {
        page.select(&Selector::parse(css).unwrap())
            .collect::<Vec<_>>()
    };
    let rows = select("table.servers tr");
    assert_eq!(rows.len(), 3, "header and two servers:\n{dom}");
    let header: Vec<String> = select("table.servers th")
        .iter()
        .map(|th| th.text().collect())
        .collect();
    assert_eq!(
        header[..4],
        ["Server", "Connections", "Quarantine", "State"]
    );
    for (row, server) in rows[1..].iter().zip([a, b]) {
        let cells: Vec<String> = row
            .select(&Selector::parse("td").unwrap())
            .map(|td| td.text().collect())
            .collect();
        assert_eq!(cells.len(), header.len(), "{}", row.html());
        assert_eq!(cells[0], server.address());
    }
    let quarantined: Vec<String> = select("table.servers td.inQuarantine")
        .iter()
        .map(|td| td.text().collect())
        .collect();
    assert_eq!(quarantined.len(), 1, "one state cell marked");
    assert!(quarantined[0].starts_with("quarantined"), "{quarantined:?}");
    assert!(
        rows[2].html().contains("inQuarantine"),
        "b's row: {}",
        rows[2].html()
    );
    assert_eq!(
        rows[1]
            .select(&Selector::parse("td").unwrap())
            .nth(1)
            .unwrap()
            .text()
            .collect::<String>(),
        "2",
        "a's connections"
    );
    assert_eq!(
        select("h1").first().map(|h| h.text().collect::<String>()),
        Some("TOTVS Broker para SmartClient".to_string())
    );

    // The charts: inline SVG, one stepped line per server in each.
    for class in ["wide", "narrow"] {
        let chart = select(&format!(".chart > svg.{class}"));
        assert_eq!(chart.len(), 1, "the {class} chart:\n{dom}");
        let lines: Vec<String> = chart[0]
            .select(&Selector::parse("path.series").unwrap())
            .map(|p| p.value().attr("data-server").unwrap().to_string())
            .collect();
        assert_eq!(lines.len(), 2, "one line per server");
    }
    assert!(select("script").is_empty(), "no JavaScript on the page");
    header
}

/// At a desktop's width: all of the page `html` fits, the table on the first screen, every
/// one of its `columns` and the wide chart shown, each column drawn by what it holds.
async fn fits_a_desktop(binary: &Path, profile: &Path, html: &str, columns: usize) {
    let desk = layout(binary, profile, html, (1280, 900)).await;
    eprintln!("at 1280 x 900: {desk:?}");
    assert!(desk.scroll_width <= desk.viewport_width, "{desk:?}");
    assert!(desk.table_top < desk.viewport_height / 2.0, "{desk:?}");
    assert_eq!(desk.columns_shown.len(), columns, "{desk:?}");
    assert_eq!(desk.charts_shown, ["wide"], "{desk:?}");
    assert!(
        desk.smallest_label >= 10.0,
        "axis labels too small: {desk:?}"
    );
    // Each column drawn by what it holds, as on the HTTP page.
    assert_eq!(
        desk.table_overflow, 0.0,
        "the table fits its card: {desk:?}"
    );
    for header in TCP_FIGURES {
        for cell in column(&desk, header) {
            assert_eq!(
                (cell.align.as_str(), cell.white_space.as_str()),
                ("right", "nowrap"),
                "{header}: {cell:?}"
            );
        }
    }
    for header in ["State", "Last check"] {
        for cell in column(&desk, header) {
            assert!(
                cell.align == "left" && cell.white_space == "normal" && cell.lines <= 3,
                "{header}: {cell:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium"]
async fn status_page_renders_in_chromium() {
    let binary = find_chromium().expect("chromium on the PATH (apt-get install chromium)");
    let scene = scene("en").await;
    let (broker, a, b) = (&scene.broker, &scene.a, &scene.b);

    let profile = tempfile::tempdir().expect("profile dir");
    let url = format!("http://{}/TOTVS_BROKER_QUERY/STATUS", broker.addr());
    let dom = chromium(&binary, profile.path(), &url, &["--dump-dom"]).await;
    let dom = String::from_utf8(dom).expect("the DOM as UTF-8");
    let header = the_dom_is_the_page_we_meant(&dom, a, b);

    let html = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .text();
    fits_a_desktop(&binary, profile.path(), &html, header.len()).await;
    screenshot(
        &binary,
        profile.path(),
        &url,
        (1280, 900),
        "status-page-1280.png",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium"]
async fn the_status_page_fits_a_phone_with_the_table_first() {
    let binary = find_chromium().expect("chromium on the PATH (apt-get install chromium)");
    let scene = scene("pt-BR").await;
    let profile = tempfile::tempdir().expect("profile dir");
    let url = format!("http://{}/TOTVS_BROKER_QUERY/STATUS", scene.broker.addr());
    let html = http_get(scene.broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .text();

    // An iPhone's screen, 390 x 844 CSS pixels.
    let phone = layout(&binary, profile.path(), &html, (390, 844)).await;
    eprintln!("at 390 x 844: {phone:?}");
    assert_eq!(phone.viewport_width, 390.0, "{phone:?}");
    assert!(
        phone.scroll_width <= phone.viewport_width,
        "the page scrolls sideways: {phone:?}"
    );
    assert!(phone.table_right <= phone.viewport_width, "{phone:?}");
    // The table is what an operator opened the page for: on the first screen, near its top.
    assert!(
        phone.table_top < phone.viewport_height / 3.0,
        "the table starts {} px down: {phone:?}",
        phone.table_top
    );
    assert_eq!(
        phone.columns_shown,
        ["Server", "Conexões", "Estado"],
        "{phone:?}"
    );
    // The quarantined row: the state and its cause on a few lines, not a tall block.
    let ordinary = phone.row_heights[1];
    assert!(
        phone.quarantined_row_height <= 3.0 * ordinary,
        "quarantined row {} px against {ordinary}: {phone:?}",
        phone.quarantined_row_height
    );
    // The narrow chart in place of the wide one, tall enough and labels readable.
    assert_eq!(phone.charts_shown, ["narrow"], "{phone:?}");
    assert!(phone.chart_height >= 150.0, "{phone:?}");
    assert!(
        phone.smallest_label >= 10.0,
        "axis labels too small: {phone:?}"
    );

    // For a person: the whole page at a phone's width, and at a desktop's.
    screenshot(
        &binary,
        profile.path(),
        &url,
        (390, 1600),
        "status-page-390.png",
    )
    .await;
    screenshot(
        &binary,
        profile.path(),
        &url,
        (1280, 900),
        "status-page-1280-pt-BR.png",
    )
    .await;
}

/// The TCP page's columns of figures.
const TCP_FIGURES: [&str; 6] = [
    "Connections",
    "Weight",
    "Total",
    "Failed connects",
    "Bytes from clients",
    "Bytes to clients",
];

/// An HTTP balancer of three web servers, in `language`: 01 available (its weight set by an
/// operator), 02 refusing connections and quarantined by the monitor, 03 disabled by an
/// operator with a reason.
async fn http_scene(language: &str) -> HttpScene {
    let [one, three] = web_stand_ins().await;
    // Bound, not listening: connections to it are refused.
    let refusing = reserve("127.0.0.1:0".parse().unwrap()).expect("a port");
    let two = refusing.local_addr().unwrap().as_socket().unwrap();
    let server = |a: std::net::SocketAddr| format!("{} {}", a.ip(), a.port());
    let ini = format!(
        "[General]\nLANGUAGE={language}\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\nMONITORING_TYPE=CONNECTION\nMONITOR_INTERVAL=500ms\n\
         REMOTE_SERVER_01={}\nREMOTE_SERVER_02={}\nREMOTE_SERVER_03={}\n",
        server(one.address),
        server(two),
        server(three.address)
    );
    let broker = InProcess::start(&ini).await;
    let balancer = broker.broker.control().balancers()[0].clone();
    balancer.set_weight(&balancer.find_server("01").unwrap(), Some(3), "uid 0");
    let hold = appbroker::balancer::rules::overrides::Hold {
        mode: appbroker::balancer::rules::overrides::Mode::Disabled,
        reason: "AppServer upgrade".into(),
        by: "uid 0".into(),
        since_wall_ms: appbroker::support::clock::wall_ms(),
    };
    balancer.hold(&balancer.find_server("03").unwrap(), hold);
    // A round has checked everyone: 02 quarantined, 01 and 03 checked.
    let every = Duration::from_millis(50);
    poll("02 quarantined", every, DEADLINE, async || {
        let status = query_json(broker.addr()).await;
        let servers = status["servers"].as_array().unwrap();
        let checked = servers.iter().all(|s| !s["last_check"].is_null());
        if servers[1]["inquarantine"] == true && checked {
            Ok(())
        } else {
            Err(format!("{status:#}"))
        }
    })
    .await;
    let html = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .text();
    HttpScene {
        broker,
        _servers: [one, three],
        _refusing: refusing,
        html,
    }
}

/// [`http_scene`]'s broker, the servers it keeps up, and its page.
struct HttpScene {
    broker: InProcess,
    _servers: [appbroker::demo::StandIn; 2],
    _refusing: socket2::Socket,
    html: String,
}

/// What the HTTP page says in `language`: the headers of the columns holding figures and
/// words, the columns a phone shows, and the words of each state.
struct HttpWords {
    figures: [&'static str; 7],
    words: [&'static str; 3],
    phone: [&'static str; 3],
    available: &'static str,
    quarantined: &'static str,
    refused: &'static str,
    disabled: &'static str,
    summary: &'static str,
}

const HTTP_EN: HttpWords = HttpWords {
    figures: [
        "Sessions",
        "Connections",
        "Weight",
        "Total",
        "Failed connects",
        "Bytes from clients",
        "Bytes to clients",
    ],
    words: ["Reasons", "State", "Last check"],
    phone: ["Server", "Sessions", "State"],
    available: "available",
    quarantined: "quarantined",
    refused: "connection refused",
    disabled: "disabled",
    summary: "1 of 3 servers available · 1 in quarantine · 1 disabled",
};

const HTTP_PT: HttpWords = HttpWords {
    figures: [
        "Sessões",
        "Conexões",
        "Peso",
        "Total",
        "Conexões com falha",
        "Bytes dos clientes",
        "Bytes para os clientes",
    ],
    words: ["Motivos", "Estado", "Última verificação"],
    phone: ["Server", "Sessões", "Estado"],
    available: "disponível",
    quarantined: "em quarentena",
    refused: "conexão recusada",
    disabled: "desabilitado",
    summary: "1 de 3 servidores disponíveis · 1 em quarentena · 1 desabilitado",
};

/// The cells of the column headed `header`, one per row.
fn column<'a>(layout: &'a Layout, header: &str) -> Vec<&'a Cell> {
    let at = layout
        .headers
        .iter()
        .position(|h| h == header)
        .unwrap_or_else(|| panic!("no column {header}: {:?}", layout.headers));
    layout.rows.iter().map(|row| &row[at]).collect()
}

/// The HTTP page at a desktop's and a phone's width: each column drawn by what it holds
/// (figures right-aligned on one line, words left-aligned with room), the state and its cause
/// on a phone, in `words`' language.
async fn check_http_page(binary: &Path, language: &str, words: &HttpWords) {
    let scene = http_scene(language).await;
    let (broker, html) = (&scene.broker, &scene.html);
    let profile = tempfile::tempdir().expect("profile dir");
    // For a person, first: left also when an assertion below fails.
    let url = format!("http://{}/TOTVS_BROKER_QUERY/STATUS", broker.addr());
    for (width, height) in [(1280, 900), (390, 1400)] {
        let name = format!("status-page-http-{width}-{language}.png");
        screenshot(binary, profile.path(), &url, (width, height), &name).await;
    }

    let desk = layout(binary, profile.path(), html, (1280, 900)).await;
    eprintln!("{language} at 1280 x 900: {desk:#?}");
    assert!(desk.summary.ends_with(words.summary), "{desk:?}");
    assert!(desk.scroll_width <= desk.viewport_width, "{desk:?}");
    assert_eq!(desk.columns_shown, desk.headers, "every column: {desk:?}");
    assert_eq!(
        desk.table_overflow, 0.0,
        "the table fits its card: {desk:?}"
    );
    for header in words.figures {
        for cell in column(&desk, header) {
            assert_eq!(
                (cell.align.as_str(), cell.white_space.as_str()),
                ("right", "nowrap"),
                "{header}: {cell:?}"
            );
        }
    }
    for header in words.words {
        for cell in column(&desk, header) {
            assert!(
                ["left", "start"].contains(&cell.align.as_str()) && cell.white_space == "normal",
                "{header}: {cell:?}"
            );
            assert!(cell.lines <= 3, "{header} squeezed: {cell:?}");
        }
    }
    let last_check = words.words[2];
    for cell in column(&desk, last_check) {
        assert!(cell.lines <= 2, "{last_check} squeezed: {cell:?}");
    }

    let phone = layout(binary, profile.path(), html, (390, 844)).await;
    eprintln!("{language} at 390 x 844: {phone:#?}");
    assert!(
        phone.scroll_width <= phone.viewport_width,
        "the page scrolls sideways: {phone:?}"
    );
    assert!(phone.table_right <= phone.viewport_width, "{phone:?}");
    assert_eq!(phone.columns_shown, words.phone, "{phone:?}");
    let state: Vec<&str> = column(&phone, words.phone[2])
        .iter()
        .map(|c| c.text.as_str())
        .collect();
    assert!(state[0].starts_with(words.available), "{state:?}");
    assert!(
        !state[0].contains('\n'),
        "an available server, no error: {state:?}"
    );
    assert!(
        state[1].starts_with(words.quarantined) && state[1].contains(words.refused),
        "the badge and the error on a phone: {state:?}"
    );
    assert!(
        state[2].starts_with(words.disabled) && state[2].contains("AppServer upgrade"),
        "{state:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium on the PATH"]
async fn the_http_balancers_page_is_laid_out_by_what_each_column_holds() {
    let binary = find_chromium().expect("chromium on the PATH (Debian's package: chromium)");
    check_http_page(&binary, "en", &HTTP_EN).await;
    check_http_page(&binary, "pt-BR", &HTTP_PT).await;
}

/// `GET target` through `addr` on a connection of its own, its answer read whole: a request
/// the origin behind records, sent after whatever the test wants to have arrived before it.
async fn marker(addr: std::net::SocketAddr, target: &str) {
    let answer = http_get(addr, target, &[("Connection", "close")]).await;
    assert_eq!(answer.status, 200, "{target}: {}", answer.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium"]
async fn the_pages_declare_their_own_icon_so_the_browser_asks_no_server_for_one() {
    // Through the binary, a TCP balancer and an HTTP balancer, each over an origin that
    // records the requests reaching it: a browser on any status page sends none of them a
    // `/favicon.ico` (counted in the server's Total, on an HTTP balancer sent to the
    // AppServer's application). A browser kept running asks for it once a page has loaded.
    // The TCP balancer waits the longest QUERY_SNIFF_TIMEOUT: Chromium opens a spare
    // connection while a page loads and may send its next request on it only later; a
    // connection silent past the sniff is a client of a server-first protocol and goes to
    // the server (docs/architecture.md), which is not what this test is about.
    let binary = find_chromium().expect("chromium on the PATH (apt-get install chromium)");
    let (behind_tcp, behind_http) = (Origin::start().await, Origin::start().await);
    let server = |o: &Origin| format!("{} {}", o.addr.ip(), o.addr.port());
    let ini = format!(
        "[General]\nSHUTDOWN_TIMEOUT=5\n[BALANCE_SMART_CLIENT_DESKTOP]\n\
         LOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\nMONITORING_TYPE=DISABLED\n\
         QUERY_SNIFF_TIMEOUT=5s\nREMOTE_SERVER_01={}\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT2@\nMONITORING_TYPE=DISABLED\nREMOTE_SERVER_01={}\n",
        server(&behind_tcp),
        server(&behind_http)
    );
    let broker = Broker::start(&ini).await;
    for (addr, origin) in [(broker.addr(), &behind_tcp), (broker.addr2(), &behind_http)] {
        let mut icons = Vec::new();
        for page in [
            "STATUS".to_string(),
            "CFG".to_string(),
            format!("ServerStatus/{}", origin.addr),
        ] {
            let profile = tempfile::tempdir().expect("profile dir");
            let url = format!("http://{addr}/TOTVS_BROKER_QUERY/{page}");
            let mut browser = DevTools::open(&binary, profile.path(), &url).await;
            // Loaded twice: what a browser asks for once a page has loaded, it has asked for
            // the first time by the time the second has loaded.
            for _ in 0..2 {
                browser
                    .text_until("the page", |text| text.contains("appbroker"))
                    .await;
                browser.reload().await;
            }
            browser
                .text_until("the page reloaded", |text| text.contains("appbroker"))
                .await;
            let declared = browser
                .evaluate("[...document.querySelectorAll(\"link[rel~='icon']\")].map(l => l.href)")
                .await;
            icons.push((url, declared));
        }
        // What the browsers sent has reached the origin by the time a request sent after
        // them has.
        marker(addr, "/marker").await;
        let targets: Vec<String> = origin.seen().into_iter().map(|s| s.target).collect();
        assert_eq!(
            targets,
            ["/marker"],
            "the status pages behind {addr} sent the browser to a server"
        );
        for (url, declared) in icons {
            let inline = declared.as_array().is_some_and(|hrefs| {
                !hrefs.is_empty()
                    && hrefs
                        .iter()
                        .all(|h| h.as_str().is_some_and(|h| h.starts_with("data:")))
            });
            assert!(inline, "{url} declares no inline icon: {declared}");
        }
    }
    // The application's own `/favicon.ico` still reaches it on an HTTP balancer.
    marker(broker.addr2(), "/favicon.ico").await;
    assert_eq!(behind_http.seen().last().unwrap().target, "/favicon.ico");
}
