//! A tiny HTTP/1.1 client for the query interface, as monitoring scripts speak to it.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::DEADLINE;

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

/// A tiny HTTP/1.1 client over one TCP connection: enough to speak to the query interface as
/// a monitoring script does, keep-alive included. Bytes read past one answer are kept for the
/// next.
pub struct HttpConnection {
    /// The connection, for a test that writes to it by hand.
    pub stream: TcpStream,
    buffer: Vec<u8>,
}

impl HttpConnection {
    /// A new connection to `addr`.
    pub async fn connect(addr: SocketAddr) -> HttpConnection {
        HttpConnection::on(TcpStream::connect(addr).await.expect("connect to broker"))
    }

    /// The same over a connection already open (and perhaps partly written to).
    pub fn on(stream: TcpStream) -> HttpConnection {
        HttpConnection {
            stream,
            buffer: Vec::new(),
        }
    }

    /// Sends `method path` with `headers` (a `Host` is added) and reads the answer.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> std::io::Result<HttpResponse> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        self.stream.write_all(head.as_bytes()).await?;
        self.read_response(method.eq_ignore_ascii_case("HEAD"))
            .await
    }

    /// Reads one answer; `to_head` means it has no body whatever its Content-Length says.
    pub async fn read_response(&mut self, to_head: bool) -> std::io::Result<HttpResponse> {
        let end = loop {
            if let Some(at) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if self.fill().await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "closed before an answer's head; got {:?}",
                        String::from_utf8_lossy(&self.buffer)
                    ),
                ));
            }
        };
        let head = String::from_utf8_lossy(&self.buffer[..end]).to_string();
        self.buffer.drain(..end);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        assert!(
            version == "HTTP/1.1" || version == "HTTP/1.0",
            "not an HTTP status line: {status_line:?}"
        );
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status code in {status_line:?}"));
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (name, value) = l
                    .split_once(':')
                    .unwrap_or_else(|| panic!("header line without a colon: {l:?}"));
                (name.trim().to_ascii_lowercase(), value.trim().to_string())
            })
            .collect();
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map(|(_, v)| v.parse::<usize>().expect("numeric Content-Length"));
        let body = match (to_head, length) {
            (true, _) => Vec::new(),
            (false, Some(length)) => {
                while self.buffer.len() < length {
                    if self.fill().await? == 0 {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("closed after {} of {length} body bytes", self.buffer.len()),
                        ));
                    }
                }
                self.buffer.drain(..length).collect()
            }
            // No length: the body runs to the end of the connection.
            (false, None) => {
                while self.fill().await? > 0 {}
                std::mem::take(&mut self.buffer)
            }
        };
        Ok(HttpResponse {
            status,
            headers,
            body,
        })
    }

    async fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 8192];
        let n = tokio::time::timeout(DEADLINE, self.stream.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
        self.buffer.extend_from_slice(&chunk[..n]);
        Ok(n)
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
    let mut stream = TcpStream::connect(addr).await.expect("connect for a query");
    stream
        .write_all(
            b"GET /TOTVS_BROKER_QUERY/JSON HTTP/1.1\r\nHost: appbroker\r\nConnection: close\r\n\r\n",
        )
        .await
        .expect("send the query");
    let mut response = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut response))
        .await
        .expect("query answered in time")
        .expect("read the answer");
    let text = String::from_utf8(response).expect("answer in UTF-8");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {text:?}"));
    assert!(head.starts_with("HTTP/1.1 200"), "query answered {head:?}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("JSON answer: {e}: {body}"))
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
