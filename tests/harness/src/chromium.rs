//! Headless Chromium, for the tests that load the broker's pages in a real browser
//! (tests/browser.rs, tests/tls.rs), and [`DevTools`]: one Chromium kept running and driven
//! over its DevTools protocol (tests/affinity.rs), for what one `--dump-dom` run cannot show:
//! several loads in one browser, which keeps its session cookies between them, and the page as
//! it is once its scripts and WebSocket have run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Chromium's first start on a fresh profile can take a few seconds on a loaded machine; a
/// run longer than this has hung, and is killed.
const BROWSER_DEADLINE: Duration = Duration::from_secs(60);

/// Headless, and quiet: no sandbox (tests run as root), no GPU, no QUIC, and none of the
/// background traffic a first run makes.
const HEADLESS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// `chromium` on the PATH (Debian's package installs /usr/bin/chromium), as
/// [`find_program`](crate::find_program) finds it: `None` fails the test under `CI`.
pub fn find_chromium() -> Option<PathBuf> {
    crate::find_program("chromium")
}

/// Runs headless Chromium on `url` with `args`, bounded by [`BROWSER_DEADLINE`]; returns its
/// standard output. Chromium starts helper processes; it runs in a process group of its own
/// so that a hung run is killed whole.
pub async fn chromium(binary: &Path, profile: &Path, url: &str, args: &[&str]) -> Vec<u8> {
    let mut command = tokio::process::Command::new(binary);
    command
        .args(HEADLESS)
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

/// One headless Chromium kept running on a page, driven over the DevTools protocol (JSON
/// over a WebSocket): reload the page, read its text, read the browser's cookies. Killed,
/// with its helper processes, when dropped.
pub struct DevTools {
    child: tokio::process::Child,
    socket: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    /// The DevTools session attached to the page.
    session: String,
    next_id: u64,
}

impl DevTools {
    /// Starts headless Chromium on `url` with the profile `profile`, and attaches to its page.
    pub async fn open(binary: &Path, profile: &Path, url: &str) -> DevTools {
        DevTools::open_with(binary, profile, url, &[]).await
    }

    /// [`DevTools::open`] with more of Chromium's switches (`args`: a certificate to trust).
    pub async fn open_with(binary: &Path, profile: &Path, url: &str, args: &[&str]) -> DevTools {
        let mut command = tokio::process::Command::new(binary);
        command
            .args(HEADLESS)
            .args(args)
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let child = command.spawn().expect("start chromium");
        // Chromium writes the port it took, and its browser endpoint's path, into the profile.
        let active = profile.join("DevToolsActivePort");
        let written = "chromium's DevToolsActivePort";
        let every = Duration::from_millis(50);
        let (port, path) = crate::poll(written, every, BROWSER_DEADLINE, async || {
            let text = std::fs::read_to_string(&active).unwrap_or_default();
            match text.split_once('\n') {
                Some((port, path)) if path.trim().starts_with("/devtools/") => {
                    Ok((port.trim().to_string(), path.trim().to_string()))
                }
                _ => Err(text),
            }
        })
        .await;
        let stream = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
            .await
            .expect("connect to chromium's DevTools port");
        let (socket, _) =
            tokio_tungstenite::client_async(format!("ws://127.0.0.1:{port}{path}"), stream)
                .await
                .expect("chromium's DevTools WebSocket");
        let mut browser = DevTools {
            child,
            socket,
            session: String::new(),
            next_id: 0,
        };
        let targets = browser
            .browser_call("Target.getTargets", serde_json::json!({}))
            .await;
        let page = targets["targetInfos"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .unwrap_or_else(|| panic!("no page among chromium's targets: {targets}"))["targetId"]
            .clone();
        let attached = browser
            .browser_call(
                "Target.attachToTarget",
                serde_json::json!({"targetId": page, "flatten": true}),
            )
            .await;
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a DevTools session id")
            .to_string();
        browser
    }

    /// Calls `method` on the browser itself; its result.
    async fn browser_call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.send(method, params, None).await
    }

    /// Calls `method` on the page; its result.
    async fn page_call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let session = self.session.clone();
        self.send(method, params, Some(&session)).await
    }

    async fn send(
        &mut self,
        method: &str,
        params: serde_json::Value,
        session: Option<&str>,
    ) -> serde_json::Value {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        self.next_id += 1;
        let id = self.next_id;
        let mut call = serde_json::json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            call["sessionId"] = session.into();
        }
        self.socket
            .send(Message::text(call.to_string()))
            .await
            .expect("send to chromium");
        let answer = async {
            // Events come in between; the answer is the message with our id.
            while let Some(message) = self.socket.next().await {
                let message = message.expect("chromium's DevTools message");
                let Message::Text(text) = message else {
                    continue;
                };
                let value: serde_json::Value = serde_json::from_str(&text).expect("DevTools JSON");
                if value["id"] == id {
                    return value;
                }
            }
            panic!("chromium closed its DevTools socket during {method}");
        };
        let value = tokio::time::timeout(BROWSER_DEADLINE, answer)
            .await
            .unwrap_or_else(|_| panic!("chromium did not answer {method} in time"));
        assert!(
            value.get("error").is_none(),
            "{method} failed: {}",
            value["error"]
        );
        value["result"].clone()
    }

    /// The page's text as a reader sees it (`document.body.innerText`).
    pub async fn text(&mut self) -> String {
        self.evaluate("document.body ? document.body.innerText : ''")
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The value of the JavaScript `expression` in the page, as JSON.
    pub async fn evaluate(&mut self, expression: &str) -> serde_json::Value {
        let result = self
            .page_call(
                "Runtime.evaluate",
                serde_json::json!({"expression": expression, "returnByValue": true}),
            )
            .await;
        result["result"]["value"].clone()
    }

    /// Polls the page's text until `wanted` holds, within [`BROWSER_DEADLINE`]; the text.
    pub async fn text_until(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let every = Duration::from_millis(50);
        let showing = format!("the page to show {what}");
        crate::poll(&showing, every, BROWSER_DEADLINE, async || {
            let text = self.text().await;
            if wanted(&text) {
                Ok(text)
            } else {
                Err(format!("it shows:\n{text}"))
            }
        })
        .await
    }

    /// Reloads the page, bypassing the cache.
    pub async fn reload(&mut self) {
        self.page_call("Page.reload", serde_json::json!({"ignoreCache": true}))
            .await;
    }

    /// Navigates the page to `url` (credentials in it, `http://user:password@host/...`,
    /// sign in as a user typing them in the browser's prompt would: the browser keeps them for
    /// the site and sends them with every request after).
    pub async fn go(&mut self, url: &str) {
        self.page_call("Page.navigate", serde_json::json!({"url": url}))
            .await;
    }

    /// A PNG of the page laid out `width` CSS pixels wide, as tall as its content.
    pub async fn screenshot(&mut self, width: u32) -> Vec<u8> {
        let metrics = serde_json::json!({
            "width": width, "height": 800, "deviceScaleFactor": 1, "mobile": width < 700
        });
        self.page_call("Emulation.setDeviceMetricsOverride", metrics)
            .await;
        let height = self
            .evaluate("document.documentElement.scrollHeight")
            .await
            .as_f64()
            .unwrap_or(800.0);
        let shot = serde_json::json!({
            "format": "png",
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            "captureBeyondViewport": true
        });
        let result = self.page_call("Page.captureScreenshot", shot).await;
        let data = result["data"].as_str().expect("a screenshot's data");
        let png = base64_decode(data);
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
        png
    }

    /// The value of the browser's cookie `name`, if it holds one.
    pub async fn cookie(&mut self, name: &str) -> Option<String> {
        let result = self
            .browser_call("Storage.getCookies", serde_json::json!({}))
            .await;
        result["cookies"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)
            .and_then(|c| c["value"].as_str())
            .map(str::to_string)
    }
}

impl Drop for DevTools {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let group = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Standard base64 to bytes (DevTools' screenshots).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => u32::from(c - b'A'),
        b'a'..=b'z' => u32::from(c - b'a') + 26,
        b'0'..=b'9' => u32::from(c - b'0') + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = text
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | value(c) << (18 - 6 * i));
        let take = chunk.len().saturating_sub(1);
        out.extend_from_slice(&n.to_be_bytes()[1..=take]);
    }
    out
}
