//! The public monitors written for the TOTVS broker, read against our pages: ports of the page
//! parsers of peder1981/monitor (AdvPL) and tbarbito/protheus-broker-monitor (Python with
//! BeautifulSoup), which must give on our STATUS page and JSON the answers the broker's own
//! state gives (servers available, quarantined, disabled), and on the captured TOTVS pages
//! (tests/fixtures/captures) the answers those monitors' own tests expect.
//!
//! The ports follow the originals step by step, quirks included (that is the point: they are
//! what operators run). They are ports, not copies: each function names the one it follows.
// Helpers outside `#[test]` functions may unwrap too: a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use harness::*;

const CAPTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/captures");

fn capture(name: &str) -> String {
    let path = format!("{CAPTURES}/peder1981-monitor__{name}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// peder1981/monitor, `src/monitor_broker.prw` at commit 35a8f98429b8ec4c12cee349e2cb2755fde6a27e
/// (its cell splitting before that, at e63469bd7bcfb2adfb2d107e1026ee69fe79bbf0, as
/// [`peder::cells_before_35a8f98`]). AdvPL strings are 1-based; here they are byte offsets.
/// `StrTokArr(text, token)` is read as splitting on the whole token and keeping empty
/// pieces: the reading under which that monitor's own tests (tests/monitor_broker_test.prw:
/// 5 and 14 servers, the first one's address, 9 in quarantine) hold on the captured pages,
/// which [`the_ports_read_the_captured_totvs_pages_as_the_monitors_own_tests_expect`] checks.
mod peder {
    use serde_json::Value;

    /// `MonModoBroker`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Mode {
        Http,
        SmartClient,
    }

    /// A server as `MonExtrairLinhaServer` / `MonParseBrokerJson` fill it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Server {
        pub host_port: String,
        pub sessions: u64,
        pub connections: u64,
        /// `OK`, `QUARENTENA` or (JSON only) `DESABILITADO`.
        pub status: &'static str,
        /// `INICIOQUARENTENA`: the quarantine cell when not `-`.
        pub quarantine: String,
        pub users: u64,
        pub threads: u64,
        pub memory_kb: u64,
        pub cpu: u64,
        pub pid: u64,
    }

    /// `MonParseBrokerHtml` / `MonParseBrokerJson`'s result.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Parsed {
        pub valid: bool,
        pub active_sessions: u64,
        pub active_connections: u64,
        pub version: String,
        pub servers: Vec<Server>,
    }

    /// `At(needle, hay)`, from `from` on.
    fn at(hay: &str, needle: &str, from: usize) -> Option<usize> {
        hay.get(from..)?.find(needle).map(|i| i + from)
    }

    /// `AllTrim`: blanks at both ends.
    fn all_trim(text: &str) -> &str {
        text.trim_matches(' ')
    }

    /// `StrTokArr`, read as above.
    fn str_tok_arr<'a>(text: &'a str, token: &str) -> Vec<&'a str> {
        text.split(token).collect()
    }

    pub fn mode(html: &str) -> Option<Mode> {
        if html.contains("TOTVS Broker para HTTP") {
            Some(Mode::Http)
        } else if html.contains("TOTVS Broker para SmartClient") {
            Some(Mode::SmartClient)
        } else {
            None
        }
    }

    /// `MonSoNumero`: the digits at the start, thousands dots skipped.
    pub fn only_number(text: &str) -> u64 {
        let mut digits = String::new();
        for c in all_trim(text).chars() {
            if c.is_ascii_digit() {
                digits.push(c);
            } else if c == '.' && !digits.is_empty() {
            } else {
                break;
            }
        }
        // `Val("")` is 0.
        digits.parse().unwrap_or(0)
    }

    /// `MonPrimeiroNumero`.
    fn first_number(text: &str) -> u64 {
        match text.find(|c: char| c.is_ascii_digit()) {
            Some(at) => only_number(&text[at..]),
            None => 0,
        }
    }

    /// `MonExtrairAtivas`: (sessions, connections) from the text before each ` ativas`.
    fn active(html: &str) -> (u64, u64) {
        let (mut sessions, mut connections) = (0, 0);
        let mut from = 0;
        while let Some(found) = at(html, " ativas", from) {
            let before = &html[..found];
            let tag_end = before.rfind('>').map_or(0, |i| i + 1);
            let piece = &html[tag_end..found];
            if piece.contains("sess") {
                sessions = first_number(piece);
            } else if piece.contains("conex") {
                connections = first_number(piece);
            }
            from = found + " ativas".len();
        }
        (sessions, connections)
    }

    /// `MonExtrairVersao`: from `Vers` to the next `<br>`.
    fn version(html: &str) -> String {
        let Some(start) = html.find("Vers") else {
            return String::new();
        };
        match at(html, "<br>", start) {
            Some(end) => all_trim(&html[start..end]).to_string(),
            None => String::new(),
        }
    }

    /// `MonExtrairHostPorta`.
    fn host_port(cell: &str) -> String {
        let Some(found) = cell.find("ServerStatus/") else {
            return String::new();
        };
        let rest = &cell[found + "ServerStatus/".len()..];
        match rest.find('"') {
            Some(quote) => rest[..quote].to_string(),
            None => all_trim(rest).to_string(),
        }
    }

    /// `MonRemoverTags`.
    fn remove_tags(text: &str) -> String {
        let mut text = text.to_string();
        while let Some(open) = text.find('<') {
            match text[open..].find('>') {
                Some(close) => text.replace_range(open..open + close + 1, ""),
                None => {
                    text.truncate(open);
                    break;
                }
            }
        }
        text
    }

    /// `MonCelulasLinha` (35a8f98): split on `<td`, the content after the tag's `>`, up to
    /// `</td>`.
    pub fn cells(line: &str) -> Vec<String> {
        str_tok_arr(line, "<td")
            .into_iter()
            .skip(1)
            .map(|piece| {
                let content = piece.find('>').map_or("", |i| &piece[i + 1..]);
                let content = content.find("</td>").map_or(content, |i| &content[..i]);
                all_trim(content).to_string()
            })
            .collect()
    }

    /// `MonCelulasLinha` before 35a8f98 (e63469b): split on the literal `<td>`.
    pub fn cells_before_35a8f98(line: &str) -> Vec<String> {
        str_tok_arr(line, "<td>")
            .into_iter()
            .skip(1)
            .map(|piece| {
                let content = piece.find("</td>").map_or(piece, |i| &piece[..i]);
                all_trim(content).to_string()
            })
            .collect()
    }

    /// `MonExtrairLinhaServer`. AdvPL would stop with an error on a row of fewer cells than
    /// its layout reads; the port panics.
    fn server(line: &str, mode: Mode, split: fn(&str) -> Vec<String>) -> Server {
        let cells = split(line);
        let cell = |n: usize| -> &str {
            cells
                .get(n - 1)
                .unwrap_or_else(|| panic!("a row of {} cells: {line}", cells.len()))
        };
        let (sessions, connections, quarantine, users, threads, memory_kb, cpu, pid) = match mode {
            Mode::Http => (
                only_number(cell(2)),
                only_number(cell(3)),
                all_trim(&remove_tags(cell(4))).to_string(),
                only_number(cell(6)),
                only_number(cell(7)),
                only_number(cell(8)),
                only_number(cell(9)),
                only_number(cell(11)),
            ),
            Mode::SmartClient => (
                0,
                only_number(cell(2)),
                all_trim(&remove_tags(cell(3))).to_string(),
                only_number(cell(4)),
                only_number(cell(5)),
                only_number(cell(6)),
                only_number(cell(7)),
                0,
            ),
        };
        let (status, quarantine) = if quarantine == "-" {
            ("OK", String::new())
        } else {
            ("QUARENTENA", quarantine)
        };
        Server {
            host_port: host_port(cell(1)),
            sessions,
            connections,
            status,
            quarantine,
            users,
            threads,
            memory_kb,
            cpu,
            pid,
        }
    }

    /// `MonExtrairServers`: the rows holding `ServerStatus/` of the first table after
    /// `Servers (`, split on the literal `<tr>`.
    fn servers(html: &str, mode: Mode, split: fn(&str) -> Vec<String>) -> Vec<Server> {
        let Some(heading) = html.find("Servers (") else {
            return Vec::new();
        };
        let Some(table) = at(html, "<table", heading) else {
            return Vec::new();
        };
        let Some(end) = at(html, "</table>", table) else {
            return Vec::new();
        };
        str_tok_arr(&html[table..end + "</table>".len()], "<tr>")
            .into_iter()
            .filter(|line| line.contains("ServerStatus/"))
            .map(|line| server(line, mode, split))
            .collect()
    }

    /// `MonParseBrokerHtml`, with the cell splitting of 35a8f98.
    pub fn parse_html(html: &str) -> Parsed {
        parse_html_with(html, cells)
    }

    /// `MonParseBrokerHtml` with the given `MonCelulasLinha`.
    pub fn parse_html_with(html: &str, split: fn(&str) -> Vec<String>) -> Parsed {
        let Some(mode) = mode(html) else {
            return Parsed {
                valid: false,
                active_sessions: 0,
                active_connections: 0,
                version: String::new(),
                servers: Vec::new(),
            };
        };
        let (active_sessions, active_connections) = active(html);
        Parsed {
            valid: true,
            active_sessions,
            active_connections,
            version: version(html),
            servers: servers(html, mode, split),
        }
    }

    /// `MonParseBrokerJson`.
    pub fn parse_json(body: &str) -> Parsed {
        let invalid = Parsed {
            valid: false,
            active_sessions: 0,
            active_connections: 0,
            version: String::new(),
            servers: Vec::new(),
        };
        let Ok(json) = serde_json::from_str::<Value>(body) else {
            return invalid;
        };
        let Some(list) = json.get("servers") else {
            return invalid;
        };
        let number = |v: &Value| v.as_u64().unwrap_or(0);
        let text = |v: &Value| v.as_str().unwrap_or("").to_string();
        let servers = list
            .as_array()
            .expect("servers, an array")
            .iter()
            .map(|s| {
                let (status, quarantine) = if s["inquarantine"] == true {
                    ("QUARENTENA", text(&s["quarantine_entry_time"]))
                } else if s["disabled"] == true {
                    ("DESABILITADO", text(&s["disabled_entry_time"]))
                } else {
                    ("OK", String::new())
                };
                Server {
                    host_port: text(&s["server"]),
                    sessions: number(&s["sessions"]),
                    connections: number(&s["connections"]),
                    status,
                    quarantine,
                    users: number(&s["users"]),
                    threads: number(&s["threads"]),
                    memory_kb: number(&s["memory"]),
                    cpu: number(&s["cpu"]),
                    pid: number(&s["pid"]),
                }
            })
            .collect();
        Parsed {
            valid: true,
            version: json.get("version").map(text).unwrap_or_default(),
            active_sessions: json.get("total").map_or(0, |t| number(&t["sessions"])),
            active_connections: json.get("total").map_or(0, |t| number(&t["connections"])),
            servers,
        }
    }

    /// `MonParseBrokerResposta`: JSON when the body starts with `{` and parses as a broker's,
    /// else HTML.
    pub fn parse_answer(body: &str) -> Parsed {
        let trimmed = body.trim_matches(' ');
        if trimmed.starts_with('{') {
            let parsed = parse_json(trimmed);
            if parsed.valid {
                return parsed;
            }
        }
        parse_html(body)
    }
}

/// tbarbito/protheus-broker-monitor, `src/broker_monitor/monitor.py` (`parse_broker_page`,
/// `SlaveStatus.is_quarantined`) at commit ca8f7c84bc7b7b1c8a977ce68f060c4ee2657a86. It
/// parses with BeautifulSoup's `html.parser` builder, whose tree this module builds the same
/// way: no HTML5 repairs; an end tag closes the innermost open element of its name and every
/// element opened inside it, and is ignored when none is open; void elements (`br`, `meta`,
/// ...) hold nothing; `script` and `style` hold raw text.
mod tbarbito {
    /// `SlaveStatus`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Slave {
        pub address: String,
        pub quarantine: String,
    }

    impl Slave {
        /// `is_quarantined`: anything but empty or `-`.
        pub fn is_quarantined(&self) -> bool {
            !matches!(self.quarantine.as_str(), "" | "-")
        }
    }

    enum Node {
        Element {
            name: String,
            href: Option<String>,
            children: Vec<usize>,
        },
        Text(String),
    }

    struct Tree {
        nodes: Vec<Node>,
        parents: Vec<Option<usize>>,
    }

    const VOID: &[&str] = &[
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
        "source", "track", "wbr", "basefont", "bgsound", "command", "frame", "image", "isindex",
        "keygen", "menuitem", "nextid", "spacer",
    ];

    /// Python's `html.unescape` for what a page holds: named basics and numeric references.
    fn unescape(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(amp) = rest.find('&') {
            out.push_str(&rest[..amp]);
            rest = &rest[amp..];
            let end = rest.find(';').filter(|&e| e <= 10);
            let decoded = end.and_then(|end| {
                let name = &rest[1..end];
                let c = match name {
                    "amp" => Some('&'),
                    "lt" => Some('<'),
                    "gt" => Some('>'),
                    "quot" => Some('"'),
                    "apos" => Some('\''),
                    "nbsp" => Some('\u{a0}'),
                    _ => {
                        let number = name.strip_prefix('#')?;
                        let code = match number.strip_prefix(['x', 'X']) {
                            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                            None => number.parse().ok()?,
                        };
                        char::from_u32(code)
                    }
                };
                c.map(|c| (c, end))
            });
            match decoded {
                Some((c, end)) => {
                    out.push(c);
                    rest = &rest[end + 1..];
                }
                None => {
                    out.push('&');
                    rest = &rest[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// The value of `href` among a start tag's attributes (`name=value`, quoted or not).
    fn href(attributes: &str) -> Option<String> {
        let mut rest = attributes;
        loop {
            rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == '/');
            if rest.is_empty() {
                return None;
            }
            let name_end = rest
                .find(|c: char| c.is_whitespace() || c == '=' || c == '/')
                .unwrap_or(rest.len());
            let name = rest[..name_end].to_ascii_lowercase();
            rest = rest[name_end..].trim_start();
            let value = if let Some(after) = rest.strip_prefix('=') {
                let after = after.trim_start();
                let (value, next) = match after.chars().next() {
                    Some(q @ ('"' | '\'')) => {
                        let close = after[1..].find(q).map_or(after.len(), |i| i + 1);
                        (&after[1..close], after.get(close + 1..).unwrap_or(""))
                    }
                    _ => {
                        let end = after.find(char::is_whitespace).unwrap_or(after.len());
                        (&after[..end], &after[end..])
                    }
                };
                rest = next;
                Some(unescape(value))
            } else {
                None
            };
            if name == "href" {
                return Some(value.unwrap_or_default());
            }
        }
    }

    impl Tree {
        fn parse(html: &str) -> Tree {
            let mut tree = Tree {
                nodes: vec![Node::Element {
                    name: "[document]".into(),
                    href: None,
                    children: Vec::new(),
                }],
                parents: vec![None],
            };
            let mut open = vec![0usize];
            let mut rest = html;
            while !rest.is_empty() {
                let Some(lt) = rest.find('<') else {
                    tree.text(*open.last().unwrap(), rest);
                    break;
                };
                if lt > 0 {
                    tree.text(*open.last().unwrap(), &rest[..lt]);
                    rest = &rest[lt..];
                    continue;
                }
                if let Some(comment) = rest.strip_prefix("<!--") {
                    rest = comment.find("-->").map_or("", |e| &comment[e + 3..]);
                    continue;
                }
                if rest.starts_with("<!") || rest.starts_with("<?") {
                    rest = rest.find('>').map_or("", |e| &rest[e + 1..]);
                    continue;
                }
                let closing = rest.starts_with("</");
                let body = &rest[if closing { 2 } else { 1 }..];
                if !body.starts_with(|c: char| c.is_ascii_alphabetic()) {
                    // Not a tag: a `<` in the text.
                    tree.text(*open.last().unwrap(), "<");
                    rest = &rest[1..];
                    continue;
                }
                let Some(gt) = body.find('>') else {
                    tree.text(*open.last().unwrap(), rest);
                    break;
                };
                let tag = &body[..gt];
                rest = &body[gt + 1..];
                let name_end = tag
                    .find(|c: char| c.is_whitespace() || c == '/')
                    .unwrap_or(tag.len());
                let name = tag[..name_end].to_ascii_lowercase();
                if closing {
                    // `_popToTag`: close the innermost open element of that name, if any.
                    if let Some(depth) = open.iter().rposition(|&n| tree.name(n) == name)
                        && depth > 0
                    {
                        open.truncate(depth);
                    }
                    continue;
                }
                let parent = *open.last().unwrap();
                let element = tree.push(
                    parent,
                    Node::Element {
                        name: name.clone(),
                        href: href(&tag[name_end..]),
                        children: Vec::new(),
                    },
                );
                if name == "script" || name == "style" {
                    let end = rest
                        .to_ascii_lowercase()
                        .find(&format!("</{name}"))
                        .unwrap_or(rest.len());
                    tree.push(element, Node::Text(rest[..end].to_string()));
                    rest = &rest[end..];
                    rest = rest.find('>').map_or("", |e| &rest[e + 1..]);
                } else if !VOID.contains(&name.as_str()) && !tag.ends_with('/') {
                    open.push(element);
                }
            }
            tree
        }

        fn push(&mut self, parent: usize, node: Node) -> usize {
            let index = self.nodes.len();
            self.nodes.push(node);
            self.parents.push(Some(parent));
            if let Node::Element { children, .. } = &mut self.nodes[parent] {
                children.push(index);
            }
            index
        }

        fn text(&mut self, parent: usize, text: &str) {
            self.push(parent, Node::Text(unescape(text)));
        }

        fn name(&self, node: usize) -> &str {
            match &self.nodes[node] {
                Node::Element { name, .. } => name,
                Node::Text(_) => "",
            }
        }

        /// `find_all(name)`: every element of that name under `node`, in document order.
        fn find_all(&self, node: usize, name: &str, found: &mut Vec<usize>) {
            if let Node::Element { children, .. } = &self.nodes[node] {
                for &child in children {
                    if self.name(child) == name {
                        found.push(child);
                    }
                    self.find_all(child, name, found);
                }
            }
        }

        /// `get_text(strip=True)`: every text under `node`, each stripped, empty ones left
        /// out, joined with nothing.
        fn text_stripped(&self, node: usize, out: &mut String) {
            match &self.nodes[node] {
                Node::Text(text) => out.push_str(text.trim()),
                Node::Element { children, .. } => {
                    for &child in children {
                        self.text_stripped(child, out);
                    }
                }
            }
        }
    }

    /// `re.search(r"ServerStatus/([\d.]+):(\d+)", href)`: the address it captures.
    fn server_status(href: &str) -> Option<String> {
        let mut from = 0;
        while let Some(found) = href[from..].find("ServerStatus/") {
            let start = from + found + "ServerStatus/".len();
            let rest = &href[start..];
            let host_end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            if host_end > 0 && rest[host_end..].starts_with(':') {
                let port = &rest[host_end + 1..];
                let port_end = port
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(port.len());
                if port_end > 0 {
                    return Some(format!("{}:{}", &rest[..host_end], &port[..port_end]));
                }
            }
            from = start;
        }
        None
    }

    /// `parse_broker_page`.
    pub fn parse_broker_page(html: &str) -> Vec<Slave> {
        let tree = Tree::parse(html);
        let mut anchors = Vec::new();
        tree.find_all(0, "a", &mut anchors);
        let mut slaves = Vec::new();
        for a in anchors {
            let Node::Element {
                href: Some(href), ..
            } = &tree.nodes[a]
            else {
                continue;
            };
            let Some(address) = server_status(href) else {
                continue;
            };
            // `find_parent("tr")`.
            let mut row = tree.parents[a];
            while let Some(node) = row.filter(|&n| tree.name(n) != "tr") {
                row = tree.parents[node];
            }
            let Some(row) = row else {
                continue;
            };
            let mut cells = Vec::new();
            tree.find_all(row, "td", &mut cells);
            if cells.len() < 3 {
                continue;
            }
            let mut quarantine = String::new();
            tree.text_stripped(cells[2], &mut quarantine);
            slaves.push(Slave {
                address,
                quarantine,
            });
        }
        slaves
    }
}

#[test]
fn the_ports_read_the_captured_totvs_pages_as_the_monitors_own_tests_expect() {
    let smartclient = capture("broker_smartclient_quarentena.html");
    let http = capture("broker_http_ok.html");
    let json = capture("broker_json_real.json");

    // peder1981's tests/monitor_broker_test.prw, HTTP page (teste1..15).
    let p = peder::parse_html(&http);
    assert!(p.valid);
    assert_eq!((p.active_sessions, p.active_connections), (59, 175));
    assert!(p.version.contains("24.3.1.9"), "{}", p.version);
    assert_eq!(p.servers.len(), 5);
    let first = &p.servers[0];
    assert_eq!(first.host_port, "10.0.100.115:1236");
    assert_eq!(
        (
            first.sessions,
            first.connections,
            first.users,
            first.threads
        ),
        (11, 33, 25, 65)
    );
    assert_eq!(
        (first.memory_kb, first.cpu, first.pid),
        (4_087_092, 37, 3_259_754)
    );
    assert_eq!((first.status, first.quarantine.as_str()), ("OK", ""));

    // SmartClient page (teste16..29): 14 servers, 9 in quarantine.
    let p = peder::parse_html(&smartclient);
    assert!(p.valid);
    assert_eq!(p.active_connections, 43);
    assert!(
        p.version.starts_with("Versão: Broker 20.3.2.11"),
        "{}",
        p.version
    );
    assert_eq!(p.servers.len(), 14);
    assert_eq!((p.servers[0].status, p.servers[0].connections), ("OK", 8));
    let fifth = &p.servers[4];
    assert_eq!(fifth.host_port, "10.0.100.38:1240");
    assert_eq!(
        (fifth.status, fifth.quarantine.as_str()),
        ("QUARENTENA", "12:34:30")
    );
    assert_eq!((fifth.users, fifth.memory_kb), (0, 0));
    assert_eq!(p.servers[7].status, "OK");
    assert_eq!(
        (p.servers[13].status, p.servers[13].quarantine.as_str()),
        ("QUARENTENA", "12:34:31")
    );
    let quarantined: Vec<&str> = p
        .servers
        .iter()
        .filter(|s| s.status == "QUARENTENA")
        .map(|s| s.host_port.as_str())
        .collect();
    assert_eq!(quarantined.len(), 9);
    // The earlier cell splitting reads the TOTVS page the same way (its cells are bare).
    assert_eq!(
        peder::parse_html_with(&smartclient, peder::cells_before_35a8f98),
        p
    );

    // The JSON (testeJson1..9), and the dispatcher's choice (testeResp1..4).
    let j = peder::parse_json(&json);
    assert!(j.valid);
    assert_eq!((j.active_sessions, j.active_connections), (55, 156));
    assert_eq!(j.version, "24.3.1.9");
    assert_eq!(j.servers.len(), 5);
    assert_eq!(j.servers[0].host_port, "10.0.100.62:1236");
    assert_eq!(
        (j.servers[0].users, j.servers[0].memory_kb),
        (16, 4_705_492)
    );
    assert!(j.servers.iter().all(|s| s.status == "OK"));
    assert_eq!(peder::parse_answer(&json), j);
    assert_eq!(peder::parse_answer(&smartclient), p);
    assert!(!peder::parse_answer("nada disso").valid);

    // tbarbito on the SmartClient page: the same 14 servers, the same 9 in quarantine.
    let slaves = tbarbito::parse_broker_page(&smartclient);
    let addresses: Vec<&str> = slaves.iter().map(|s| s.address.as_str()).collect();
    let peder_addresses: Vec<&str> = p.servers.iter().map(|s| s.host_port.as_str()).collect();
    assert_eq!(addresses, peder_addresses);
    let in_quarantine: Vec<&str> = slaves
        .iter()
        .filter(|s| s.is_quarantined())
        .map(|s| s.address.as_str())
        .collect();
    assert_eq!(in_quarantine, quarantined);
    assert_eq!(slaves[4].quarantine, "12:34:30");
    // It reads the third cell whatever the layout: on the HTTP broker's page that is the
    // connections (`Sessões` comes second there), so it is a monitor of SmartClient pages.
    let slaves = tbarbito::parse_broker_page(&http);
    let third: Vec<&str> = slaves.iter().map(|s| s.quarantine.as_str()).collect();
    assert_eq!(third, ["33", "52", "45", "20", "25"]);
}

/// Answers of the monitors for one page, per server: (address, quarantined?).
fn quarantine_answers(peder: &peder::Parsed, tbarbito: &[tbarbito::Slave]) -> Vec<(String, bool)> {
    let from_peder: Vec<(String, bool)> = peder
        .servers
        .iter()
        .map(|s| (s.host_port.clone(), s.status == "QUARENTENA"))
        .collect();
    let from_tbarbito: Vec<(String, bool)> = tbarbito
        .iter()
        .map(|s| (s.address.clone(), s.is_quarantined()))
        .collect();
    assert_eq!(from_peder, from_tbarbito, "the two monitors disagree");
    from_peder
}

/// The status page as the monitors' configured URL (…/totvs_broker_query/status) gets it,
/// asked the way Python's requests asks: HTML.
async fn status_page_as_python_asks(addr: std::net::SocketAddr) -> String {
    http_get(
        addr,
        "/totvs_broker_query/status",
        &[("Accept", "*/*"), ("User-Agent", "python-requests/2.32.3")],
    )
    .await
    .text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_monitors_read_our_pages_as_the_broker_sees_its_servers() {
    let a = TestServer::start("a").await;
    let mut b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    let d = TestServer::start("d").await;
    for language in ["en", "pt-BR"] {
        // a takes the clients; b is quarantined; c is disabled (weight 0); d is available.
        let mut ini = ini_for(&[], "SORT_METHOD=ROUND_ROBIN")
            .replace("[General]\n", &format!("[General]\nLANGUAGE={language}\n"));
        ini.push_str(&format!(
            "REMOTE_SERVER_01={} 5\nREMOTE_SERVER_02={}\nREMOTE_SERVER_03={} 0\nREMOTE_SERVER_04={}\n",
            a.ini(),
            b.ini(),
            c.ini(),
            d.ini()
        ));
        let broker = InProcess::start(&ini).await;
        b.stop().await;
        // Clients until b has been tried (and so quarantined) and a holds two of them.
        let mut held = Vec::new();
        let ready = "b quarantined and a holding two clients";
        poll(ready, Duration::ZERO, DEADLINE, async || {
            let status = query_json(broker.addr()).await;
            let on_a = status["servers"][0]["connections"].as_u64().unwrap();
            if status["servers"][1]["inquarantine"] == true && on_a >= 2 {
                return Ok(());
            }
            // Every client is held to the end: one dropped here would still be counted by
            // the JSON read below and no longer by the page read after it.
            let (stream, _) = hold(broker.addr()).await;
            held.push(stream);
            Err(format!("{status:#}"))
        })
        .await;
        let truth = query_json(broker.addr()).await;
        let expected: Vec<(String, bool)> = [&a, &b, &c, &d]
            .iter()
            .zip([false, true, false, false])
            .map(|(s, q)| (s.address(), q))
            .collect();
        let active: u64 = truth["total"]["connections"].as_u64().unwrap();

        // Their configured URL (…/totvs_broker_query/status): HTML.
        let html = status_page_as_python_asks(broker.addr()).await;
        let p = peder::parse_html(&html);
        assert!(
            p.valid,
            "peder1981's monitor does not recognise the page:\n{html}"
        );
        assert!(
            p.version
                .ends_with(&format!("appbroker {}", env!("CARGO_PKG_VERSION"))),
            "{:?}",
            p.version
        );
        let slaves = tbarbito::parse_broker_page(&html);
        assert_eq!(quarantine_answers(&p, &slaves), expected, "{language}");
        let connections: Vec<u64> = p.servers.iter().map(|s| s.connections).collect();
        let truth_connections: Vec<u64> = truth["servers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["connections"].as_u64().unwrap())
            .collect();
        assert_eq!(connections, truth_connections);
        assert_eq!(p.servers[1].quarantine, truth["servers"][1]["quarantine"]);
        // The cell splitting before 35a8f98 reads our rows the same way.
        assert_eq!(
            quarantine_answers(
                &peder::parse_html_with(&html, peder::cells_before_35a8f98),
                &slaves
            ),
            expected
        );
        if language == "pt-BR" {
            assert_eq!(p.active_connections, active, "the ` ativas` count");
        }

        // peder1981's default URL, bare and without headers: the JSON, where a disabled
        // server is told apart.
        let body = http_get(broker.addr(), "/totvs_broker_query", &[])
            .await
            .text();
        let j = peder::parse_answer(&body);
        assert!(j.valid);
        let statuses: Vec<&str> = j.servers.iter().map(|s| s.status).collect();
        assert_eq!(statuses, ["OK", "QUARENTENA", "DESABILITADO", "OK"]);
        assert_eq!(j.active_connections, active);
        assert_eq!(
            j.servers[1].quarantine,
            truth["servers"][1]["quarantine_entry_time"]
        );
        drop(held);
        b.resume().await;
    }
}

/// A server an operator disabled (`appbroker ctl disable`) is in maintenance, not failing:
/// tbarbito's monitor restarts the AppServers it reads as quarantined, so it must not read
/// this one so, on the page or in the JSON; peder1981's reads it as disabled. One that is
/// disabled and in quarantine as well is told as quarantined: it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_disabled_by_an_operator_is_not_read_as_quarantined() {
    let a = TestServer::start("a").await;
    let b = TestServer::start("b").await;
    let c = TestServer::start("c").await;
    let broker = InProcess::start(&ini_for(&[&a, &b, &c], "")).await;
    let balancers = broker.broker.control().balancers();
    let balancer = &balancers[0];
    let hold = |reason: &str| appbroker::balancer::rules::overrides::Hold {
        mode: appbroker::balancer::rules::overrides::Mode::Disabled,
        reason: reason.into(),
        by: "uid 0".into(),
        since_wall_ms: 1_800_000_000_000,
    };
    let (second, third) = (
        balancer.find_server("02").unwrap(),
        balancer.find_server("03").unwrap(),
    );
    balancer.hold(&second, hold("AppServer upgrade"));
    balancer.hold(&third, hold("and failing"));
    balancer.force_quarantine(&third, std::time::Duration::from_secs(600), "uid 0");

    let html = status_page_as_python_asks(broker.addr()).await;
    assert!(html.contains("AppServer upgrade"), "the page says why");
    let slaves = tbarbito::parse_broker_page(&html);
    let read: Vec<(String, bool)> = slaves
        .iter()
        .map(|s| (s.address.clone(), s.is_quarantined()))
        .collect();
    assert_eq!(
        read,
        [
            (a.address(), false),
            (b.address(), false),
            (c.address(), true)
        ]
    );
    let p = peder::parse_html(&html);
    assert!(p.valid);
    let body = http_get(broker.addr(), "/totvs_broker_query", &[])
        .await
        .text();
    let j = peder::parse_answer(&body);
    let statuses: Vec<&str> = j.servers.iter().map(|s| s.status).collect();
    assert_eq!(statuses, ["OK", "DESABILITADO", "QUARENTENA"]);
}

#[test]
fn the_ports_find_nothing_on_a_page_that_is_not_a_broker_s() {
    let page = "<html><body><h2>Servers (1)</h2><table><tr><td>x</td></tr></table></body></html>";
    assert!(!peder::parse_html(page).valid);
    assert!(tbarbito::parse_broker_page(page).is_empty());
}

/// A loopback HTTP server that answers every request `200 ok` and closes.
async fn ok_server() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peder1981_reads_an_http_balancers_page_in_the_http_brokers_layout() {
    let up = ok_server().await;
    // Nothing listens there: the first request quarantines it.
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let ini = format!(
        "[General]\nLANGUAGE=pt-BR\n[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\n\
         LOCAL_SERVER_PORT=@PORT@\nMONITORING_TYPE=DISABLED\nREMOTE_SERVER_01={down}\n\
         REMOTE_SERVER_02={up}\n"
    )
    .replace(
        &format!("={down}"),
        &format!("={} {}", down.ip(), down.port()),
    )
    .replace(&format!("={up}"), &format!("={} {}", up.ip(), up.port()));
    let broker = InProcess::start(&ini).await;
    let answered = http_get(broker.addr(), "/webapp/", &[]).await;
    assert!(answered.text().contains("ok"), "served by the next server");
    let truth = query_json(broker.addr()).await;
    assert_eq!(truth["servers"][0]["inquarantine"], true, "{truth:#}");

    let html = http_get(broker.addr(), "/TOTVS_BROKER_QUERY/STATUS", &[])
        .await
        .text();
    assert_eq!(peder::mode(&html), Some(peder::Mode::Http), "{html}");
    let p = peder::parse_html(&html);
    assert!(p.valid);
    assert_eq!(p.active_sessions, 0, "no sessions until affinity");
    // What the layout promises: address, sessions, connections, the quarantine (the cells
    // after those are appbroker's own, as on the TCP page).
    let contract = |p: &peder::Parsed| -> Vec<(String, &'static str, String, u64, u64)> {
        p.servers
            .iter()
            .map(|s| {
                (
                    s.host_port.clone(),
                    s.status,
                    s.quarantine.clone(),
                    s.sessions,
                    s.connections,
                )
            })
            .collect()
    };
    let rows = contract(&p);
    // The quarantine's start in the 4th cell, as the TOTVS HTTP broker writes it.
    let since = truth["servers"][0]["quarantine_entry_time"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        rows,
        [
            (down.to_string(), "QUARENTENA", since, 0, 0),
            (up.to_string(), "OK", String::new(), 0, 0),
        ]
    );
    // The cell splitting before 35a8f98 reads the rows the same way.
    let before = peder::parse_html_with(&html, peder::cells_before_35a8f98);
    assert_eq!(contract(&before), rows);
    // tbarbito's reads the third cell, the connections on this layout (`0` is neither empty
    // nor `-`): every server is quarantined to it, the available one too. What
    // docs/operations.md warns of: point it at a TCP balancer's page only.
    let slaves = tbarbito::parse_broker_page(&html);
    let third: Vec<(&str, bool)> = slaves
        .iter()
        .map(|s| (s.quarantine.as_str(), s.is_quarantined()))
        .collect();
    assert_eq!(third, [("0", true), ("0", true)]);
}
