//! The standard rewriting each way, as [`Editor`] changes: what a proxy must take out (the
//! hop-by-hop lines, those `Connection` names, the address headers a client names, which it may
//! not tell the server), the framing said once and the broker's way, the `X-Forwarded-*` lines,
//! `Host` for an absolute target or an HTTP/1.0 request without one; toward the client the
//! status line `HTTP/1.1` and `Connection` as decided. Then `write` turns a head and its editor
//! into the [`OutHead`].

use super::edit::{OutHead, Piece};
use super::field::FieldName;
use super::{Body, Editor, FieldId, Framing, RequestHead, ResponseHead, Span, Target, Version};

/// How a request goes to its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToServer<'a> {
    /// `HTTP_FORWARDED_HEADERS`: `X-Forwarded-For` appended, `-Proto`, `-Host` and
    /// `X-Real-IP` set. `None`: the client's `X-Forwarded-*` pass as they are.
    pub forwarded: Option<Forwarded<'a>>,
    /// The upgrade the client asked for goes on (its protocol is allowed): `Upgrade` stays
    /// and `Connection: upgrade` is said. Otherwise the request goes as plain HTTP.
    pub upgrade: bool,
    /// The `Host` a request without one is given (HTTP/1.0): the server's `host:port`.
    pub host: &'a [u8],
    /// The upgrade that goes on offers `h2c`: its `HTTP2-Settings` line goes with it, named
    /// in `Connection` as RFC 7540 §3.2.1 wants. Otherwise that line is not forwarded.
    pub http2_settings: bool,
}

/// The client, as `X-Forwarded-*` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded<'a> {
    /// Its address as text (an IPv4-mapped address written as IPv4), for `X-Real-IP`; `None`
    /// for a client a trusted proxy's chain left unknown, which gets no `X-Real-IP`.
    pub client: Option<&'a [u8]>,
    /// The connection's peer as text, appended to `X-Forwarded-For`: the client itself, or
    /// the trusted proxy whose chain named it.
    pub peer: &'a [u8],
    /// Whether it came over TLS (`X-Forwarded-Proto: https`).
    pub https: bool,
}

/// How a response goes to its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToClient {
    /// The client's version (an HTTP/1.0 client gets no chunks and is told `keep-alive`).
    pub version: Version,
    /// What [`client_keep_alive`](super::client_keep_alive) decided.
    pub keep_alive: bool,
}

const CHUNKED: &[u8] = b"Transfer-Encoding: chunked\r\n";
const HTTP11: &[u8] = b" HTTP/1.1\r\n";

impl RequestHead {
    /// The changes a server needs; the wiring and the balancer may add theirs before
    /// [`RequestHead::write`].
    pub fn to_server(&self, buf: &[u8], how: &ToServer<'_>) -> Editor {
        let mut editor = Editor::new();
        let upgrade = self.asked(how).upgrade;
        for (id, field) in self.fields().iter(buf) {
            let named = || self.connection().names(self.fields(), buf, field.name);
            // An upgrade that goes on keeps the lines its `Connection` names for it.
            let upgrading = upgrade
                && (field.kind == FieldName::Upgrade
                    || (how.http2_settings && field.kind == FieldName::Http2Settings));
            if leaves_for_server(self, id, field.kind, how, upgrade)
                || (removable(field.kind) && !upgrading && named())
            {
                editor.remove(id);
            }
        }
        self.host_line(buf, how, &mut editor);
        frame_request(self, &mut editor);
        if upgrade && how.http2_settings && self.fields().has(FieldName::Http2Settings) {
            editor.add_line(b"Connection: upgrade, HTTP2-Settings\r\n");
        } else if upgrade {
            editor.add_line(b"Connection: upgrade\r\n");
        }
        if let Some(forwarded) = how.forwarded {
            add_forwarded(self, buf, forwarded, &mut editor);
        }
        editor
    }

    /// `Host` from an absolute target's authority, or the server's for a request with none.
    fn host_line(&self, buf: &[u8], how: &ToServer<'_>, editor: &mut Editor) {
        if let Target::Absolute { authority, .. } = self.form() {
            editor.add_unchecked(b"Host", [authority.of(buf)]);
        } else if !self.has_host_line() {
            editor.add_unchecked(b"Host", [how.host]);
        }
    }

    /// The head for the server: the request line (`HTTP/1.1`, origin-form), `editor`'s
    /// lines, the rest as it came.
    pub fn write(&self, buf: &[u8], editor: Editor) -> OutHead {
        editor.write(
            &self.start_line(buf),
            self.fields(),
            blank_line(buf, self.len()),
        )
    }

    /// The request line's pieces: as it came when it can go so, else method, the target in
    /// origin form, and `HTTP/1.1`.
    fn start_line(&self, buf: &[u8]) -> [Piece; 4] {
        let method = self.method_span();
        let target = self.target_span();
        match self.form() {
            Target::Absolute { path, .. } => {
                let slash = path.of(buf).first() != Some(&b'/');
                [
                    Piece::Input(method),
                    Piece::Static(if slash { b" /" } else { b" " }),
                    Piece::Input(path),
                    Piece::Static(HTTP11),
                ]
            }
            _ if self.clean_line() => {
                let line = Span::between(method.start as usize, target.end() + HTTP11.len());
                [
                    Piece::Input(line),
                    Piece::Static(b""),
                    Piece::Static(b""),
                    Piece::Static(b""),
                ]
            }
            _ => [
                Piece::Input(Span::between(method.start as usize, target.end())),
                Piece::Static(HTTP11),
                Piece::Static(b""),
                Piece::Static(b""),
            ],
        }
    }
}

/// Whether a line of `request` is not for the server.
fn leaves_for_server(
    request: &RequestHead,
    id: FieldId,
    kind: FieldName,
    how: &ToServer<'_>,
    upgrade: bool,
) -> bool {
    match kind {
        FieldName::Connection
        | FieldName::KeepAlive
        | FieldName::ProxyConnection
        | FieldName::Te
        | FieldName::Trailer
        | FieldName::TransferEncoding => true,
        FieldName::Http2Settings => !(upgrade && how.http2_settings),
        FieldName::Upgrade => !upgrade,
        FieldName::Forwarded
        | FieldName::XRealIp
        | FieldName::TrueClientIp
        | FieldName::XClientIp
        | FieldName::XForwardedPort => true,
        FieldName::XForwardedFor | FieldName::XForwardedHost | FieldName::XForwardedProto => {
            how.forwarded.is_some()
        }
        FieldName::Host => matches!(request.form(), Target::Absolute { .. }),
        FieldName::ContentLength => request.length().is_none_or(|l| l.first != id),
        _ => false,
    }
}

/// Whether `Connection` naming a line takes it out: not the routing's and framing's own.
fn removable(kind: FieldName) -> bool {
    !matches!(kind, FieldName::Host | FieldName::ContentLength)
}

/// The request's framing said the broker's way: `Transfer-Encoding: chunked` alone, or one
/// `Content-Length` with the bare number.
fn frame_request(request: &RequestHead, editor: &mut Editor) {
    if request.body() == Body::Chunked {
        editor.add_line(CHUNKED);
    } else if let Some(length) = request.length().filter(|l| l.rewrite) {
        set_length(editor, length.first, length.value);
    }
}

fn set_length(editor: &mut Editor, field: FieldId, value: u64) {
    let digits = value.to_string();
    // Digits only: the edit cannot be refused.
    let _ = editor.set(field, &[digits.as_bytes()]);
}

/// `X-Forwarded-For` with the peer appended to the chain the client sent (as nginx's
/// `$proxy_add_x_forwarded_for`), `X-Forwarded-Proto`, `-Host` and `X-Real-IP` the broker's
/// (no `X-Real-IP` for an unknown client: the client's own was taken out).
fn add_forwarded(request: &RequestHead, buf: &[u8], forwarded: Forwarded<'_>, editor: &mut Editor) {
    let fields = request.fields();
    let chain = fields
        .named(FieldName::XForwardedFor)
        .filter_map(|id| fields.get(buf, id))
        .filter(|f| !f.value.is_empty())
        .flat_map(|f| [f.value, &b", "[..]]);
    editor.add_unchecked(b"X-Forwarded-For", chain.chain([forwarded.peer]));
    let proto: &[u8] = if forwarded.https { b"https" } else { b"http" };
    editor.add_unchecked(b"X-Forwarded-Proto", [proto]);
    if let Some(host) = request.host(buf) {
        editor.add_unchecked(b"X-Forwarded-Host", [host]);
    }
    if let Some(client) = forwarded.client {
        editor.add_unchecked(b"X-Real-IP", [client]);
    }
}

impl ResponseHead {
    /// The changes a client needs; the wiring adds the balancer's (`Set-Cookie`) before
    /// [`ResponseHead::write`].
    pub fn to_client(&self, buf: &[u8], how: &ToClient) -> Editor {
        let mut editor = Editor::new();
        let connection = self.connection();
        for (id, field) in self.fields().iter(buf) {
            let named = || connection.names(self.fields(), buf, field.name);
            if leaves_for_client(self, id, field.kind, how) || (removable(field.kind) && named()) {
                editor.remove(id);
            }
        }
        if let Some(length) = self.length().filter(|l| l.rewrite) {
            set_length(&mut editor, length.first, length.value);
        }
        if self.framing() == Framing::Body(Body::Chunked)
            && how.version == Version::Http11
            && self.codings().only_chunked()
        {
            editor.add_line(CHUNKED);
        }
        if let Some(line) = connection_line(self, how) {
            editor.add_line(line);
        }
        editor
    }

    /// The head for the client: the status line `HTTP/1.1`, `editor`'s lines, the rest as
    /// it came (a line with a space before its colon, or unfolded, written anew).
    pub fn write(&self, buf: &[u8], editor: Editor) -> OutHead {
        editor.write(
            &self.start_line(),
            self.fields(),
            blank_line(buf, self.len()),
        )
    }

    fn start_line(&self) -> [Piece; 5] {
        if self.clean_line() {
            let line = self.line();
            let with_crlf = Span::new(line.start as usize, line.len as usize + 2);
            let none = Piece::Static(b"");
            return [Piece::Input(with_crlf), none, none, none, none];
        }
        [
            Piece::Static(b"HTTP/1.1 "),
            Piece::Input(self.code_span()),
            Piece::Static(b" "),
            Piece::Input(self.reason_span()),
            Piece::Static(b"\r\n"),
        ]
    }
}

/// Whether a line of `response` is not for the client.
fn leaves_for_client(
    response: &ResponseHead,
    id: FieldId,
    kind: FieldName,
    how: &ToClient,
) -> bool {
    let framing = response.framing();
    match kind {
        FieldName::Connection
        | FieldName::KeepAlive
        | FieldName::ProxyConnection
        | FieldName::Te
        | FieldName::Trailer
        | FieldName::Http2Settings => true,
        FieldName::Upgrade => !(framing == Framing::Tunnel && response.status() == 101),
        FieldName::TransferEncoding => !keeps_codings(response, how),
        // A 204 has no content whose length it could tell (RFC 9110 §8.6), an interim answer
        // none at all; a 304's or a HEAD's tells the length of the representation, and stays
        // (as nginx keeps it).
        FieldName::ContentLength => match (framing, response.length()) {
            _ if response.status() == 204 => true,
            (Framing::Body(Body::Empty | Body::Length(_)), Some(length)) => length.first != id,
            (Framing::Body(Body::Empty), None) => false,
            _ => true,
        },
        _ => false,
    }
}

/// Whether the server's `Transfer-Encoding` lines go to the client as they came: to an
/// HTTP/1.1 client, when they name a coding besides `chunked` (its body is then still coded,
/// and only they say so).
fn keeps_codings(response: &ResponseHead, how: &ToClient) -> bool {
    how.version == Version::Http11
        && matches!(
            response.framing(),
            Framing::Body(Body::Chunked | Body::UntilClose)
        )
        && response.codings().present
        && !response.codings().only_chunked()
}

/// The `Connection` line a client is told: `upgrade` for a 101, none for an interim
/// response or a CONNECT tunnel, else `close`, or `keep-alive` to HTTP/1.0 (1.1's default).
fn connection_line(response: &ResponseHead, how: &ToClient) -> Option<&'static [u8]> {
    match response.framing() {
        Framing::Tunnel if response.status() == 101 => Some(b"Connection: upgrade\r\n"),
        Framing::Tunnel | Framing::Interim => None,
        Framing::Body(_) if !how.keep_alive => Some(b"Connection: close\r\n"),
        Framing::Body(_) if how.version == Version::Http10 => Some(b"Connection: keep-alive\r\n"),
        Framing::Body(_) => None,
    }
}

/// The blank line that ends a head of `len` bytes: as it came when it is CRLF.
fn blank_line(buf: &[u8], len: usize) -> Piece {
    if len >= 2 && buf.get(len - 2..len) == Some(b"\r\n") {
        Piece::Input(Span::new(len - 2, 2))
    } else {
        Piece::Static(b"\r\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::h1::{Asked, HeadScan, Method};

    const TO_SERVER: ToServer<'static> = ToServer {
        forwarded: Some(Forwarded {
            client: Some(b"192.0.2.7"),
            peer: b"192.0.2.7",
            https: false,
        }),
        upgrade: true,
        host: b"app1:8080",
        http2_settings: false,
    };

    /// The head `raw` is sent to its server as, `how` applied.
    fn to_server(raw: &str, how: &ToServer<'_>) -> String {
        let mut buf = raw.as_bytes().to_vec();
        let head = RequestHead::parse(&mut buf, &mut HeadScan::default())
            .unwrap()
            .unwrap();
        let editor = head.to_server(&buf, how);
        String::from_utf8_lossy(&head.write(&buf, editor).to_vec(&buf)).into_owned()
    }

    /// The head `raw` (a response to a GET) is sent to its client as.
    fn to_client(raw: &str, how: &ToClient, upgrade: bool) -> String {
        let mut buf = raw.as_bytes().to_vec();
        let asked = Asked {
            method: Method::Get,
            upgrade,
        };
        let head = ResponseHead::parse(&mut buf, &mut HeadScan::default(), asked)
            .unwrap()
            .unwrap();
        let editor = head.to_client(&buf, how);
        String::from_utf8_lossy(&head.write(&buf, editor).to_vec(&buf)).into_owned()
    }

    /// A client's request, how it goes, what the server gets.
    const TO_SERVER_CASES: &[(&str, ToServer<'static>, &str)] = &[
        (
            "GET /a?b HTTP/1.1\r\nHost: portal:80\r\nAccept: */*\r\n\r\n",
            TO_SERVER,
            "GET /a?b HTTP/1.1\r\nX-Forwarded-For: 192.0.2.7\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: portal:80\r\nX-Real-IP: 192.0.2.7\r\nHost: portal:80\r\nAccept: */*\r\n\r\n",
        ),
        (
            "GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, X-Secret, Host, Content-Length\r\nKeep-Alive: 5\r\nProxy-Connection: k\r\nTE: trailers\r\nTrailer: x\r\nUpgrade: h2c\r\nHTTP2-Settings: a\r\nX-Secret: 1\r\nContent-Length: 0\r\nCookie: a=b\r\n\r\n",
            ToServer {
                forwarded: None,
                upgrade: false,
                host: b"",
                http2_settings: false,
            },
            "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\nCookie: a=b\r\n\r\n",
        ),
        (
            "GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 203.0.113.1\r\nX-Forwarded-For: 198.51.100.2\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: spoofed\r\nX-Real-IP: 1.1.1.1\r\nForwarded: for=x\r\nTrue-Client-IP: 1\r\nX-Client-IP: 1\r\nX-Forwarded-Port: 1\r\n\r\n",
            TO_SERVER,
            "GET / HTTP/1.1\r\nX-Forwarded-For: 203.0.113.1, 198.51.100.2, 192.0.2.7\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: h\r\nX-Real-IP: 192.0.2.7\r\nHost: h\r\n\r\n",
        ),
        // A client a trusted proxy's chain left unknown: no X-Real-IP, not even its own.
        (
            "GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: unknown\r\nX-Real-IP: 10.0.0.1\r\n\r\n",
            ToServer {
                forwarded: Some(Forwarded {
                    client: None,
                    peer: b"10.0.0.1",
                    https: true,
                }),
                ..TO_SERVER
            },
            "GET / HTTP/1.1\r\nX-Forwarded-For: unknown, 10.0.0.1\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: h\r\nHost: h\r\n\r\n",
        ),
        (
            "GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-Proto: https\r\nX-Real-IP: 1.1.1.1\r\n\r\n",
            ToServer {
                forwarded: None,
                ..TO_SERVER
            },
            "GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-Proto: https\r\n\r\n",
        ),
        (
            "GET /chat HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n",
            ToServer {
                forwarded: None,
                ..TO_SERVER
            },
            "GET /chat HTTP/1.1\r\nConnection: upgrade\r\nHost: h\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n",
        ),
        (
            "GET /chat HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
            ToServer {
                forwarded: None,
                upgrade: false,
                host: b"",
                http2_settings: false,
            },
            "GET /chat HTTP/1.1\r\nHost: h\r\n\r\n",
        ),
        (
            "GET /h2 HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMA\r\n\r\n",
            ToServer {
                forwarded: None,
                http2_settings: true,
                ..TO_SERVER
            },
            "GET /h2 HTTP/1.1\r\nConnection: upgrade, HTTP2-Settings\r\nHost: h\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMA\r\n\r\n",
        ),
        (
            "GET HTTP://app:81?q HTTP/1.1\r\nHost: other\r\n\r\n",
            ToServer {
                forwarded: None,
                ..TO_SERVER
            },
            "GET /?q HTTP/1.1\r\nHost: app:81\r\n\r\n",
        ),
        (
            "GET http://app/p HTTP/1.0\r\n\r\n",
            ToServer {
                forwarded: None,
                ..TO_SERVER
            },
            "GET /p HTTP/1.1\r\nHost: app\r\n\r\n",
        ),
        (
            "GET /old HTTP/1.0\n\n",
            ToServer {
                forwarded: None,
                ..TO_SERVER
            },
            "GET /old HTTP/1.1\r\nHost: app1:8080\r\n\r\n",
        ),
        (
            "\r\nGET / HTTP/1.2\r\nHost: h\nA: 1\r\n\r\n",
            ToServer {
                forwarded: None,
                ..TO_SERVER
            },
            "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\n\r\n",
        ),
        (
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            ToServer {
                forwarded: None,
                ..TO_SERVER
            },
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: h\r\n\r\n",
        ),
        (
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n",
            ToServer {
                forwarded: None,
                ..TO_SERVER
            },
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n",
        ),
    ];

    #[test]
    fn a_request_loses_its_hop_by_hop_lines_and_gains_the_forwarded_ones() {
        for (raw, how, expected) in TO_SERVER_CASES {
            assert_eq!(to_server(raw, how), *expected, "{raw:?}");
        }
    }

    const KEPT: ToClient = ToClient {
        version: Version::Http11,
        keep_alive: true,
    };
    const CLOSE: ToClient = ToClient {
        version: Version::Http11,
        keep_alive: false,
    };
    const OLD: ToClient = ToClient {
        version: Version::Http10,
        keep_alive: true,
    };
    const OLD_CLOSE: ToClient = ToClient {
        version: Version::Http10,
        keep_alive: false,
    };

    /// A server's response, how it goes, whether an upgrade was asked, what the client gets.
    const TO_CLIENT: &[(&str, ToClient, bool, &str)] = &[
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
            CLOSE,
            false,
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n",
        ),
        (
            "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
            OLD,
            false,
            "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            OLD_CLOSE,
            false,
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\r\nConnection: CLOSE, X-A\r\nKeep-Alive: timeout=5\r\nX-A: 1\r\nX-B: 2\r\nContent-Length: 0\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 200 OK\r\nX-B: 2\r\nContent-Length: 0\r\n\r\n",
        ),
        (
            "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: a\r\n\r\n",
            KEPT,
            true,
            "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: a\r\n\r\n",
        ),
        (
            "HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n",
        ),
        // No framing lines on a 204 nor on an interim answer; a 304 keeps its length.
        (
            "HTTP/1.1 204 No Content\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\nX: 1\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 204 No Content\r\nX: 1\r\n\r\n",
        ),
        (
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 6\r\n\r\n",
        ),
        (
            "HTTP/1.1 100 Continue\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 100 Continue\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\r\nServer : s\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n",
            KEPT,
            false,
            "HTTP/1.1 200 OK\r\nServer: s\r\nX: a   b\r\nContent-Length: 0\r\n\r\n",
        ),
        (
            "HTTP/1.1 200\nContent-Length: 0\n\n",
            KEPT,
            false,
            "HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\r\n\r\n",
            CLOSE,
            false,
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            CLOSE,
            false,
            "HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: gzip\r\n\r\n",
        ),
    ];

    #[test]
    fn a_response_says_http_1_1_its_framing_once_and_the_connection_as_decided() {
        for (raw, how, upgrade, expected) in TO_CLIENT {
            assert_eq!(to_client(raw, how, *upgrade), *expected, "{raw:?}");
        }
    }

    #[test]
    fn the_balancer_sets_a_cookie_and_takes_its_own_out() {
        let mut buf =
            b"GET / HTTP/1.1\r\nHost: h\r\nCookie: a=1; TOTVS_BROKER_SH_001=01.x; b=2\r\n\r\n"
                .to_vec();
        let head = RequestHead::parse(&mut buf, &mut HeadScan::default())
            .unwrap()
            .unwrap();
        let mut editor = head.to_server(
            &buf,
            &ToServer {
                forwarded: None,
                ..TO_SERVER
            },
        );
        let cookie = head.fields().named(FieldName::Cookie).next().unwrap();
        editor.set(cookie, &[b"a=1", b"; ", b"b=2"]).unwrap();
        let out = head.write(&buf, editor);
        assert_eq!(
            out.to_vec(&buf),
            b"GET / HTTP/1.1\r\nHost: h\r\nCookie: a=1; b=2\r\n\r\n"
        );
        let mut editor = head.to_server(
            &buf,
            &ToServer {
                forwarded: None,
                ..TO_SERVER
            },
        );
        editor.remove(cookie);
        assert_eq!(
            head.write(&buf, editor).to_vec(&buf),
            b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
        );
    }

    #[test]
    fn an_unchanged_head_is_one_slice_with_its_first_body_bytes() {
        let mut buf = b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc".to_vec();
        let head = RequestHead::parse(&mut buf, &mut HeadScan::default())
            .unwrap()
            .unwrap();
        let editor = head.to_server(
            &buf,
            &ToServer {
                forwarded: None,
                ..TO_SERVER
            },
        );
        let mut out = head.write(&buf, editor);
        out.append_input(Span::between(head.len(), buf.len()));
        assert_eq!(out.slices(), 1);
        assert_eq!(out.to_vec(&buf), buf);
    }
}
