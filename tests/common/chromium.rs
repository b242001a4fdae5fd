//! Headless Chromium, for the tests that load the broker's pages in a real browser
//! (tests/browser.rs, tests/tls.rs).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Chromium's first start on a fresh profile can take a few seconds on a loaded machine; a
/// run longer than this has hung, and is killed.
pub const BROWSER_DEADLINE: Duration = Duration::from_secs(60);

/// `chromium` on the PATH (Debian's package installs /usr/bin/chromium).
pub fn find_chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("chromium"))
        .find(|candidate| candidate.is_file())
}

/// Runs headless Chromium on `url` with `args`, bounded by [`BROWSER_DEADLINE`]; returns its
/// standard output. Chromium starts helper processes; it runs in a process group of its own
/// so that a hung run is killed whole.
pub async fn chromium(binary: &Path, profile: &Path, url: &str, args: &[&str]) -> Vec<u8> {
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
