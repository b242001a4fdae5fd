//! A request the balancer answers itself (the query interface), and its answer, as any front gives
//! them: the engine's HTTP/1.1 connections today, an HTTP/2 stream tomorrow. Nothing here is tied
//! to a parsed HTTP/1.1 head or to a library's types: a method, a target, header lines as bytes,
//! who asks and over what, and a body read whole within [`MOST_LOCAL_BODY`]; the answer is a
//! status, lines and a body, which the front frames and writes.

use std::borrow::Cow;
use std::net::IpAddr;

use super::ClientAddr;

/// The longest body a request answered by the balancer may carry: a form's few fields with
/// room to spare. A longer one is not read (the request says so: [`LocalBody::TooLarge`]),
/// and its connection closes after the answer.
pub const MOST_LOCAL_BODY: usize = 16 * 1024;

/// A request answered by the balancer, its bytes owned: made only for such requests, so the
/// forwarded ones cost nothing of it.
#[derive(Debug, Clone)]
pub struct LocalRequest {
    /// The method, the target, then each line's name and value, back to back.
    text: Vec<u8>,
    /// Where the method ends in `text`, and the target after it.
    method_end: usize,
    target_end: usize,
    /// Each line as the end of its name and the end of its value in `text` (the name starts
    /// where the last value ended).
    fields: Vec<(usize, usize)>,
    /// Who asks: the connection's peer, or the client a trusted proxy names, or unknown.
    pub client: ClientAddr,
    /// The request came over TLS.
    pub tls: bool,
    /// The trusted proxy (`HTTP_TRUSTED_PROXIES`) the request came through, when `client` is
    /// the one its `X-Forwarded-For` named: then the connection's peer is the proxy, and the
    /// connection carries other clients' requests too (refusing this one does not end it).
    pub via: Option<IpAddr>,
    /// A PROXY protocol header named the connection's client, sent by a front off this host
    /// ([`Downstream::front_off_host`](crate::http::Downstream::front_off_host)).
    pub front_off_host: bool,
    /// The request line's length as received (method, target and version; an HTTP/2
    /// stream's method and path), which the query interface's limits weigh.
    pub line_len: usize,
    /// The head's length as received (request line and lines), likewise.
    pub head_len: usize,
    /// The body.
    pub body: LocalBody,
}

/// A body as the balancer's answer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalBody {
    /// Read whole (empty when the request had none).
    Whole(Vec<u8>),
    /// Longer than [`MOST_LOCAL_BODY`]: not read.
    TooLarge,
}

impl LocalRequest {
    /// A request of `method` for `target` (path and query), without lines or body yet.
    pub fn new(method: &[u8], target: &[u8], client: ClientAddr, tls: bool) -> LocalRequest {
        let mut text = Vec::with_capacity(method.len() + target.len() + 256);
        text.extend_from_slice(method);
        let method_end = text.len();
        text.extend_from_slice(target);
        LocalRequest {
            target_end: text.len(),
            text,
            method_end,
            fields: Vec::new(),
            client,
            tls,
            via: None,
            front_off_host: false,
            line_len: method.len() + target.len(),
            head_len: method.len() + target.len(),
            body: LocalBody::Whole(Vec::new()),
        }
    }

    /// Adds a header line.
    pub fn push_field(&mut self, name: &[u8], value: &[u8]) {
        self.text.extend_from_slice(name);
        let name_end = self.text.len();
        self.text.extend_from_slice(value);
        self.fields.push((name_end, self.text.len()));
    }

    /// The method as received (`GET`).
    pub fn method(&self) -> &[u8] {
        &self.text[..self.method_end]
    }

    /// The target: path and query.
    pub fn target(&self) -> &[u8] {
        &self.text[self.method_end..self.target_end]
    }

    /// The path: the target up to its `?`.
    pub fn path(&self) -> &[u8] {
        let target = self.target();
        target.split(|&b| b == b'?').next().unwrap_or(target)
    }

    /// The query: what follows the target's first `?`, if it has one.
    pub fn query(&self) -> Option<&[u8]> {
        let target = self.target();
        let at = target.iter().position(|&b| b == b'?')?;
        Some(&target[at + 1..])
    }

    /// Every header line, name and value, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut start = self.target_end;
        self.fields.iter().map(move |&(name_end, value_end)| {
            let line = (&self.text[start..name_end], &self.text[name_end..value_end]);
            start = value_end;
            line
        })
    }

    /// The values of the lines named `name` (in any case), in order.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.fields()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, value)| value)
    }

    /// The value of the first line named `name` (in any case).
    pub fn value(&self, name: &str) -> Option<&[u8]> {
        self.fields()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, value)| value)
    }
}

/// The balancer's answer to a [`LocalRequest`]: the front frames it (its length, its
/// `Connection`) and writes it, a `HEAD` getting the head alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalAnswer {
    /// The status code.
    pub status: u16,
    /// Its header lines but those that frame it or end its connection, which are the
    /// front's to say.
    pub fields: Vec<(&'static str, Cow<'static, str>)>,
    /// The body.
    pub body: Vec<u8>,
    /// The connection closes after it (a refusal, no query place free, a query connection
    /// past its life).
    pub close: bool,
    /// The connection closes without this answer, as any kept-alive connection its server
    /// closes between two requests: a client sends its request again on a new one (a query
    /// connection whose place went to another query while it idled; a 503 instead would show
    /// in the browser of a status page that only meant to refresh).
    pub unanswered: bool,
}

impl LocalAnswer {
    /// An answer of `status` with `body` and no lines yet, the connection kept.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> LocalAnswer {
        LocalAnswer {
            status,
            fields: Vec::new(),
            body: body.into(),
            close: false,
            unanswered: false,
        }
    }

    /// No answer: the connection closes without one ([`LocalAnswer::unanswered`]).
    pub fn none() -> LocalAnswer {
        LocalAnswer {
            unanswered: true,
            close: true,
            ..LocalAnswer::new(0, Vec::new())
        }
    }

    /// Adds the line `name: value`.
    pub fn with(mut self, name: &'static str, value: impl Into<Cow<'static, str>>) -> Self {
        self.fields.push((name, value.into()));
        self
    }

    /// The value of its first line named `name` (in any case).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_keeps_its_lines_as_bytes_in_order() {
        let mut request =
            LocalRequest::new(b"GET", b"/Q/STATUS?lang=pt", ClientAddr::Unknown, false);
        request.push_field(b"Host", b"broker:5000");
        request.push_field(b"Accept-Language", b"pt-BR");
        request.push_field(b"accept-language", b"\xe9");
        assert_eq!(request.method(), b"GET");
        assert_eq!(request.path(), b"/Q/STATUS");
        assert_eq!(request.query(), Some(&b"lang=pt"[..]));
        let lines: Vec<_> = request.fields().collect();
        assert_eq!(lines[0], (&b"Host"[..], &b"broker:5000"[..]));
        let languages: Vec<_> = request.values("ACCEPT-LANGUAGE").collect();
        assert_eq!(languages, [&b"pt-BR"[..], b"\xe9"]);
        assert_eq!(request.value("host"), Some(&b"broker:5000"[..]));
        assert_eq!(request.value("cookie"), None);
        let bare = LocalRequest::new(b"HEAD", b"/Q", ClientAddr::Unknown, true);
        assert_eq!((bare.path(), bare.query()), (&b"/Q"[..], None));
        assert_eq!(bare.fields().count(), 0);
    }
}
