//! The engine's HTTP/1.1 answer head as an HTTP/2 response: its status and fields, without
//! those that are the HTTP/1.1 connection's own (RFC 9113 §8.2.2: `Connection`,
//! `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade` are malformed in HTTP/2;
//! the engine's `Connection: close` is one). The reason phrase has no place in HTTP/2. A
//! WebSocket's `101` becomes RFC 8441's `200`, its `Sec-WebSocket-Accept` checked here and
//! not passed on (the HTTP/2 client sent no key).

use bytes::Bytes;
use hyper::http::{HeaderName, HeaderValue, Response, StatusCode};

use crate::http::h1::{FieldName, ResponseHead};

/// The HTTP/2 response of `head` (parsed from `buf`). `websocket`: the key the request was
/// sent with, when it asked a WebSocket: a `101` then becomes a `200` when the server's
/// `Sec-WebSocket-Accept` answers that key, and `None` when it does not (a server that did
/// not speak WebSocket: the stream is failed).
pub(super) fn response(
    head: &ResponseHead,
    buf: &Bytes,
    websocket: Option<&str>,
) -> Option<Response<()>> {
    let switched = head.status() == 101;
    let status = match (switched, websocket) {
        (true, Some(key)) if accepts(head, buf, key) => StatusCode::OK,
        (true, _) => return None,
        _ => StatusCode::from_u16(head.status()).ok()?,
    };
    let mut response = Response::new(());
    *response.status_mut() = status;
    let fields = response.headers_mut();
    fields.reserve(head.fields().len());
    for (_, field) in head.fields().iter(buf) {
        if connection_specific(field.kind)
            || (switched && field.name.eq_ignore_ascii_case(b"sec-websocket-accept"))
        {
            continue;
        }
        // The engine checked every line it writes; one these types refuse is dropped rather
        // than failing the answer. A value is a slice of the head's bytes, not a copy.
        let value = buf.slice_ref(field.value);
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(field.name),
            HeaderValue::from_maybe_shared(value),
        ) else {
            continue;
        };
        fields.append(name, value);
    }
    Some(response)
}

/// Whether a field is the HTTP/1.1 connection's own, which HTTP/2 has no room for.
fn connection_specific(kind: FieldName) -> bool {
    matches!(
        kind,
        FieldName::Connection
            | FieldName::KeepAlive
            | FieldName::ProxyConnection
            | FieldName::TransferEncoding
            | FieldName::Upgrade
            | FieldName::Trailer
    )
}

/// Whether the `101`'s `Sec-WebSocket-Accept` is the one `key` asks (RFC 6455 §4.2.2).
fn accepts(head: &ResponseHead, buf: &[u8], key: &str) -> bool {
    let expected = accept_of(key);
    let mut accepts = head
        .fields()
        .iter(buf)
        .filter(|(_, f)| f.name.eq_ignore_ascii_case(b"sec-websocket-accept"));
    matches!(
        (accepts.next(), accepts.next()),
        (Some((_, field)), None) if field.value == expected.as_bytes()
    )
}

/// The `Sec-WebSocket-Accept` a server answers `key` with: the base64 of the SHA-1 of the key
/// and RFC 6455's GUID (tungstenite's, already built for the demo's WebSocket servers).
fn accept_of(key: &str) -> String {
    tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes())
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64 (RFC 6455 §4.1).
pub(super) fn websocket_key() -> String {
    tokio_tungstenite::tungstenite::handshake::client::generate_key()
}
