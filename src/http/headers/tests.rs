//! The head's rules as cases: what is refused, what is rewritten each way, what the broker
//! answers itself.

use super::*;
use hyper::Request;

#[test]
fn an_answer_framed_by_chunks_loses_its_stale_length() {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
    headers.insert(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
    response_headers(&mut headers, false);
    let names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
    assert_eq!(names, ["etag"]);
    let mut length_only = HeaderMap::new();
    length_only.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
    response_headers(&mut length_only, false);
    assert_eq!(length_only[header::CONTENT_LENGTH], "3");
}

fn head(raw: &[(&str, &str)], version: Version, method: Method, uri: &str) -> Parts {
    let mut builder = Request::builder().method(method).uri(uri).version(version);
    for (name, value) in raw {
        builder = builder.header(*name, *value);
    }
    let Ok(request) = builder.body(()) else {
        panic!("test request")
    };
    request.into_parts().0
}

fn get(raw: &[(&str, &str)]) -> Parts {
    head(raw, Version::HTTP_11, Method::GET, "/a?b=c")
}

const CLIENT: Downstream = Downstream {
    peer: std::net::SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7)), 40000),
    tls: false,
};

/// The engine's defaults, with forwarded headers as `forwarded`.
fn settings(forwarded: bool) -> Settings {
    Settings {
        forwarded_headers: forwarded,
        ..Settings::default()
    }
}

#[test]
fn refusals() {
    let long = format!("/{}", "a".repeat(MAX_REQUEST_LINE));
    let with = |method: Method, uri: &str| head(&[("host", "h")], Version::HTTP_11, method, uri);
    let cases: Vec<(Parts, Option<Refusal>)> = vec![
        (get(&[("host", "h")]), None),
        (get(&[]), Some(Refusal::NoHost)),
        (head(&[], Version::HTTP_10, Method::GET, "/"), None),
        (
            get(&[("host", "h"), ("host", "i")]),
            Some(Refusal::ManyHosts),
        ),
        (
            get(&[("host", "h"), ("host", "h")]),
            Some(Refusal::ManyHosts),
        ),
        (get(&[("host", "h x")]), Some(Refusal::BadHost)),
        (get(&[("host", "")]), Some(Refusal::BadHost)),
        (
            head(&[("host", "a/b")], Version::HTTP_10, Method::GET, "/"),
            Some(Refusal::BadHost),
        ),
        (with(Method::CONNECT, "h:443"), Some(Refusal::Connect)),
        (with(Method::TRACE, "/"), Some(Refusal::Trace)),
        (with(Method::GET, "h:443"), Some(Refusal::AuthorityForm)),
        (with(Method::OPTIONS, "h:443"), Some(Refusal::AuthorityForm)),
        (with(Method::OPTIONS, "*"), None),
        (with(Method::GET, "http://app:81/p"), None),
        (
            with(Method::GET, "http://user@evil/p"),
            Some(Refusal::UserInfo),
        ),
        (
            with(Method::GET, "http://user:pw@evil/p"),
            Some(Refusal::UserInfo),
        ),
        (
            get(&[("host", "h"), ("transfer-encoding", "chunked")]),
            None,
        ),
        (
            get(&[("host", "h"), ("transfer-encoding", " Chunked ")]),
            None,
        ),
        (
            get(&[("host", "h"), ("transfer-encoding", "gzip, chunked")]),
            Some(Refusal::TransferCoding),
        ),
        (
            get(&[("host", "h"), ("transfer-encoding", "chunked, chunked")]),
            Some(Refusal::TransferCoding),
        ),
        (
            get(&[
                ("host", "h"),
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "chunked"),
            ]),
            Some(Refusal::TransferCoding),
        ),
        (with(Method::GET, &long), Some(Refusal::TargetTooLong)),
    ];
    for (head, expected) in cases {
        assert_eq!(refusal(&head), expected, "{head:?}");
    }
}

#[test]
fn hop_by_hop_headers_go_and_the_ones_connection_names() {
    let head = get(&[
        ("host", "app:80"),
        ("connection", "keep-alive, X-Secret, host, content-length"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("te", "trailers"),
        ("trailer", "x-sum"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "websocket"),
        ("http2-settings", "AAMAAABkAAQAAP__"),
        ("x-secret", "1"),
        ("content-length", "3"),
        ("cookie", "a=b"),
    ]);
    let out = request_headers(&head, &CLIENT, &settings(false));
    let names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
    assert_eq!(names, ["host", "content-length", "cookie"]);
}

/// A request asking to switch to `upgrade` with `connection`, and what the server is sent
/// under `allowed`: its `Upgrade` and `Connection`, `None` for absent.
struct Switch {
    upgrade: &'static str,
    connection: &'static str,
    allowed: &'static [&'static str],
    sent: Option<&'static str>,
}

const SWITCHES: &[Switch] = &[
    Switch {
        upgrade: "websocket",
        connection: "keep-alive, Upgrade",
        allowed: &["websocket"],
        sent: Some("websocket"),
    },
    Switch {
        upgrade: "WebSocket/13",
        connection: "UPGRADE",
        allowed: &["websocket"],
        sent: Some("WebSocket/13"),
    },
    Switch {
        upgrade: "h2c",
        connection: "Upgrade, HTTP2-Settings",
        allowed: &["websocket"],
        sent: None,
    },
    Switch {
        upgrade: "h2c, websocket",
        connection: "upgrade",
        allowed: &["WebSocket"],
        sent: Some("websocket"),
    },
    Switch {
        upgrade: "websocket",
        connection: "upgrade",
        allowed: &[],
        sent: None,
    },
    Switch {
        upgrade: "websocket",
        connection: "keep-alive",
        allowed: &["websocket"],
        sent: None,
    },
    Switch {
        upgrade: "foo/2",
        connection: "upgrade",
        allowed: &["foo/1"],
        sent: None,
    },
    Switch {
        upgrade: "foo/1",
        connection: "upgrade",
        allowed: &["foo/1", "h2c"],
        sent: Some("foo/1"),
    },
];

#[test]
fn only_the_allowed_upgrades_reach_the_server() {
    for case in SWITCHES {
        let head = get(&[
            ("host", "h"),
            ("connection", case.connection),
            ("upgrade", case.upgrade),
            ("sec-websocket-key", "k"),
        ]);
        let allowed: Vec<String> = case.allowed.iter().map(|a| a.to_string()).collect();
        let offered = upgrade_to(head.version, &head.headers, &allowed);
        assert_eq!(
            offered.as_ref().map(HeaderValue::as_bytes),
            case.sent.map(str::as_bytes),
            "{} under {:?}",
            case.upgrade,
            case.allowed
        );
        let settings = Settings {
            upgrade_protocols: allowed,
            ..settings(false)
        };
        let out = request_headers(&head, &CLIENT, &settings);
        assert_eq!(
            out.get("upgrade").map(HeaderValue::as_bytes),
            case.sent.map(str::as_bytes)
        );
        let connection = case.sent.map(|_| &b"upgrade"[..]);
        assert_eq!(out.get("connection").map(HeaderValue::as_bytes), connection);
        assert_eq!(out["sec-websocket-key"], "k");
    }
    let old = head(
        &[("connection", "upgrade"), ("upgrade", "websocket")],
        Version::HTTP_10,
        Method::GET,
        "/",
    );
    assert!(upgrade_to(old.version, &old.headers, &["websocket".into()]).is_none());
}

#[test]
fn an_allowed_h2c_keeps_its_settings() {
    let head = get(&[
        ("host", "h"),
        ("connection", "Upgrade, HTTP2-Settings"),
        ("upgrade", "h2c"),
        ("http2-settings", "AAMAAABkAAQAAP__"),
    ]);
    let settings = Settings {
        upgrade_protocols: vec!["h2c".into()],
        ..settings(false)
    };
    let out = request_headers(&head, &CLIENT, &settings);
    assert_eq!(out["upgrade"], "h2c");
    assert_eq!(out["connection"], "upgrade, HTTP2-Settings");
    assert_eq!(out["http2-settings"], "AAMAAABkAAQAAP__");
}

#[test]
fn forwarded_headers_append_the_client_and_set_proto_host_and_real_ip() {
    let head = get(&[
        ("host", "portal.example:8080"),
        ("x-forwarded-for", "203.0.113.1"),
        ("x-forwarded-for", "198.51.100.2"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "spoofed"),
        ("x-real-ip", "10.9.9.9"),
    ]);
    let out = request_headers(&head, &CLIENT, &settings(true));
    assert_eq!(
        out["x-forwarded-for"],
        "203.0.113.1, 198.51.100.2, 192.0.2.7"
    );
    assert_eq!(out.get_all("x-forwarded-for").iter().count(), 1);
    assert_eq!(out["x-forwarded-proto"], "http");
    assert_eq!(out["x-forwarded-host"], "portal.example:8080");
    assert_eq!(out["x-real-ip"], "192.0.2.7");
    assert_eq!(out.get_all("x-real-ip").iter().count(), 1);
    let tls = Downstream {
        tls: true,
        ..CLIENT
    };
    assert_eq!(
        request_headers(&get(&[("host", "h")]), &tls, &settings(true))["x-forwarded-proto"],
        "https"
    );
    let off = request_headers(&head, &CLIENT, &settings(false));
    assert_eq!(off["x-forwarded-proto"], "https");
    assert_eq!(off["x-forwarded-host"], "spoofed");
    assert!(!off.contains_key("x-real-ip"));
}

#[test]
fn addresses_a_client_names_never_reach_the_server() {
    let head = get(&[
        ("host", "h"),
        ("forwarded", "for=10.0.0.1;proto=https"),
        ("x-real-ip", "10.0.0.2"),
        ("true-client-ip", "10.0.0.3"),
        ("x-client-ip", "10.0.0.4"),
        ("x-forwarded-port", "443"),
        ("x-other", "kept"),
    ]);
    for forwarded in [false, true] {
        let out = request_headers(&head, &CLIENT, &settings(forwarded));
        for gone in [
            "forwarded",
            "true-client-ip",
            "x-client-ip",
            "x-forwarded-port",
        ] {
            assert!(!out.contains_key(gone), "{gone} with {forwarded}");
        }
        assert_eq!(
            out.get("x-real-ip").map(HeaderValue::as_bytes),
            forwarded.then_some(&b"192.0.2.7"[..])
        );
        assert_eq!(out["x-other"], "kept");
    }
}

#[test]
fn a_mapped_ipv4_client_is_written_as_ipv4() {
    let Ok(mapped) = "::ffff:192.0.2.9".parse::<IpAddr>() else {
        panic!("address")
    };
    assert_eq!(client_ip(mapped), "192.0.2.9");
    let Ok(v6) = "2001:db8::1".parse::<IpAddr>() else {
        panic!("address")
    };
    assert_eq!(client_ip(v6), "2001:db8::1");
}

#[test]
fn absolute_form_becomes_origin_form_and_gives_the_host() {
    let head = head(
        &[("host", "other")],
        Version::HTTP_11,
        Method::GET,
        "http://app.example:81/p?q=1",
    );
    assert_eq!(origin_form(&head.uri), "/p?q=1");
    let out = request_headers(&head, &CLIENT, &settings(false));
    assert_eq!(out["host"], "app.example:81");
    let Ok(star) = "*".parse::<Uri>() else {
        panic!("uri")
    };
    assert_eq!(origin_form(&star), "*");
    let Ok(plain) = "/x".parse::<Uri>() else {
        panic!("uri")
    };
    assert_eq!(origin_form(&plain), "/x");
}

#[test]
fn a_request_without_host_is_given_the_servers() {
    let server = "app-01:8081";
    let cases: [(Parts, &str); 3] = [
        (head(&[], Version::HTTP_10, Method::GET, "/"), "app-01:8081"),
        (get(&[("host", "portal")]), "portal"),
        (
            head(&[], Version::HTTP_10, Method::GET, "http://named:82/"),
            "named:82",
        ),
    ];
    for (head, host) in cases {
        let mut out = request_headers(&head, &CLIENT, &settings(true));
        host_of_server(&head, &mut out, &server);
        assert_eq!(out["host"], host, "{head:?}");
    }
}

#[test]
fn max_forwards_counts_down_on_options_and_stops_at_zero() {
    // (method, Max-Forwards lines, answered here, what the server is sent)
    let cases: &[(Method, &[&str], bool, Option<&str>)] = &[
        (Method::OPTIONS, &["3"], false, Some("2")),
        (Method::OPTIONS, &["1"], false, Some("0")),
        (Method::OPTIONS, &["0"], true, None),
        (Method::OPTIONS, &["00"], true, None),
        (Method::OPTIONS, &[], false, None),
        (Method::OPTIONS, &["-1"], false, Some("-1")),
        (Method::OPTIONS, &["x"], false, Some("x")),
        (Method::OPTIONS, &["0", "0"], false, Some("0")),
        (
            Method::OPTIONS,
            &["99999999999999999999999"],
            false,
            Some("99999999999999999999999"),
        ),
        (Method::GET, &["0"], false, Some("0")),
        (Method::GET, &["5"], false, Some("5")),
    ];
    for (method, lines, here, sent) in cases {
        let mut raw = vec![("host", "h")];
        raw.extend(lines.iter().map(|l| ("max-forwards", *l)));
        let head = head(&raw, Version::HTTP_11, method.clone(), "/");
        assert_eq!(answered_here(&head), *here, "{method} {lines:?}");
        if *here {
            continue;
        }
        let out = request_headers(&head, &CLIENT, &settings(false));
        assert_eq!(
            out.get("max-forwards").map(HeaderValue::as_bytes),
            sent.map(str::as_bytes),
            "{method} {lines:?}"
        );
    }
    let answer = options_answer();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(answer.headers()["allow"], ALLOW);
    assert!(answer.body().is_empty());
}
