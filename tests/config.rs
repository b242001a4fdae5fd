//! `appbroker --check` and `--help` through the real binary: every invalid fixture gives exit 2
//! and the messages it states (file, line, section, key), every valid file gives exit 0, and
//! the printed configuration parses back to the same configuration.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use harness::{binary, run_bounded, run_cli};

const VALID: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/valid");
const INVALID: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/invalid");
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/appserver.ini.example");

/// The `.ini` files of a fixture folder, sorted. Fails when there are none: a filter that
/// matches nothing would test nothing (the rathole bug).
fn fixtures(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {dir}: {e}"))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|ext| ext == "ini"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .ini fixtures found in {dir}");
    files
}

/// `appbroker --check --config <path>`: (exit code, stdout, stderr).
fn check(path: &Path) -> (i32, String, String) {
    run_cli(&["--check", "--config", path.to_str().expect("UTF-8 path")])
}

/// One `; expect: <line>: <message>` of an invalid fixture; `-` for an error of the whole file.
struct Expected {
    line: Option<usize>,
    message: String,
}

fn expectations(path: &Path) -> Vec<Expected> {
    let text = std::fs::read_to_string(path).expect("read fixture");
    text.lines()
        .filter_map(|l| l.strip_prefix("; expect:"))
        .map(|rest| {
            let (line, message) = rest
                .trim()
                .split_once(": ")
                .unwrap_or_else(|| panic!("{}: malformed `; expect:` line", path.display()));
            Expected {
                line: (line != "-").then(|| line.parse().expect("expect line number")),
                message: message.to_string(),
            }
        })
        .collect()
}

/// What is wrong with how `--check` treats one invalid fixture; empty when all is right.
fn invalid_fixture_problems(path: &Path) -> Vec<String> {
    let file = path.display().to_string();
    let expected = expectations(path);
    let mut problems = Vec::new();
    if expected.is_empty() {
        problems.push("states no `; expect:` message".to_string());
    }
    let (code, stdout, stderr) = check(path);
    if code != 2 {
        problems.push(format!("exit code {code}, expected 2"));
    }
    if !stdout.is_empty() {
        problems.push(format!("printed a configuration:\n{stdout}"));
    }
    // Each error is one line starting with the file name, then its line number (none for an
    // error of the whole file).
    let errors: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(&format!("{file}:")))
        .collect();
    for e in &expected {
        let at = match e.line {
            Some(line) => format!("{file}:{line}: "),
            None => format!("{file}: "),
        };
        if !errors
            .iter()
            .any(|l| l.starts_with(&at) && l.contains(&e.message))
        {
            problems.push(format!("no error `{at}... {}`", e.message));
        }
    }
    // Every error is stated in the fixture: nothing spurious, nothing unreported.
    if errors.len() != expected.len() {
        problems.push(format!(
            "{} errors reported, the fixture states {}",
            errors.len(),
            expected.len()
        ));
    }
    if !stderr.contains(&format!("in {file}:")) {
        problems.push("no summary line naming the file".into());
    }
    if !problems.is_empty() {
        problems.push(format!("stderr was:\n{stderr}"));
    }
    problems
        .into_iter()
        .map(|p| {
            format!(
                "{}: {p}",
                path.file_name().unwrap_or_default().to_string_lossy()
            )
        })
        .collect()
}

#[test]
fn every_invalid_fixture_exits_2_with_the_messages_it_states() {
    let mut failures = Vec::new();
    for path in fixtures(INVALID) {
        let problems = invalid_fixture_problems(&path);
        failures.extend(problems);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_several_errors_fixture_reports_each_on_its_own_line() {
    // All errors at once, in line order, one line each. The fixture must stay rich enough to
    // show it.
    let path = Path::new(INVALID).join("many_errors.ini");
    let expected = expectations(&path);
    assert!(expected.len() >= 5, "many_errors.ini lost its errors");
    let (code, _, stderr) = check(&path);
    assert_eq!(code, 2, "{stderr}");
    let file = path.display().to_string();
    assert!(
        stderr.contains(&format!("{} errors in {file}", expected.len())),
        "{stderr}"
    );
    let lines: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("{file}:")))
        .filter_map(|rest| rest.split(':').next()?.parse().ok())
        .collect();
    let wanted: Vec<usize> = expected.iter().filter_map(|e| e.line).collect();
    assert_eq!(lines, wanted, "errors in line order, one each:\n{stderr}");
}

#[test]
fn every_valid_fixture_passes_the_check() {
    for path in fixtures(VALID) {
        let (code, stdout, stderr) = check(&path);
        assert_eq!(code, 0, "{}:\n{stderr}", path.display());
        assert!(
            stdout.starts_with(&format!("; Effective configuration of {}", path.display())),
            "{}:\n{stdout}",
            path.display()
        );
        assert_ok_line(&stderr, &path);
    }
}

/// `--check`'s standard error for a valid file: notices, if any, then one line saying the
/// configuration is OK and naming the file (standard output is only the INI).
fn assert_ok_line(stderr: &str, path: &Path) {
    let mut lines: Vec<&str> = stderr.lines().collect();
    let last = lines.pop().unwrap_or_default();
    assert!(
        last.starts_with(&format!("configuration OK: {} (", path.display())),
        "{}: no `configuration OK` line last:\n{stderr}",
        path.display()
    );
    assert!(
        lines.iter().all(|l| l.starts_with("notice: ")),
        "{}: only notices may go to stderr before it:\n{stderr}",
        path.display()
    );
}

#[test]
fn the_shipped_example_passes_the_check_without_notices() {
    let (code, stdout, stderr) = check(Path::new(EXAMPLE));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stderr,
        format!("configuration OK: {EXAMPLE} (3 balancers, 7 servers)\n"),
        "the example should need no notice"
    );
    let printed = sections(&stdout);
    let names: Vec<&str> = printed.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "General",
            "BALANCE_SMART_CLIENT_DESKTOP",
            "BALANCE_WEB_SERVICES",
            "BALANCE_HTTP"
        ]
    );
}

/// A printout as (section, keys other than REMOTE_SERVER_*, REMOTE_SERVER_* lines in order),
/// comments dropped: what makes two printouts the same configuration.
type Printed = Vec<(String, (BTreeMap<String, String>, Vec<String>))>;

fn sections(ini: &str) -> Printed {
    let mut out: Printed = Vec::new();
    for line in ini.lines().map(str::trim) {
        if line.is_empty() || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            out.push((name.to_string(), Default::default()));
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not KEY=VALUE: {line}"));
        let (_, (keys, servers)) = out.last_mut().expect("key before a section");
        if key.starts_with("REMOTE_SERVER_") {
            // Server order matters: ties are broken in configuration order.
            servers.push(line.to_string());
        } else {
            assert!(
                keys.insert(key.to_string(), value.to_string()).is_none(),
                "{key} printed twice"
            );
        }
    }
    out
}

/// Runs `--check` on `text` written to a temporary file; returns its stdout.
fn check_text(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write printout");
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 0, "{name} does not pass --check:\n{stderr}\n{text}");
    stdout
}

fn without_first_line(text: &str) -> &str {
    text.split_once('\n').map_or("", |(_, rest)| rest)
}

#[test]
fn the_printed_configuration_parses_back_to_the_same() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = fixtures(VALID);
    files.push(PathBuf::from(EXAMPLE));
    for path in files {
        let (code, first, stderr) = check(&path);
        assert_eq!(code, 0, "{}:\n{stderr}", path.display());
        let second = check_text(dir.path(), "printed.ini", &first);
        assert_eq!(
            sections(&first),
            sections(&second),
            "{}: the printout does not read back to the same configuration:\n{first}\n---\n{second}",
            path.display()
        );
        // Once every key is written out, printing is a fixed point: --check on a printout
        // prints it again, apart from the line naming the file.
        let third = check_text(dir.path(), "printed-again.ini", &second);
        assert_eq!(
            without_first_line(&second),
            without_first_line(&third),
            "{}",
            path.display()
        );
    }
}

#[test]
fn check_neither_binds_nor_resolves() {
    // The port is held here and the server's name cannot resolve: --check must not care.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    let port = taken.local_addr().expect("local addr").port();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    std::fs::write(
        &path,
        format!(
            "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT={port}\n\
             REMOTE_SERVER_01=no-such-host.invalid 6001\n"
        ),
    )
    .expect("write ini");
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("\nREMOTE_SERVER_01=no-such-host.invalid 6001 1\n"),
        "{stdout}"
    );
}

#[test]
fn every_key_is_printed_with_its_default() {
    let (code, stdout, stderr) = check(&Path::new(VALID).join("minimal.ini"));
    assert_eq!(code, 0, "{stderr}");
    let printed = sections(&stdout);
    let general: BTreeMap<String, String> = [
        ("CONSOLELOG", "1"),
        ("CONSOLEFILE", ""),
        ("CONSOLEMAXSIZE", "10485760"),
        ("CONSOLELOGDATE", "1"),
        ("SHUTDOWN_GRACE", "0s"),
        ("SHUTDOWN_TIMEOUT", "30s"),
        ("LANGUAGE", "en"),
        ("WORKERS", "0"),
        ("DNS_MAX_LOOKUPS", "32"),
        ("HTTP_HEAD_MEMORY", "64"),
        ("CONTROL_SOCKET", ""),
        ("CONTROL_GROUP", ""),
        ("STATE_FILE", ""),
        ("SESSION_SECRET", ""),
        ("SESSION_SECRET_PREVIOUS", ""),
        ("ADMIN_USERS", ""),
        ("ADMIN_PLAIN_HTTP", "0"),
        ("UPGRADE_TIMEOUT", "30s"),
        ("WATCHDOG_TIMEOUT", "10s"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    let balancer: BTreeMap<String, String> = [
        ("LOCAL_SERVER_ADDRESS", "0.0.0.0"),
        ("LOCAL_SERVER_PORT", "5000"),
        ("SORT_METHOD", "CONNECTION"),
        ("MONITORING_TYPE", "CONNECTION"),
        ("MONITOR_INTERVAL", "60s"),
        ("QUARANTINE_TIME", "120s"),
        ("CONNECT_TIMEOUT", "5s"),
        ("MAX_ATTEMPTS", "3"),
        ("MAX_CONNECTIONS", "10000"),
        ("MAX_CONNECTIONS_PER_CLIENT", "0"),
        ("LOG_CONNECTIONS", "1"),
        ("QUERY_ENABLED", "1"),
        ("QUERY_ALLOW", "0.0.0.0/0, ::/0"),
        ("QUERY_MAX_CONNECTIONS", "64"),
        ("QUERY_SNIFF_TIMEOUT", "200ms"),
        ("PROXY_PROTOCOL", "0"),
        ("PROXY_PROTOCOL_FROM", ""),
        ("PROXY_PROTOCOL_TIMEOUT", "3s"),
        ("SEND_PROXY_PROTOCOL", "0"),
        ("KEEPALIVE_TIME", "60s"),
        ("KEEPALIVE_INTERVAL", "10s"),
        ("KEEPALIVE_COUNT", "6"),
        ("TCP_USER_TIMEOUT", "120s"),
        ("IDLE_TIMEOUT", "0s"),
        ("MONITOR_FALL", "1"),
        ("MONITOR_RISE", "1"),
        ("DNS_CACHE_TIME", "30s"),
        ("SSL_CERTIFICATE", ""),
        ("SSL_KEY", ""),
        ("SSL_PASSPHRASE", ""),
        ("SSL_METHOD", "SSL/TLS"),
        ("SSL_PLAIN_ON_SAME_PORT", "0"),
        ("SSL_ENCRYPT_UPSTREAM", "0"),
        ("SSL_UPSTREAM_VERIFY", "1"),
        ("SSL_UPSTREAM_CA", ""),
        ("SSL_UPSTREAM_SERVER_NAME", ""),
        ("ALERT_WEBHOOK", ""),
        ("ALERT_WEBHOOK_CA", ""),
        ("ALERT_WEBHOOK_FORMAT", "json"),
        ("ALERT_COMMAND", ""),
        ("ALERT_EVENTS", "all"),
        ("ALERT_TIMEOUT", "10s"),
        ("RESTART_COMMAND", ""),
        ("RESTART_AFTER", "120s"),
        ("RESTART_COOLDOWN", "600s"),
        ("RESTART_TIMEOUT", "120s"),
        ("RESTART_MAX_PARALLEL", "1"),
        ("RESTART_ONLY_WITH_ADDRESS", ""),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    assert_eq!(
        printed,
        vec![
            ("General".to_string(), (general, vec![])),
            (
                "BALANCE_SMART_CLIENT_DESKTOP".to_string(),
                (
                    balancer,
                    vec!["REMOTE_SERVER_01=127.0.0.1 6001 1".to_string()]
                )
            ),
        ],
        "{stdout}"
    );
}

#[test]
fn totvs_keys_and_values_are_accepted_with_notices() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    std::fs::write(
        &path,
        "[General]\n\
         ConsoleLog=1\n\
         MaxStringSize=10\n\
         [Drivers]\n\
         Active=TCP\n\
         [BALANCE_SMART_CLIENT_DESKTOP]\n\
         SERVICE_NAME=TOTVSBroker\n\
         LOCAL_SERVER_PORT=5000\n\
         STANDBY_TIME=200\n\
         SORT_METHOD=SERVER_MEMORY\n\
         MONITORING_TYPE=SMARTCLIENT_ACTIVE\n\
         REMOTE_SERVER_01=10.0.0.11 1234\n",
    )
    .expect("write ini");
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 0, "{stderr}");
    let file = path.display().to_string();
    let notice = |needles: &[&str]| {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("notice: {file}"))
                    && needles.iter().all(|n| l.contains(n))),
            "no notice with {needles:?}:\n{stderr}"
        );
    };
    notice(&[":10:", "SORT_METHOD", "SERVER_MEMORY", "CONNECTION"]);
    notice(&[
        ":11:",
        "MONITORING_TYPE",
        "SMARTCLIENT_ACTIVE",
        "CONNECTION",
    ]);
    notice(&["SERVICE_NAME", "STANDBY_TIME"]);
    notice(&["[Drivers]"]);
    notice(&["MaxStringSize"]);
    // The substitutes are what runs, and the printout says so.
    assert!(stdout.contains("\nSORT_METHOD=CONNECTION\n"), "{stdout}");
    assert!(
        stdout.contains("\nMONITORING_TYPE=CONNECTION\n"),
        "{stdout}"
    );
    assert!(!stdout.contains("SERVICE_NAME"), "{stdout}");
}

#[test]
fn a_windows_1252_file_is_accepted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    // "configuração do broker" and "produção" in Windows-1252: 0xE7 0xE3 are not valid UTF-8.
    let mut bytes = b"; configura\xe7\xe3o do broker de produ\xe7\xe3o\n".to_vec();
    bytes.extend_from_slice(
        b"[BALANCE_SMART_CLIENT_DESKTOP]\n; servidores da f\xe1brica\nLOCAL_SERVER_PORT=5000\n\
          REMOTE_SERVER_01=127.0.0.1 6001\n",
    );
    std::fs::write(&path, &bytes).expect("write ini");
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("\nLOCAL_SERVER_PORT=5000\n"), "{stdout}");
    assert!(
        stdout.contains("\nREMOTE_SERVER_01=127.0.0.1 6001 1\n"),
        "{stdout}"
    );
}

#[test]
fn errors_in_a_windows_1252_file_still_name_their_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    let bytes = b"; configura\xe7\xe3o\n[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\n\
                  REMOTE_SERVER_01=127.0.0.1 6001\nSORT_METOD=CONNECTION\n";
    std::fs::write(&path, bytes).expect("write ini");
    let (code, _, stderr) = check(&path);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:5: [BALANCE_SMART_CLIENT_DESKTOP] SORT_METOD: unknown key; did you mean SORT_METHOD?",
            path.display()
        )),
        "{stderr}"
    );
}

#[test]
fn a_file_with_windows_line_endings_is_accepted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    std::fs::write(
        &path,
        "[General]\r\nConsoleFile=C:\\totvs\\logs\\console.log\r\n\
         [BALANCE_SMART_CLIENT_DESKTOP]\r\nLOCAL_SERVER_PORT=5000\r\n\
         REMOTE_SERVER_01=127.0.0.1 6001\r\n",
    )
    .expect("write ini");
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 0, "{stderr}");
    // The carriage return is no part of any value.
    assert!(!stdout.contains('\r'), "{stdout:?}");
    assert!(
        stdout.contains("\nCONSOLEFILE=C:\\totvs\\logs\\console.log\n"),
        "{stdout}"
    );
}

#[test]
fn backslashes_are_kept_literally() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    std::fs::write(
        &path,
        "[General]\nConsoleFile=C:\\totvs\\logs\\console.log\n\
         [BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\nREMOTE_SERVER_01=127.0.0.1 6001\n",
    )
    .expect("write ini");
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l == "CONSOLEFILE=C:\\totvs\\logs\\console.log"),
        "{stdout}"
    );
}

#[test]
fn help_explains_the_commands_and_exit_codes() {
    let (code, stdout, stderr) = run_cli(&["--help"]);
    assert_eq!(code, 0, "{stderr}");
    for needle in ["demo", "--check", "--config", "--log-level", "Exit codes"] {
        assert!(
            stdout.contains(needle),
            "--help lacks {needle:?}:\n{stdout}"
        );
    }
    // Each exit code with its meaning.
    let codes = stdout
        .split_once("Exit codes")
        .map(|(_, rest)| rest.split("\n\n").next().unwrap_or(""))
        .unwrap_or("");
    for needle in ["0 ", "1 ", "2 ", "--check", "bound", "invalid"] {
        assert!(
            codes.contains(needle),
            "exit codes paragraph lacks {needle:?}:\n{codes}"
        );
    }
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(&format!("cannot read {}", path.display())),
        "{stderr}"
    );
    assert_hints_at_config_and_demo(&stderr);
}

/// The way out of a missing configuration: `--config`, or the demo.
fn assert_hints_at_config_and_demo(stderr: &str) {
    assert!(
        stderr.contains("--config PATH") && stderr.contains("`appbroker demo`"),
        "no hint at --config and the demo:\n{stderr}"
    );
}

#[test]
fn without_arguments_it_points_to_config_and_the_demo() {
    // `cargo run --release` in a fresh clone: no appserver.ini in the working directory.
    let dir = tempfile::tempdir().expect("temp dir");
    let output = std::process::Command::new(harness::binary())
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run appbroker");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty());
    assert!(stderr.contains("cannot read appserver.ini"), "{stderr}");
    assert_hints_at_config_and_demo(&stderr);
}

/// `--check` on `path` in a shell that caps the process's memory at 1 GiB, so a broker that
/// reads without bound fails instead of taking the machine's memory.
fn check_capped(path: &Path) -> (i32, String, String) {
    let mut command = std::process::Command::new("sh");
    command.arg("-c").arg(format!(
        "ulimit -v 1048576 && exec '{}' --check --config '{}'",
        binary(),
        path.display()
    ));
    run_bounded(command)
}

#[test]
fn a_fifo_a_device_or_a_directory_is_refused_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("appserver.ini");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    for (path, what) in [
        (
            fifo.as_path(),
            "it is a FIFO (named pipe), not a regular file",
        ),
        (Path::new("/dev/zero"), "it is a device, not a regular file"),
        (dir.path(), "it is a directory, not a regular file"),
    ] {
        let (code, stdout, stderr) = check_capped(path);
        assert_eq!(code, 2, "{}: {stderr}", path.display());
        assert_eq!(stdout, "");
        assert!(
            stderr.contains(&format!("cannot read {}: {what}", path.display())),
            "{stderr}"
        );
    }
}

#[test]
fn a_symbolic_link_to_a_file_is_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let link = dir.path().join("appserver.ini");
    std::os::unix::fs::symlink(Path::new(VALID).join("minimal.ini"), &link).expect("symlink");
    let (code, stdout, stderr) = check(&link);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("[BALANCE_SMART_CLIENT_DESKTOP]"),
        "{stdout}"
    );
}

#[test]
fn a_file_over_16_mib_is_refused_and_one_just_under_is_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    let valid = std::fs::read_to_string(Path::new(VALID).join("minimal.ini")).unwrap();
    // Comment lines up to exactly 16 MiB, the largest file read.
    let mut text = valid.clone();
    let line = format!("; {}\n", "x".repeat(1021));
    while text.len() + line.len() <= 16 * 1024 * 1024 {
        text.push_str(&line);
    }
    text.push_str(&";".repeat(16 * 1024 * 1024 - text.len() - 1));
    text.push('\n');
    assert_eq!(text.len(), 16 * 1024 * 1024);
    std::fs::write(&path, &text).unwrap();
    let (code, _, stderr) = check_capped(&path);
    assert_eq!(code, 0, "{stderr}");

    text.push('\n');
    std::fs::write(&path, &text).unwrap();
    let (code, stdout, stderr) = check_capped(&path);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(&format!(
            "cannot read {}: it is 16777217 bytes, more than the 16 MiB a configuration file may have",
            path.display()
        )),
        "{stderr}"
    );
}

#[test]
fn at_most_100_errors_are_printed_then_how_many_more() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    let mut text = String::from(
        "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\nREMOTE_SERVER_01=10.0.0.1 1234\n",
    );
    for i in 0..1000 {
        text.push_str(&format!("not an entry {i}\n"));
    }
    std::fs::write(&path, text).unwrap();
    let (code, _, stderr) = check(&path);
    assert_eq!(code, 2);
    let file = path.display().to_string();
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.trim_start().starts_with(&format!("{file}:")))
        .collect();
    assert_eq!(errors.len(), 100, "{stderr}");
    // The first ones, in line order.
    assert!(errors[0].contains(&format!("{file}:4:")), "{}", errors[0]);
    assert!(
        errors[99].contains(&format!("{file}:103:")),
        "{}",
        errors[99]
    );
    assert!(stderr.contains("1000 errors in"), "{stderr}");
    assert!(stderr.contains("... and 900 more errors"), "{stderr}");
    assert!(stderr.lines().count() < 110, "{stderr}");
}

#[test]
fn a_file_of_millions_of_lines_is_checked_in_bounded_memory_and_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("appserver.ini");
    // Just under 16 MiB: four million unknown, repeated keys in a balancer section, and as
    // many in [General].
    let mut text = String::from("[General]\n");
    text.push_str(&"x=1\n".repeat(2_000_000));
    text.push_str("[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\n");
    text.push_str(&"y=1\n".repeat(2_000_000));
    std::fs::write(&path, &text).unwrap();
    let (code, stdout, stderr) = check_capped(&path);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.lines().count() < 110,
        "{} lines",
        stderr.lines().count()
    );
    assert!(
        stderr.contains("more than 100000 sections and entries"),
        "{stderr}"
    );
    assert!(stderr.contains("more errors"), "{stderr}");
}

/// The keys docs/configuration.md documents: the first column of the rows of the section
/// titled `title`, upper case, each backquoted name of a cell (`REMOTE_SERVER_<id>` apart).
fn documented_keys(docs: &str, title: &str) -> Vec<String> {
    let start = docs
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("no section `## {title}` in docs/configuration.md"));
    let section = &docs[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut keys = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let cell = row.split('|').nth(1).unwrap_or_default();
        for name in cell.split('`').skip(1).step_by(2) {
            if !name.starts_with("REMOTE_SERVER_") {
                keys.push(name.to_ascii_uppercase());
            }
        }
    }
    assert!(!keys.is_empty(), "no key rows under `## {title}`");
    keys
}

#[test]
fn the_documentation_lists_exactly_the_keys_of_the_table() {
    use appbroker::config::TOTVS_UNUSED;
    use appbroker::config::keys::{KEYS, Stands};
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .expect("read docs/configuration.md");
    let sorted = |mut keys: Vec<String>| {
        keys.sort();
        keys
    };
    let table = |general: bool| {
        sorted(
            KEYS.iter()
                .filter(|k| (k.stands == Stands::General) == general)
                .map(|k| k.name.to_string())
                .collect(),
        )
    };
    assert_eq!(
        sorted(documented_keys(&docs, "`[General]`")),
        table(true),
        "docs/configuration.md's [General] table and the keys of src/config/keys.rs"
    );
    assert_eq!(
        sorted(documented_keys(&docs, "Balancer sections")),
        table(false),
        "docs/configuration.md's balancer table and the keys of src/config/keys.rs"
    );
    assert_eq!(
        sorted(documented_keys(&docs, "TOTVS keys accepted and not used")),
        sorted(TOTVS_UNUSED.iter().map(|(k, _)| k.to_string()).collect()),
        "docs/configuration.md's TOTVS table and TOTVS_UNUSED"
    );
    // And the shipped example shows every key, set or commented out.
    let example = std::fs::read_to_string(EXAMPLE)
        .expect("read the example")
        .to_ascii_uppercase();
    for key in KEYS {
        assert!(
            example.contains(key.name),
            "{} is not in appserver.ini.example",
            key.name
        );
    }
}

/// The keys of the `[General]` section of an ini file, upper case.
fn general_keys(text: &str) -> Vec<String> {
    let mut in_general = false;
    let mut keys = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_general = name.trim().eq_ignore_ascii_case("general");
        } else if in_general
            && !line.starts_with(';')
            && !line.starts_with('#')
            && let Some((key, _)) = line.split_once('=')
        {
            keys.push(key.trim().to_ascii_uppercase());
        }
    }
    keys
}

#[test]
fn totvs_general_keys_are_never_taken_for_typos_of_appbrokers() {
    use appbroker::config::keys::KEYS;
    use appbroker::config::{TOTVS_GENERAL, TOTVS_UNUSED};
    // Every TOTVS key in [General], in any case: accepted, with notices only.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("appserver.ini");
    let mut totvs_keys: Vec<&str> = TOTVS_GENERAL
        .iter()
        .copied()
        .chain(TOTVS_UNUSED.iter().map(|(k, _)| *k))
        .collect();
    totvs_keys.sort_unstable();
    totvs_keys.dedup();
    // As written, then in lower case (a file cannot hold both: they are the same key).
    for lower in [false, true] {
        let mut text = String::from("[General]\n");
        for key in &totvs_keys {
            let key = if lower {
                key.to_ascii_lowercase()
            } else {
                key.to_string()
            };
            text.push_str(&format!("{key}=1\n"));
        }
        text.push_str("[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\n");
        text.push_str("REMOTE_SERVER_01=10.0.0.1 6001\n");
        std::fs::write(&path, text).unwrap();
        let (code, _, stderr) = check(&path);
        assert_eq!(code, 0, "{stderr}");
        assert_ok_line(&stderr, &path);
    }
    // The [General] keys of the TOTVS fixtures are appbroker's or on the list, so a file
    // from a TOTVS shop added there grows the list with it.
    let known = |key: &str| {
        KEYS.iter().any(|k| k.name == key) || totvs_keys.iter().any(|k| k.eq_ignore_ascii_case(key))
    };
    let totvs: Vec<PathBuf> = fixtures(VALID)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("totvs")
        })
        .collect();
    assert!(totvs.len() >= 2, "the TOTVS fixtures are gone: {totvs:?}");
    for fixture in &totvs {
        let text = std::fs::read_to_string(fixture).unwrap();
        let keys = general_keys(&text);
        assert!(
            !keys.is_empty(),
            "{} has no [General] keys",
            fixture.display()
        );
        for key in keys {
            assert!(known(&key), "{}: {key} is on no list", fixture.display());
        }
    }
    // And docs/configuration.md names them.
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    for key in TOTVS_GENERAL {
        assert!(
            docs.contains(&format!("`{key}`")),
            "{key} is not in docs/configuration.md"
        );
    }
}

/// The timing doctor speaks in the three places a file is read: `--check` (a notice on
/// standard error, exit 0), the start, and a reload (warnings in the log).
#[tokio::test]
async fn contradictory_timings_are_warned_about_at_check_start_and_reload() {
    let server = harness::TestServer::start("A").await;
    let ini = format!(
        "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=127.0.0.1\nLOCAL_SERVER_PORT=@PORT@\n\
         QUERY_ALLOW=127.0.0.1\nREMOTE_SERVER_01={}\nQUARANTINE_TIME=30s\nMONITOR_INTERVAL=40s\n",
        server.ini()
    );
    let warning =
        "QUARANTINE_TIME: 30s is shorter than MONITOR_INTERVAL x MONITOR_RISE (40s x 1 = 40s)";
    let broker = harness::Broker::start(&ini).await;
    let (code, _, stderr) = check(&broker.config_path);
    assert_eq!(code, 0, "{stderr}");
    let notice = stderr
        .lines()
        .find(|l| l.contains(warning))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        notice.starts_with("notice: ") && notice.contains("appserver.ini:6:"),
        "{notice}"
    );
    assert_eq!(broker.count_logs(warning), 1, "{}", broker.log_text());
    // A reload with the other rule broken: its warning, on the reload.
    let text = std::fs::read_to_string(&broker.config_path).unwrap();
    std::fs::write(&broker.config_path, format!("{text}CONNECT_TIMEOUT=20s\n")).unwrap();
    broker.signal(nix::sys::signal::Signal::SIGHUP);
    broker
        .wait_for_log(
            "CONNECT_TIMEOUT x MAX_ATTEMPTS (20s x 3 = 60s) is longer than QUARANTINE_TIME (30s)",
        )
        .await;
    assert_eq!(broker.count_logs(warning), 2, "{}", broker.log_text());
}
