//! Validation rules, table-driven: what each input must produce.

use std::path::Path;
use std::time::Duration;

use super::load::decode;
use super::*;

fn load(text: &str) -> Result<Loaded, Vec<String>> {
    Config::from_text(text, Path::new("t.ini")).map_err(|e| match e {
        LoadError::Invalid { errors, .. } => errors.iter().map(|e| e.located("t.ini")).collect(),
        other => vec![other.to_string()],
    })
}

const MINIMAL: &str =
    "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\nREMOTE_SERVER_01=127.0.0.1 6001\n";

#[test]
fn minimal_file_gets_every_default() {
    let loaded = load(MINIMAL).unwrap();
    // The one notice: the query interface answers everyone, as the TOTVS broker does.
    assert_eq!(loaded.notices.len(), 1, "{:?}", loaded.notices);
    assert_eq!(loaded.notices[0].key.as_deref(), Some("QUERY_ALLOW"));
    let b = &loaded.config.balancers[0];
    assert_eq!(b.kind, BalancerKind::SmartClientDesktop);
    assert_eq!(b.listen, "0.0.0.0:5000".parse().unwrap());
    assert_eq!(b.sort_method, SortMethod::Connection);
    assert_eq!(b.monitoring, Monitoring::Connection);
    assert_eq!(b.monitor_interval, Duration::from_secs(60));
    assert_eq!(b.quarantine_time, Duration::from_secs(120));
    assert_eq!(b.connect_timeout, Duration::from_secs(5));
    assert_eq!(b.max_attempts, 3);
    assert_eq!(b.max_connections, 10_000);
    assert!(b.log_connections);
    assert!(b.query.enabled);
    assert_eq!(b.query.allow, Cidr::everyone());
    assert_eq!(b.query.max_connections, 64);
    assert_eq!(b.query.sniff_timeout, Duration::from_millis(200));
    assert_eq!(loaded.config.general.language, Language::English);
    assert_eq!(b.servers[0].weight, 1);
    let g = &loaded.config.general;
    assert!(g.console_log && g.console_log_date);
    assert_eq!(g.shutdown_timeout, Duration::from_secs(30));
}

#[test]
fn general_supplies_defaults_and_the_section_wins() {
    let text = "[general]\nsort_method=round_robin\nMONITOR_INTERVAL=500ms\n\
                [BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\nMonitor_Interval=2m\n\
                REMOTE_SERVER_01=h 1\n[BALANCE_WEB_SERVICES]\nLOCAL_SERVER_PORT=5001\nREMOTE_SERVER_aa=h 2 0\n";
    let config = load(text).unwrap().config;
    let (desk, ws) = (&config.balancers[0], &config.balancers[1]);
    assert_eq!(desk.sort_method, SortMethod::RoundRobin);
    assert_eq!(desk.monitor_interval, Duration::from_secs(120));
    assert_eq!(ws.monitor_interval, Duration::from_millis(500));
    assert_eq!(ws.servers[0].id.as_str(), "AA");
    assert_eq!(ws.servers[0].weight, 0);
    assert_eq!(
        config
            .origins
            .get("BALANCE_WEB_SERVICES", "MONITOR_INTERVAL"),
        ValueOrigin::General(3)
    );
    assert_eq!(
        config
            .origins
            .get("BALANCE_SMART_CLIENT_DESKTOP", "MONITOR_INTERVAL"),
        ValueOrigin::Section(6)
    );
    assert_eq!(
        config
            .origins
            .get("BALANCE_WEB_SERVICES", "QUARANTINE_TIME"),
        ValueOrigin::Default
    );
}

#[test]
fn printed_configuration_parses_back_to_the_same() {
    let text = "[General]\nConsoleFile=C:\\totvs\\logs\\broker.log\nSHUTDOWN_GRACE=1500ms\nLANGUAGE=pt-BR\n\
                [BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_ADDRESS=::1\nLOCAL_SERVER_PORT=5000\n\
                REMOTE_SERVER_01=::1 6001 3\nREMOTE_SERVER_X9=app.example 6002\nSORT_METHOD=SERVER_MEMORY\n\
                QUERY_ALLOW=10.0.0.0/8 ::1\n";
    let first = load(text).unwrap().config;
    let printed = first.to_ini();
    let second = load(&printed)
        .unwrap_or_else(|e| panic!("{printed}\n{e:?}"))
        .config;
    assert!(first.same_settings(&second), "{printed}");
    assert!(printed.contains("CONSOLEFILE=C:\\totvs\\logs\\broker.log"));
    assert!(
        printed.contains("\nLOCAL_SERVER_ADDRESS=::1\n"),
        "{printed}"
    );
}

#[test]
fn totvs_values_and_keys_are_accepted_with_notices() {
    let text = format!(
        "{MINIMAL}SORT_METHOD=SERVER_MEMORY\nMONITORING_TYPE=SMARTCLIENT_ACTIVE\nSERVICE_NAME=broker\n\
         STANDBY_TIME=200\n[Drivers]\nACTIVE=TCP\n[General]\nConsoleLog=1\nMaxStringSize=10\n"
    );
    let loaded = load(&text).unwrap();
    let notices: Vec<String> = loaded.notices.iter().map(|n| n.located("t.ini")).collect();
    let all = notices.join("\n");
    assert!(
        all.contains("SERVER_MEMORY needs figures only a TOTVS AppServer reports"),
        "{all}"
    );
    assert!(
        all.contains("SMARTCLIENT_ACTIVE logs in with SmartClient's undocumented protocol"),
        "{all}"
    );
    assert!(
        all.contains("SERVICE_NAME (") && all.contains("STANDBY_TIME ("),
        "{all}"
    );
    assert!(
        all.contains("ignoring sections appbroker does not use: [Drivers]"),
        "{all}"
    );
    assert!(
        all.contains("ignoring keys appbroker does not use: MaxStringSize"),
        "{all}"
    );
    assert_eq!(
        loaded.config.balancers[0].sort_method,
        SortMethod::Connection
    );
}

#[test]
fn every_error_is_reported_at_once_with_file_line_section_and_key() {
    let text = "[BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=70000\nSORT_METOD=CONNECTION\n\
                REMOTE_SERVER_1=h 1\nREMOTE_SERVER_02=h\nMONITOR_INTERVAL=soon\n";
    let errors = load(text).unwrap_err();
    assert_eq!(errors.len(), 5, "{errors:#?}");
    assert!(errors[0].starts_with(
        "t.ini:2: [BALANCE_SMART_CLIENT_DESKTOP] LOCAL_SERVER_PORT: `70000` expected a port"
    ));
    assert!(errors[1].contains(":3:") && errors[1].contains("did you mean SORT_METHOD?"));
    assert!(errors[2].contains(":4:") && errors[2].contains("exactly two letters or digits"));
    assert!(errors[3].contains(":5:") && errors[3].contains("expected `<host> <port> [<weight>]`"));
    assert!(errors[4].contains(":6:") && errors[4].contains("expected a duration"));
}

#[test]
fn duplicates_are_errors_and_same_address_is_a_notice() {
    let errors = load(&format!("{MINIMAL}remote_server_01=h 2\n")).unwrap_err();
    assert!(
        errors[0].contains("given twice (first at line 3)"),
        "{errors:?}"
    );
    let loaded = load(&format!("{MINIMAL}REMOTE_SERVER_02=127.0.0.1 6001\n")).unwrap();
    assert!(
        loaded.notices[0]
            .message
            .contains("is also REMOTE_SERVER_01")
    );
    assert_eq!(loaded.config.balancers[0].servers.len(), 2);
}

#[test]
fn windows_1252_is_read() {
    let mut bytes = b"; configura\xe7\xe3o do broker\n".to_vec();
    bytes.extend_from_slice(MINIMAL.as_bytes());
    assert_eq!(
        decode(&bytes).lines().next(),
        Some("; configuração do broker")
    );
}

#[test]
fn keepalive_times_stay_within_what_linux_accepts() {
    let errors = load(&format!(
        "{MINIMAL}KEEPALIVE_TIME=32768\nKEEPALIVE_INTERVAL=40000\n"
    ))
    .unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors[0].contains("KEEPALIVE_TIME") && errors[0].contains("to 32767s"),
        "{errors:?}"
    );
    assert!(errors[1].contains("KEEPALIVE_INTERVAL") && errors[1].contains("to 32767s"));
    let loaded = load(&format!("{MINIMAL}KEEPALIVE_TIME=32767\n")).unwrap();
    assert_eq!(
        loaded.config.balancers[0].keepalive.time,
        Duration::from_secs(32_767)
    );
}

#[test]
fn http_balancers_are_told_apart_by_section_name() {
    let text = "[General]\nHTTP_POOL_MAX_IDLE=8\n\
                [BALANCE_HTTP]\nLOCAL_SERVER_PORT=8080\nMONITORING_TYPE=http\n\
                MONITOR_PATH=/health\nREMOTE_SERVER_01=127.0.0.1 8081\n\
                [balance_http_2]\nLOCAL_SERVER_PORT=8082\nHTTP_POOL_MAX_IDLE=0\nLOG_REQUESTS=0\n\
                REMOTE_SERVER_01=127.0.0.1 8083\n\
                [BALANCE_HTML]\nLOCAL_SERVER_PORT=8084\nREMOTE_SERVER_01=127.0.0.1 8085\n";
    let loaded = load(text).unwrap();
    let kinds: Vec<BalancerKind> = loaded.config.balancers.iter().map(|b| b.kind).collect();
    assert_eq!(
        kinds,
        [
            BalancerKind::http("BALANCE_HTTP"),
            BalancerKind::http("BALANCE_HTTP_2"),
            BalancerKind::http("BALANCE_HTML"),
        ]
    );
    assert!(kinds.iter().all(|k| k.is_http()));
    assert_eq!(kinds[1].section(), "BALANCE_HTTP_2");
    let [first, second, old] = &loaded.config.balancers[..] else {
        panic!("three balancers");
    };
    assert_eq!(
        first.monitoring,
        Monitoring::Http {
            path: "/health".into(),
            expect: StatusRange::default()
        }
    );
    assert_eq!(first.http.pool_max_idle, 8);
    assert!(first.http.log_requests && first.http.forwarded_headers);
    assert_eq!(
        (second.http.pool_max_idle, second.http.log_requests),
        (0, false)
    );
    assert_eq!(old.http.request_timeout, Duration::from_secs(30));
    assert!(
        loaded
            .notices
            .iter()
            .any(|n| n.message.contains("older name of [BALANCE_HTTP]"))
    );
}

#[test]
fn http_keys_in_a_tcp_section_and_http_monitor_keys_without_http_are_noticed() {
    let text = "[BALANCE_WEB_SERVICES]\nLOCAL_SERVER_PORT=5000\nLOG_REQUESTS=0\n\
                MONITOR_PATH=/x\nREMOTE_SERVER_01=127.0.0.1 6001\n";
    let loaded = load(text).unwrap();
    let noticed = |key: &str, words: &str| {
        loaded
            .notices
            .iter()
            .any(|n| n.key.as_deref() == Some(key) && n.message.contains(words))
    };
    assert!(noticed("LOG_REQUESTS", "HTTP balancers"));
    assert!(noticed("MONITOR_PATH", "MONITORING_TYPE=HTTP only"));
}

/// Each timing rule: the lines added to MINIMAL, the key its warning names, words it says.
#[test]
fn contradictory_timings_are_one_warning_each_naming_both_values() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "QUARANTINE_TIME=30s\nMONITOR_INTERVAL=20s\nMONITOR_RISE=2\n",
            "QUARANTINE_TIME",
            "30s is shorter than MONITOR_INTERVAL x MONITOR_RISE (20s x 2 = 40s)",
        ),
        (
            "KEEPALIVE_TIME=120s\nKEEPALIVE_INTERVAL=15s\nKEEPALIVE_COUNT=6\n",
            "KEEPALIVE_TIME",
            "(120s + 15s x 6 = 210s), longer than the 180s a SmartClient keeps reconnecting",
        ),
        (
            "TCP_USER_TIMEOUT=30s\n",
            "TCP_USER_TIMEOUT",
            "30s is below KEEPALIVE_TIME (60s)",
        ),
        (
            "CONNECT_TIMEOUT=10s\nMAX_ATTEMPTS=20\n",
            "MAX_ATTEMPTS",
            "CONNECT_TIMEOUT x MAX_ATTEMPTS (10s x 20 = 200s) is longer than QUARANTINE_TIME (120s)",
        ),
    ];
    for (lines, key, words) in cases {
        let loaded = load(&format!("{MINIMAL}{lines}")).unwrap();
        let timing: Vec<&ConfigError> = loaded
            .notices
            .iter()
            .filter(|n| n.key.as_deref() != Some("QUERY_ALLOW"))
            .collect();
        assert_eq!(timing.len(), 1, "{lines}: {timing:?}");
        assert_eq!(timing[0].key.as_deref(), Some(*key), "{lines}");
        let text = timing[0].located("t.ini");
        assert!(text.contains(words), "{lines}: {text}");
        // On the key's own line (the file sets it), not the section's (line 1).
        assert!(timing[0].line > Some(1), "{text}");
    }
    // Monitoring off: no check could release a quarantine anyway, so rule one says nothing.
    let off = "QUARANTINE_TIME=20s\nMONITORING_TYPE=DISABLED\n";
    let loaded = load(&format!("{MINIMAL}{off}")).unwrap();
    assert_eq!(loaded.notices.len(), 1, "{:?}", loaded.notices);
    // Keepalive off: neither keepalive rule applies.
    let loaded = load(&format!("{MINIMAL}KEEPALIVE_TIME=0\nTCP_USER_TIMEOUT=5s\n")).unwrap();
    assert_eq!(loaded.notices.len(), 1, "{:?}", loaded.notices);
}

#[test]
fn the_proxy_protocol_keys_are_read_and_their_loose_ends_noticed() {
    let text = "[General]\nPROXY_PROTOCOL=1\nHTTP_TRUSTED_PROXIES=10.0.0.0/8 ::1\n\
                [BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\n\
                QUERY_ALLOW=127.0.0.1\nPROXY_PROTOCOL_FROM=10.0.0.10, 10.1.0.0/16\n\
                PROXY_PROTOCOL_TIMEOUT=500ms\nSEND_PROXY_PROTOCOL=2\n\
                MAX_CONNECTIONS_PER_CLIENT=20\nREMOTE_SERVER_01=127.0.0.1 6001\n\
                [BALANCE_HTTP]\nLOCAL_SERVER_PORT=5001\nQUERY_ALLOW=127.0.0.1\n\
                SEND_PROXY_PROTOCOL=1\nMAX_CONNECTIONS_PER_CLIENT=5\n\
                REMOTE_SERVER_01=127.0.0.1 6002\n\
                [BALANCE_WEB_SERVICES]\nLOCAL_SERVER_PORT=5002\nQUERY_ALLOW=127.0.0.1\n\
                PROXY_PROTOCOL=0\nPROXY_PROTOCOL_TIMEOUT=1s\nREMOTE_SERVER_01=127.0.0.1 6003\n";
    let loaded = load(text).unwrap();
    let [tcp, http, off] = &loaded.config.balancers[..] else {
        panic!("three balancers");
    };
    assert!(
        tcp.proxy.accept,
        "[General]'s PROXY_PROTOCOL is every balancer's"
    );
    assert_eq!(tcp.proxy.from.len(), 2);
    assert_eq!(tcp.proxy.timeout, Duration::from_millis(500));
    assert_eq!(tcp.proxy.send, Some(ProxyVersion::V2));
    assert_eq!(tcp.max_connections_per_client, 20);
    assert_eq!(http.proxy.send, Some(ProxyVersion::V1));
    assert_eq!(http.max_connections_per_client, 5);
    assert_eq!(
        http.http.trusted_proxies.len(),
        2,
        "[General]'s HTTP_TRUSTED_PROXIES is every HTTP balancer's"
    );
    assert!(!off.proxy.accept);
    let notices: Vec<String> = loaded.notices.iter().map(|n| n.located("t.ini")).collect();
    let all = notices.join("\n");
    assert!(
        all.contains("[BALANCE_HTTP] PROXY_PROTOCOL: is 1 and PROXY_PROTOCOL_FROM is empty"),
        "{all}"
    );
    assert!(all.contains("PROXY_PROTOCOL_TIMEOUT: is ignored"), "{all}");
    assert_eq!(notices.len(), 2, "{all}");
    for bad in [
        "SEND_PROXY_PROTOCOL=3",
        "PROXY_PROTOCOL_FROM=10.0.0.300",
        "PROXY_PROTOCOL_TIMEOUT=61s",
    ] {
        let errors = load(&MINIMAL.replace("REMOTE", &format!("{bad}\nREMOTE"))).unwrap_err();
        let key = bad.split('=').next().unwrap_or_default();
        assert!(errors.iter().any(|e| e.contains(key)), "{bad}: {errors:?}");
    }
}
