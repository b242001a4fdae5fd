//! Property tests of the configuration parser: any input yields a `Config` or an error report
//! naming the file, never a panic; and every valid configuration, printed with `to_ini`, parses
//! back to the same settings. Inputs are arbitrary bytes and strings, and files assembled from
//! INI fragments (real section and key names, random values, comments, `;` after values,
//! Windows-1252 bytes), which reach far deeper into the validator than random bytes do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use appbroker::config::keys::{Domain, KEYS, Key, Stands};
use appbroker::config::{Config, LoadError, show_escaped};
use proptest::prelude::*;
use proptest::sample::select;

/// Names that are no key of the table but that the parser meets: servers (well and badly
/// numbered) and TOTVS keys accepted without use.
const OTHER_NAMES: &[&str] = &[
    "REMOTE_SERVER_01",
    "REMOTE_SERVER_02",
    "REMOTE_SERVER_aa",
    "REMOTE_SERVER_1",
    "REMOTE_SERVER_100",
    "SERVICE_NAME",
    "STANDBY_TIME",
];

/// Every key the parser knows: the table's, and the others it meets.
fn names() -> Vec<&'static str> {
    KEYS.iter()
        .map(|k| k.name)
        .chain(OTHER_NAMES.iter().copied())
        .collect()
}
const SECTIONS: &[&str] = &[
    "General",
    "BALANCE_SMART_CLIENT_DESKTOP",
    "BALANCE_WEB_SERVICES",
    "balance_web_services",
    "BALANCE_HTTP",
    "BALANCE_SMART_CLIENT",
    "Drivers",
    "",
];

/// Values that mean something to some key, and values that mean nothing to any.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "0",
            "1",
            "2",
            "-1",
            "5000",
            "65535",
            "65536",
            "500ms",
            "2m",
            "30s",
            "5 S",
            "1h",
            "86400",
            "86401",
            "CONNECTION",
            "ROUND_ROBIN",
            "SESSION",
            "SEND_EXPECT",
            "DISABLED",
            "SMARTCLIENT",
            "en",
            "pt-BR",
            "127.0.0.1",
            "::",
            "[::1]",
            "0.0.0.0",
            "10.0.0.0/8",
            "::1/129",
            "127.0.0.1 6001",
            "app-1.example 80 7",
            "h 1 1001",
            "::1 80 0",
            r"PING\r\n",
            r"\x4",
            r"\q",
            "\\",
            "",
            "=",
            "a=b",
        ])
        .prop_map(str::to_string),
        "[ -~]{0,24}",
        any::<String>(),
        (0u64..u64::MAX).prop_map(|n| n.to_string()),
    ]
}

/// One line of an INI-like file.
fn line() -> impl Strategy<Value = String> {
    let key = prop_oneof![select(names()).prop_map(str::to_string), "[A-Za-z_]{1,12}",];
    prop_oneof![
        4 => (key, "[ \t]{0,2}", "[ \t]{0,2}", value())
            .prop_map(|(k, a, b, v)| format!("{}{a}={b}{v}", vary_case(&k, v.len()))),
        2 => select(SECTIONS.to_vec()).prop_map(|s| format!("[{s}]")),
        1 => value().prop_map(|v| format!("KEY={v} ; comment after a value")),
        1 => select(vec!["; comment", "# comment", "", "   ", "[broken", "no equals", "=5", "[]", "[a]b]", "\u{feff}"])
            .prop_map(str::to_string),
        1 => any::<String>(),
    ]
}

/// Some keys in lower or mixed case (names are case-insensitive), chosen by `seed`.
fn vary_case(key: &str, seed: usize) -> String {
    match seed % 3 {
        0 => key.to_string(),
        1 => key.to_ascii_lowercase(),
        _ => key
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i % 2 == 0 {
                    c.to_ascii_lowercase()
                } else {
                    c
                }
            })
            .collect(),
    }
}

/// What to do to one line of a valid file.
#[derive(Debug, Clone)]
enum Mutation {
    /// Give its key another value.
    Revalue(String),
    /// Put another line before it.
    Insert(String),
    /// Drop it.
    Delete,
    /// Write it twice.
    Repeat,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => value().prop_map(Mutation::Revalue),
        2 => line().prop_map(Mutation::Insert),
        1 => Just(Mutation::Delete),
        1 => Just(Mutation::Repeat),
    ]
}

/// A valid file with a few lines changed: reaches each key's checks in files that are
/// otherwise fine (and is sometimes still valid).
fn mutated_ini() -> impl Strategy<Value = Vec<String>> {
    (
        valid_ini(),
        prop::collection::vec((any::<prop::sample::Index>(), mutation()), 0..4),
    )
        .prop_map(|(text, mutations)| {
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            for (at, mutation) in mutations {
                let at = at.index(lines.len());
                match mutation {
                    Mutation::Revalue(v) => {
                        if let Some((key, _)) = lines[at].split_once('=') {
                            lines[at] = format!("{key}={v}");
                        }
                    }
                    Mutation::Insert(line) => lines.insert(at, line),
                    Mutation::Delete => {
                        lines.remove(at);
                    }
                    Mutation::Repeat => lines.insert(at, lines[at].clone()),
                }
                if lines.is_empty() {
                    break;
                }
            }
            lines
        })
}

/// A file of INI-like lines (fragments, or a valid file mutated), with `\n` or `\r\n`, as
/// bytes; some get Windows-1252 bytes (not valid UTF-8, so the file is decoded as
/// Windows-1252, as Brazilian files are).
fn ini_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![prop::collection::vec(line(), 0..40), mutated_ini()],
        any::<bool>(),
        prop::collection::vec((any::<prop::sample::Index>(), 0x80u8..=0xff), 0..4),
    )
        .prop_map(|(lines, crlf, high)| {
            let mut bytes = lines.join(if crlf { "\r\n" } else { "\n" }).into_bytes();
            for (at, byte) in high {
                let at = at.index(bytes.len() + 1);
                bytes.insert(at, byte);
            }
            bytes
        })
}

/// The checks every outcome must pass: a config that prints and parses back to itself, or an
/// error whose every line names the file.
fn check_outcome(outcome: Result<appbroker::config::Loaded, LoadError>, file: &Path) {
    let name = file.display().to_string();
    match outcome {
        Ok(loaded) => {
            let printed = loaded.config.to_ini();
            let again = Config::from_text(&printed, file).unwrap_or_else(|e| {
                panic!("printed config does not parse: {}\n{printed}", e.report())
            });
            // A secret (RESTART_COMMAND, ALERT_WEBHOOK...) is never printed: a printout
            // without it reads back without it, so only one without secrets is the same.
            let secret_left_out = printed.contains("(a secret is never printed)");
            assert!(
                secret_left_out || again.config.same_settings(&loaded.config),
                "printed config parses to other settings:\n{printed}"
            );
        }
        Err(e) => {
            let report = e.report();
            for line in report.lines() {
                assert!(
                    line.contains(&name),
                    "a line of the report does not name {name}: {line:?}\n{report}"
                );
            }
        }
    }
}

proptest! {
    #[test]
    fn any_text_yields_a_config_or_an_error_naming_the_file(text in any::<String>()) {
        let file = Path::new("/etc/appbroker/any.ini");
        check_outcome(Config::from_text(&text, file), file);
    }

    #[test]
    fn ini_like_text_yields_a_config_or_an_error_naming_the_file(bytes in ini_bytes()) {
        let file = Path::new("fragments.ini");
        let text = String::from_utf8_lossy(&bytes);
        check_outcome(Config::from_text(&text, file), file);
    }

    #[test]
    fn any_file_yields_a_config_or_an_error_naming_the_file(
        bytes in prop_oneof![ini_bytes(), prop::collection::vec(any::<u8>(), 0..512)]
    ) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("appserver.ini");
        std::fs::write(&file, &bytes).unwrap();
        check_outcome(Config::from_path(&file), &file);
    }
}

// Valid configurations, generated from the real keys and their value domains.

/// A duration of `ms` milliseconds, written in one of the accepted forms.
fn duration_text(ms: u64, form: u8) -> String {
    match form % 4 {
        0 if ms.is_multiple_of(1000) => (ms / 1000).to_string(),
        1 if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        2 if ms.is_multiple_of(60_000) => format!("{}M", ms / 60_000),
        _ => format!("{ms}ms"),
    }
}

/// `KEY=<duration from min_ms to max_ms>`, or nothing.
fn duration_key(key: &'static str, min_ms: u64, max_ms: u64) -> BoxedStrategy<Option<String>> {
    prop::option::of(
        (
            prop_oneof![
                min_ms..=max_ms,
                (min_ms.div_ceil(1000)..=max_ms / 1000).prop_map(|s| s * 1000)
            ],
            any::<u8>(),
        )
            .prop_map(move |(ms, form)| format!("{key}={}", duration_text(ms, form))),
    )
    .boxed()
}

/// `KEY=<integer in range>`, or nothing.
fn integer_key(key: &'static str, min: u64, max: u64) -> BoxedStrategy<Option<String>> {
    prop::option::of((min..=max).prop_map(move |n| format!("{key}={n}"))).boxed()
}

fn ip() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<std::net::Ipv4Addr>().prop_map(|ip| ip.to_string()),
        any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
        Just("127.0.0.1".to_string()),
        Just("::".to_string()),
    ]
}

fn cidr() -> impl Strategy<Value = String> {
    prop_oneof![
        (any::<std::net::Ipv4Addr>(), 0u8..=32).prop_map(|(ip, p)| format!("{ip}/{p}")),
        (any::<std::net::Ipv6Addr>(), 0u8..=128).prop_map(|(ip, p)| format!("{ip}/{p}")),
        any::<std::net::Ipv4Addr>().prop_map(|ip| ip.to_string()),
    ]
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        ip(),
        // Labels that neither start nor end with `-`, and a last one that is no number.
        (
            prop::collection::vec("[a-z0-9]([a-z0-9_-]{0,8}[a-z0-9])?", 0..3),
            "[a-z][a-z0-9_-]{0,8}[a-z0-9]",
        )
            .prop_map(|(mut labels, last)| {
                labels.push(last);
                labels.join(".")
            }),
    ]
}

/// `KEY=<a valid value of its domain>` for `key`, in any case, or nothing. (The monitoring
/// keys come together: [`monitoring`].)
fn key_line(key: &'static Key) -> BoxedStrategy<Option<String>> {
    let name = key.name;
    match key.domain {
        Domain::Integer { min, max, .. } => integer_key(name, min, max),
        Domain::Duration { min, max } => {
            duration_key(name, min.as_millis() as u64, max.as_millis() as u64)
        }
        Domain::DurationOrOff { min, max } => prop_oneof![
            Just(Some(format!("{name}=0"))),
            duration_key(name, min.as_millis() as u64, max.as_millis() as u64),
        ]
        .boxed(),
        Domain::Cidrs => prop::option::of(
            prop::collection::vec(cidr(), 1..4)
                .prop_map(move |list| format!("{name}={}", list.join(", "))),
        )
        .boxed(),
        Domain::CidrsOrNone => prop::option::of(
            prop::collection::vec(cidr(), 0..4)
                .prop_map(move |list| format!("{name}={}", list.join(", "))),
        )
        .boxed(),
        Domain::Protocols => prop::option::of(
            prop::collection::vec("[a-zA-Z][a-zA-Z0-9-]{0,9}(/[0-9]{1,2})?", 0..3)
                .prop_map(move |list| format!("{name}={}", list.join(", "))),
        )
        .boxed(),
        Domain::Path => {
            prop::option::of("[a-z/]{1,20}\\.log".prop_map(move |p| format!("{name}=/var/log/{p}")))
                .boxed()
        }
        Domain::Name => {
            prop::option::of("[a-z_][a-z0-9_-]{0,15}".prop_map(move |n| format!("{name}={n}")))
                .boxed()
        }
        Domain::ListenIp => {
            prop::option::of(ip().prop_map(move |ip| format!("{name}={ip}"))).boxed()
        }
        Domain::OptionalIp => prop::option::of(prop_oneof![
            Just(format!("{name}=")),
            ip().prop_map(move |ip| format!("{name}={ip}")),
        ])
        .boxed(),
        domain => {
            let words = domain.words();
            assert!(!words.is_empty(), "no values to draw for {name}");
            prop::option::of(
                (select(words.to_vec()), any::<usize>())
                    .prop_map(move |(w, seed)| format!("{name}={}", vary_case(w, seed))),
            )
            .boxed()
        }
    }
}

/// `MONITORING_TYPE` (any of its words), and with `SEND_EXPECT` the bytes to send and expect
/// (which must not be empty), with `HTTP` a path and a status range, or nothing.
fn monitoring() -> BoxedStrategy<Option<Vec<String>>> {
    let other: Vec<&str> = Domain::Monitoring
        .words()
        .iter()
        .copied()
        .filter(|w| *w != "SEND_EXPECT")
        .collect();
    prop::option::of(prop_oneof![
        select(other).prop_map(|m| vec![format!("MONITORING_TYPE={m}")]),
        ("/[a-z0-9/_.-]{0,20}", 100u16..600, 0u16..100).prop_map(|(path, low, span)| vec![
            "MONITORING_TYPE=HTTP".to_string(),
            format!("MONITOR_PATH={path}"),
            format!("MONITOR_EXPECT_STATUS={low}-{}", (low + span).min(599)),
        ]),
        (
            prop::collection::vec(any::<u8>(), 0..16),
            prop::collection::vec(any::<u8>(), 1..16),
        )
            .prop_map(|(send, expect)| vec![
                "MONITORING_TYPE=SEND_EXPECT".to_string(),
                format!("MONITOR_SEND={}", show_escaped(&send)),
                format!("MONITOR_EXPECT={}", show_escaped(&expect)),
            ]),
    ])
    .boxed()
}

/// Settings of the table that `stands` where they may (one line each, or none): a balancer's
/// (which `[General]` may hold too) or `[General]`'s own.
fn settings(stands: Stands) -> impl Strategy<Value = Vec<String>> {
    let lines: Vec<_> = KEYS
        .iter()
        .filter(|k| k.stands == stands)
        .filter(|k| {
            !matches!(
                k.domain,
                Domain::Monitoring | Domain::Escaped | Domain::HttpPath | Domain::StatusRange
            )
        })
        // The SSL_* keys name files the doctor reads: tests/tls.rs covers them. Secrets are
        // never printed, so a printout cannot read back to them.
        .filter(|k| !k.name.starts_with("SSL_") && !k.domain.is_secret())
        .map(key_line)
        .collect();
    let monitoring = if stands == Stands::Balancer {
        monitoring()
    } else {
        Just(None).boxed()
    };
    (lines, monitoring).prop_map(|(lines, monitoring)| {
        lines
            .into_iter()
            .flatten()
            .chain(monitoring.into_iter().flatten())
            .collect()
    })
}

/// `REMOTE_SERVER_xx` lines with distinct ids (the same id in another case is the same id).
fn servers() -> impl Strategy<Value = Vec<String>> {
    prop::collection::btree_map(
        "[0-9A-Z]{2}",
        (
            host(),
            // Below the balancers' ports: a server on a balancer's own port at a loopback
            // address would be the broker itself, which is an error.
            1u16..=40000,
            prop::option::of(0u32..=1000),
            any::<bool>(),
        ),
        1..6,
    )
    .prop_map(|servers| {
        servers
            .into_iter()
            .map(|(id, (host, port, weight, lower))| {
                let id = if lower { id.to_ascii_lowercase() } else { id };
                match weight {
                    Some(w) => format!("REMOTE_SERVER_{id}={host}  {port}\t{w}"),
                    None => format!("REMOTE_SERVER_{id}={host} {port}"),
                }
            })
            .collect()
    })
}

/// A whole valid file: `[General]` (its own keys and balancer defaults) and one or two
/// balancers on distinct ports, with comments and blank lines between.
fn valid_ini() -> impl Strategy<Value = String> {
    let general = (settings(Stands::General), settings(Stands::Balancer));
    let balancer = || {
        (
            prop::option::of(ip()),
            settings(Stands::Balancer),
            servers(),
        )
    };
    (
        prop::option::of(general),
        balancer(),
        prop::option::of(balancer()),
        40001u16..=65534,
        any::<bool>(),
    )
        .prop_map(|(general, desktop, web, port, comments)| {
            let mut lines = Vec::new();
            if let Some((own, defaults)) = general {
                lines.push("[General]".to_string());
                lines.extend(own);
                lines.extend(defaults);
            }
            let sections = [
                Some(("BALANCE_SMART_CLIENT_DESKTOP", desktop, port)),
                web.map(|w| ("balance_web_services", w, port + 1)),
            ];
            for (name, (address, settings, servers), port) in sections.into_iter().flatten() {
                if comments {
                    lines.push(String::new());
                    lines.push(format!("; {name}, à moda da casa"));
                }
                lines.push(format!("[{name}]"));
                lines.push(format!("LOCAL_SERVER_PORT = {port}"));
                if let Some(address) = address {
                    lines.push(format!("LOCAL_SERVER_ADDRESS={address}"));
                }
                lines.extend(settings);
                lines.extend(servers);
            }
            lines.join("\n")
        })
}

proptest! {
    #[test]
    fn valid_configs_survive_print_and_parse(text in valid_ini()) {
        let file = Path::new("valid.ini");
        let loaded = Config::from_text(&text, file)
            .unwrap_or_else(|e| panic!("a generated valid file was rejected: {}\n{text}", e.report()));
        let printed = loaded.config.to_ini();
        let again = Config::from_text(&printed, file)
            .unwrap_or_else(|e| panic!("printed config does not parse: {}\n{printed}", e.report()));
        prop_assert!(
            again.config.same_settings(&loaded.config),
            "printed config parses to other settings:\n{text}\n---\n{printed}"
        );
        // Printing is stable once every key is in the file: printing the reparsed config and
        // parsing that again prints the same text.
        let reprinted = again.config.to_ini();
        let third = Config::from_text(&reprinted, file).unwrap();
        prop_assert_eq!(third.config.to_ini(), reprinted);
    }
}
