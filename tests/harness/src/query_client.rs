//! The query interface as monitoring scripts speak to it, over the harness's one HTTP/1.1
//! client (`raw_client.rs`): its answers parsed, its JSON, its places held.

use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::HttpConnection;

/// One HTTP/1.1 answer as a client reads it.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Header names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body, as far as its length (or the connection's end) says.
    pub body: Vec<u8>,
}

impl From<crate::Answer> for HttpResponse {
    fn from(answer: crate::Answer) -> HttpResponse {
        let head = String::from_utf8_lossy(&answer.head).into_owned();
        let headers = head
            .split("\r\n")
            .skip(1)
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
            .collect();
        HttpResponse {
            status: answer.status,
            headers,
            body: answer.body,
        }
    }
}

impl HttpResponse {
    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }
}

/// Opens one connection per entry of `unfinished` through `addr`, each sending those bytes (the
/// start of a query that never ends), until all of them hold a query place: a `PING` is then
/// refused with 503, which is returned with the connections. A connection answered meanwhile
/// (a probe took the place first, and it was refused) is replaced. Panics when no `PING` is
/// refused within [`DEADLINE`].
pub async fn hold_query_places(
    addr: SocketAddr,
    unfinished: &[&[u8]],
) -> (Vec<TcpStream>, HttpResponse) {
    async fn open(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
        let mut stream = TcpStream::connect(addr).await.expect("connect to broker");
        stream.write_all(bytes).await.expect("send a query start");
        stream
    }
    let mut held = Vec::new();
    for bytes in unfinished {
        held.push(open(addr, bytes).await);
    }
    let refused = format!("a query refused with {} places held", unfinished.len());
    let answer = crate::until(&refused, async || {
        for (stream, bytes) in held.iter_mut().zip(unfinished) {
            let mut byte = [0u8; 1];
            let answered = !matches!(
                stream.try_read(&mut byte),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            );
            if answered {
                *stream = open(addr, bytes).await;
            }
        }
        let answer = http_get(addr, "/TOTVS_BROKER_QUERY/PING", &[]).await;
        if answer.status == 200 {
            return Err("PING answered 200");
        }
        assert_eq!(answer.status, 503, "{}", answer.text());
        Ok(answer)
    })
    .await;
    (held, answer)
}

/// `GET path` on a new connection through `addr`, with `headers`; panics when no answer comes.
pub async fn http_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    let mut connection = HttpConnection::connect(addr).await;
    connection
        .request("GET", path, headers)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Asks `addr` (a balancer's port) for `GET /TOTVS_BROKER_QUERY/JSON` and returns the parsed
/// answer: the live state of that balancer and its servers.
pub async fn query_json(addr: SocketAddr) -> serde_json::Value {
    let query =
        b"GET /TOTVS_BROKER_QUERY/JSON HTTP/1.1\r\nHost: appbroker\r\nConnection: close\r\n\r\n";
    let answer = crate::raw_request(addr, query).await;
    assert_eq!(answer.status, 200, "query answered {answer:?}");
    let body = answer.text();
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("JSON answer: {e}: {body}"))
}

/// The entry of `json` (a [`query_json`] answer) for the server at `address` (`host:port`).
pub fn server_json<'a>(
    json: &'a serde_json::Value,
    address: &str,
) -> Option<&'a serde_json::Value> {
    json["servers"]
        .as_array()
        .expect("`servers` is an array")
        .iter()
        .find(|s| s["server"] == address)
}
