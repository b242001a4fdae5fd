//! Whether each side's connection serves another exchange, decided in one place at the end of
//! each (the anchors' §5 point 10). A server connection goes back to the pool only when the
//! whole request was sent before its response's head arrived and the response was read to its
//! framed end, with nothing after it (otherwise the rest of an early-answered body could be read as
//! the next user's request). A client keeps its connection when its version and `Connection`
//! say so and it was told so in the response head.

use super::{Body, Framing, RequestHead, ResponseHead};

/// What the wiring saw of one exchange, at its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Finish {
    /// The whole request (head and framed body) was written to the server before the
    /// response's head arrived. An early answer (its head before the body was sent whole) is
    /// false whatever happened after: the rest of the body may have gone on while the answer
    /// streamed, and the server may read it as a request of its own.
    pub request_sent: bool,
    /// The response was read to its framed end.
    pub response_read: bool,
    /// Bytes came from the server past the response's end, which nothing asked for.
    pub server_sent_more: bool,
    /// The response head told the client keep-alive ([`client_keep_alive`] said so).
    pub told_keep_alive: bool,
    /// The response was written whole to the client.
    pub response_sent: bool,
    /// Something failed on the way (a timeout, an I/O error, a malformed body).
    pub failed: bool,
}

/// Which connections serve another exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reuse {
    /// The server connection goes back to the pool.
    pub server: bool,
    /// The client connection waits for another request.
    pub client: bool,
}

/// The one decision at an exchange's end (after an upgrade, nothing is reused: the tunnel
/// took both connections).
pub fn reuse(response: &ResponseHead, finish: &Finish) -> Reuse {
    let framed = matches!(
        response.framing(),
        Framing::Body(Body::Empty | Body::Length(_) | Body::Chunked)
    );
    let server = !finish.failed
        && finish.request_sent
        && finish.response_read
        && !finish.server_sent_more
        && framed
        && !response.asked().upgrade
        && response.server_keeps_alive();
    let client = !finish.failed && finish.told_keep_alive && finish.response_sent && framed;
    Reuse { server, client }
}

/// Whether the response head tells the client keep-alive (`Connection` as it is written): the
/// client wants it, its request body was read whole before the response began (an early answer
/// closes: the rest of its body could be read as another request), and the response's end is
/// framed for it (not until close, not de-chunked for HTTP/1.0, not a tunnel).
pub fn client_keep_alive(
    request: &RequestHead,
    response: &ResponseHead,
    request_body_read: bool,
) -> bool {
    let framed = matches!(
        response.framing(),
        Framing::Body(Body::Empty | Body::Length(_) | Body::Chunked)
    );
    request.keep_alive() && request_body_read && framed && !response.dechunks_for(request.version())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::h1::{Asked, HeadScan, Method};

    fn request(raw: &str) -> RequestHead {
        RequestHead::parse(&mut raw.as_bytes().to_vec(), &mut HeadScan::default())
            .unwrap()
            .unwrap()
    }

    fn response(raw: &str, upgrade: bool) -> ResponseHead {
        let asked = Asked {
            method: Method::Get,
            upgrade,
        };
        ResponseHead::parse(
            &mut raw.as_bytes().to_vec(),
            &mut HeadScan::default(),
            asked,
        )
        .unwrap()
        .unwrap()
    }

    const ALL_WELL: Finish = Finish {
        request_sent: true,
        response_read: true,
        server_sent_more: false,
        told_keep_alive: true,
        response_sent: true,
        failed: false,
    };

    /// [`ALL_WELL`] but for one fact, by name.
    fn all_well_but(fact: &str) -> Finish {
        let mut finish = ALL_WELL;
        match fact {
            "request_sent" => finish.request_sent = false,
            "response_read" => finish.response_read = false,
            "server_sent_more" => finish.server_sent_more = true,
            "told_keep_alive" => finish.told_keep_alive = false,
            "response_sent" => finish.response_sent = false,
            "failed" => finish.failed = true,
            _ => {}
        }
        finish
    }

    const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n";

    #[test]
    fn a_server_connection_is_reused_only_after_two_whole_messages() {
        let cases: &[(&str, bool, &str, (bool, bool))] = &[
            (OK, false, "", (true, true)),
            (OK, false, "request_sent", (false, true)),
            (OK, false, "response_read", (false, true)),
            (OK, false, "server_sent_more", (false, true)),
            (OK, false, "failed", (false, false)),
            (OK, false, "told_keep_alive", (true, false)),
            (OK, false, "response_sent", (true, false)),
            (OK, true, "", (false, true)),
            (
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n",
                false,
                "",
                (false, true),
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
                false,
                "",
                (false, true),
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", false, "", (false, false)),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                "",
                (true, true),
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\n\r\n",
                true,
                "",
                (false, false),
            ),
        ];
        for (raw, upgrade, fact, (server, client)) in cases {
            let got = reuse(&response(raw, *upgrade), &all_well_but(fact));
            let expected = Reuse {
                server: *server,
                client: *client,
            };
            assert_eq!(got, expected, "{raw:?} but {fact}");
        }
    }

    #[test]
    fn a_client_is_told_keep_alive_when_its_version_and_the_framing_allow() {
        let get = "GET / HTTP/1.1\r\nHost: h\r\n\r\n";
        let length = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n";
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        let cases: &[(&str, &str, bool, bool)] = &[
            (get, length, true, true),
            (get, length, false, false),
            (get, chunked, true, true),
            (get, "HTTP/1.1 200 OK\r\n\r\n", true, false),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
                length,
                true,
                false,
            ),
            ("GET / HTTP/1.0\r\n\r\n", length, true, false),
            (
                "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                length,
                true,
                true,
            ),
            (
                "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                chunked,
                true,
                false,
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                length,
                true,
                false,
            ),
        ];
        for (req, resp, read, expected) in cases {
            let told = client_keep_alive(&request(req), &response(resp, false), *read);
            assert_eq!(told, *expected, "{req:?} {resp:?} {read}");
        }
    }
}
