//! The tests' one hand-written HTTP/1.1 client ([`RawClient`]): raw bytes out, each answer
//! read by its framing (a length, chunks, or the connection's end), byte for byte as it came
//! ([`Answer`]) or parsed for the query interface ([`HttpResponse`]), so that a test can send
//! what no library would and see what crosses the broker on the wire. [`HttpConnection`] is
//! the same client under the name the query tests know it by. (hyper's client, in
//! `http_client.rs`, is the other side of the same tests: a conformant client the broker must
//! serve.)

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::scripted::find;
use crate::{DEADLINE, HttpResponse, header};

/// One answer as the client read it off the wire.
#[derive(Clone)]
pub struct Answer {
    /// The status line, without its CRLF.
    pub status_line: String,
    /// The status code.
    pub status: u16,
    /// The head, status line to blank line, exactly as received.
    pub head: Vec<u8>,
    /// The body as it would reach an application (de-chunked).
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", String::from_utf8_lossy(&self.head), self.text())
    }
}

impl Answer {
    /// The value of the first header `name` (any case).
    pub fn header(&self, name: &str) -> Option<String> {
        header(&self.head, name)
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Whether `Connection` says `close`.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// A client connection speaking raw bytes. Bytes read past one answer are kept for the next.
pub struct RawClient {
    /// The connection, for a test that writes to it by hand.
    pub stream: TcpStream,
    buf: Vec<u8>,
}

/// [`RawClient`] under the name the query interface's tests know it by: a monitoring
/// script's client, keep-alive included.
pub type HttpConnection = RawClient;

impl RawClient {
    /// A new connection to `addr`.
    pub async fn connect(addr: SocketAddr) -> RawClient {
        RawClient::on(TcpStream::connect(addr).await.expect("connect to broker"))
    }

    /// The same over a connection already open (and perhaps partly written to).
    pub fn on(stream: TcpStream) -> RawClient {
        RawClient {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends `method path` with `headers` (a `Host` is added) and reads the answer; an error
    /// when the connection ends (or cannot be written to) before an answer's head.
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

    /// Reads one answer as [`HttpResponse`]; `to_head` means it has no body whatever its
    /// `Content-Length` says (the answer to a `HEAD`). An error when the connection ends
    /// before an answer's head.
    pub async fn read_response(&mut self, to_head: bool) -> std::io::Result<HttpResponse> {
        let answer = if to_head {
            self.head().await
        } else {
            self.answer().await
        };
        answer.map(HttpResponse::from).ok_or_else(|| {
            let got = String::from_utf8_lossy(&self.buf);
            let closed = format!("closed before an answer's head; got {got:?}");
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, closed)
        })
    }

    /// Writes `bytes`; false when the broker had closed the connection.
    pub async fn send(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok()
    }

    /// Reads more, within [`DEADLINE`]; false at EOF or an error.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        let read = tokio::time::timeout(DEADLINE, self.stream.read(&mut chunk)).await;
        match read.expect("the broker neither answered nor closed in time") {
            Ok(n) if n > 0 => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            _ => false,
        }
    }

    /// The next answer, read to its framed end (its length, its last chunk, or the
    /// connection's close when it has neither); `None` when the connection closed first. A
    /// body cut short is returned as far as it came.
    pub async fn answer(&mut self) -> Option<Answer> {
        let mut answer = self.head().await?;
        let status = answer.status;
        if (100..200).contains(&status) || status == 204 || status == 304 {
            return Some(answer);
        }
        answer.body = if answer
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            self.chunked().await
        } else if let Some(length) = answer.header("content-length") {
            let length: usize = length.parse().unwrap();
            while self.buf.len() < length && self.fill().await {}
            let n = length.min(self.buf.len());
            self.buf.drain(..n).collect()
        } else {
            while self.fill().await {}
            std::mem::take(&mut self.buf)
        };
        Some(answer)
    }

    /// The next answer's head alone (its body left unread); `None` when the connection
    /// closed first.
    pub async fn head(&mut self) -> Option<Answer> {
        let head = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                break self.buf.drain(..end + 4).collect::<Vec<u8>>();
            }
            if !self.fill().await {
                return None;
            }
        };
        let status_line = String::from_utf8_lossy(head.split(|&b| b == b'\r').next()?).to_string();
        let status = status_line.split(' ').nth(1)?.parse().ok()?;
        Some(Answer {
            status_line,
            status,
            head,
            body: Vec::new(),
        })
    }

    /// The next `n` bytes; fewer when the connection closed first.
    pub async fn bytes(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n && self.fill().await {}
        let n = n.min(self.buf.len());
        self.buf.drain(..n).collect()
    }

    /// A chunked body, as far as it came.
    async fn chunked(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let line = loop {
                if let Some(end) = find(&self.buf, b"\r\n") {
                    break self.buf.drain(..end + 2).take(end).collect::<Vec<u8>>();
                }
                if !self.fill().await {
                    return body;
                }
            };
            let text = String::from_utf8_lossy(&line);
            let Ok(size) = usize::from_str_radix(text.split(';').next().unwrap_or("").trim(), 16)
            else {
                return body;
            };
            if size == 0 {
                return body;
            }
            while self.buf.len() < size + 2 {
                if !self.fill().await {
                    body.append(&mut self.buf);
                    return body;
                }
            }
            body.extend(self.buf.drain(..size));
            self.buf.drain(..2);
        }
    }

    /// Whether the broker closes the connection with nothing more sent (fails the test after
    /// [`DEADLINE`] if it keeps it open).
    pub async fn closed(&mut self) -> bool {
        while self.fill().await {}
        self.buf.is_empty()
    }
}

/// Sends `bytes` on a new connection and reads one answer.
pub async fn raw_request(addr: SocketAddr, bytes: &[u8]) -> Answer {
    let mut client = RawClient::connect(addr).await;
    assert!(
        client.send(bytes).await,
        "the broker closed before the request"
    );
    client.answer().await.expect("an answer")
}

/// A GET of `path` with a `Host`, as raw bytes.
pub fn get_of(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: app.example\r\n\r\n").into_bytes()
}
