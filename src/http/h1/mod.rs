//! The pure core of the HTTP/1.1 engine that owns its connections: heads parsed in place,
//! framing decided by RFC 9112 §6, bodies checked as they pass, and the outgoing head built
//! as slices of the input for one vectored write. No socket, clock, log line or lock
//! here: the wiring drives it and logs what it decides.
//!
//! # What serves which step
//!
//! The wiring (`http::engine`) takes a connection through the steps docs/architecture.md
//! tells once ("The HTTP engine"). Of this core it uses, in that order: [`HeadScan`] and
//! [`RequestHead::parse`] for a head as it arrives (offsets into the buffer, borrowing
//! nothing, so the head lives beside its buffer across awaits); [`RequestHead::to_server`]'s
//! [`Editor`] and [`RequestHead::write`]'s [`OutHead`] for the head on its way
//! ([`OutHead::append_input`], [`OutHead::io_slices`] and [`OutHead::advance`] around one
//! vectored write); a [`BodyReader`] for each body ([`BodyReader::step`], and
//! [`BodyReader::data_ahead`] then [`BodyReader::skip_data`] around a splice);
//! [`ResponseHead::parse`] with what was [`Asked`] ([`RequestHead::asked`]) for the answer,
//! its [`Framing`] for what follows it, [`ResponseHead::to_client`], [`client_keep_alive`]
//! and [`ResponseHead::dechunks_for`] for its way back; and [`reuse()`] at the end.
//!
//! # RFC decisions
//!
//! - Toward clients, strict (RFC 9112 §5.1, §5.2): whitespace before a colon, a folded line,
//!   NUL, a bare CR or any other control byte in a value is a 400. A bare LF ending a line is
//!   accepted (§2.2: a recipient MAY), as hyper and nginx do: every line whose end is not
//!   CRLF is written anew with CRLF, so a server never sees a line the broker read otherwise.
//! - Toward servers, lenient as pingora is: whitespace before a colon is taken out and a
//!   folded line's CRLFs become spaces in place before the head is forwarded (§5.1, §5.2 let a
//!   proxy do exactly this).
//! - Versions (RFC 9110 §2.5, §6.2): `HTTP/1.0` and `HTTP/1.1`; a higher 1.x minor is taken
//!   as 1.1 (httparse refuses it, so the version digit is rewritten in the buffer and the head
//!   parsed again, only on that error); another major is a 505. Everything the broker writes
//!   says `HTTP/1.1`, to servers and to clients of any version.
//! - Requests (RFC 9112 §3.2): one `Host`, required in HTTP/1.1, a host name or address with
//!   an optional port; a target in origin form, `*` for OPTIONS only, an authority for
//!   CONNECT only, or an `http(s)://` address without user info (sent on in origin form, its
//!   authority as `Host`).
//! - Trailers are checked and dropped ([`ChunkedDecoder`] says why); `101` to a request that
//!   asked no upgrade is refused (RFC 9110 §15.2.2); a 1xx is not forwarded to HTTP/1.0.
//! - Framing: below, and each type's documentation.
//!
//! # Framing
//!
//! A request's body ([`Body`]): `chunked` when the last transfer coding is `chunked` (once,
//! and alone: another coding is a 501, a list not ending in it a 400, any on HTTP/1.0 a
//! 400); else `Content-Length` (digits only; repeated with one value it is folded, with two a
//! 400); else empty. With both, the coding wins, the length is not forwarded, and the client
//! connection closes after. A response's ([`Framing`]) follows the request's method and its
//! status: 1xx is interim (101 a tunnel, when an upgrade was asked), HEAD, 204 and 304 have
//! no body whatever they say, a CONNECT's 2xx is a tunnel, then chunked over a length (the
//! length is not forwarded: one framing only), a length, or the rest of the connection.
//!
//! # Layout
//!
//! - `scan`: where a head ends across reads, without parsing it again; partial heads' limits.
//! - `version`: the HTTP version, where httparse cannot judge it.
//! - `field`: header fields as spans, their names recognised once, token lists.
//! - `framing`: `Content-Length` and `Transfer-Encoding`.
//! - `request`: the request head, parsed, checked and framed.
//! - `response`: the response head, parsed, checked and framed.
//! - `chunked`: a chunked body checked as it passes.
//! - `body`: a message body read as it passes, whatever frames it.
//! - `reuse`: whether each side's connection serves another exchange.
//! - `edit`: what changes in a head on its way, and the outgoing head it makes, as slices.
//! - `rewrite`: the standard rewriting each way (hop-by-hop lines out, ...), as edits.
//! - `error`: why a head is refused, in words a page can show.

mod body;
mod chunked;
mod edit;
mod error;
mod field;
mod framing;
mod request;
mod response;
mod reuse;
mod rewrite;
mod scan;
mod version;

#[cfg(test)]
mod tests;

pub use body::{BodyError, BodyReader, Step};
pub use chunked::{ChunkedDecoder, ChunkedError, Part};
pub use edit::{EditError, Editor, OutHead};
pub use error::{HeadError, Syntax};
pub use field::{FieldId, FieldName, FieldRef, Fields};
pub use framing::Body;
pub use request::{HostRule, RequestHead, Target};
pub use response::{Asked, Framing, ResponseHead};
pub use reuse::{Finish, Reuse, client_keep_alive, reuse};
pub use rewrite::{Forwarded, ToClient, ToServer};
pub use scan::HeadScan;

/// The longest request target (beyond it: 414). nginx's line is 8 KiB; TOTVS WebApp targets
/// are short, but portals put state in query strings.
pub const MAX_TARGET: usize = 16 * 1024;

/// The longest head, request line and fields together (beyond it: 431; from a server, 502).
/// Also the largest buffer the wiring needs for a head: the pool's large tier.
pub const MAX_HEAD: usize = 64 * 1024;

/// The most header lines in a request's head (beyond: 431), hyper's limit before: a browser
/// sends about 15. httparse is given this many slots on the stack, uninitialised.
pub const MAX_FIELDS: usize = 100;

/// The most header lines in an answer's head (beyond: 502). Answers are limited by their bytes
/// ([`MAX_HEAD`]) first: a server may send many small lines (a portal's cookies and policies),
/// which nginx and a direct connection pass, so the line limit is as high as a [`FieldId`]
/// (a byte) allows. httparse is given this many slots on the stack, uninitialised.
pub const MAX_RESPONSE_FIELDS: usize = 255;

/// The longest chunk-size line, extensions included (pingora's bound).
pub const MAX_CHUNK_LINE: usize = 8 * 1024;

/// The longest trailer section of a chunked body (pingora's bound); trailers are checked and
/// dropped, never forwarded.
pub const MAX_TRAILERS: usize = 64 * 1024;

/// A run of bytes in the buffer a head was parsed from: an offset and a length (kawa's
/// `Slice`, pingora's `KVRef`), so a head borrows nothing and keeps the original bytes,
/// names in their case included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    /// Where the bytes begin.
    pub start: u32,
    /// How many there are.
    pub len: u32,
}

impl Span {
    /// The span of `len` bytes from `start` (a buffer of 4 GiB or more is never parsed).
    pub(crate) fn new(start: usize, len: usize) -> Span {
        Span {
            start: u32::try_from(start).unwrap_or(u32::MAX),
            len: u32::try_from(len).unwrap_or(0),
        }
    }

    /// The span from `start` to `end`.
    pub(crate) fn between(start: usize, end: usize) -> Span {
        Span::new(start, end.saturating_sub(start))
    }

    /// Where the bytes end.
    pub fn end(self) -> usize {
        self.start as usize + self.len as usize
    }

    /// Its bytes in `buf` (the buffer it was parsed from; empty if `buf` is shorter).
    pub fn of(self, buf: &[u8]) -> &[u8] {
        buf.get(self.start as usize..self.end()).unwrap_or_default()
    }

    /// Where `part`, a slice of `buf`, lies in it.
    pub(crate) fn within(buf: &[u8], part: &[u8]) -> Span {
        let start = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
        Span::new(start, part.len())
    }
}

/// The HTTP/1 versions a message may carry (`HTTP/1.2` and later minors are read as 1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.0: no chunked coding, closes after each exchange unless `keep-alive` is said.
    Http10,
    /// HTTP/1.1.
    Http11,
}

impl Version {
    /// The version of httparse's minor digit (0 or 1).
    pub(crate) fn of_minor(minor: u8) -> Version {
        if minor == 0 {
            Version::Http10
        } else {
            Version::Http11
        }
    }
}

/// A request method, recognised once (methods are case-sensitive: `get` is `Other`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`: its response has no body whatever its head says.
    Head,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
    /// `DELETE`.
    Delete,
    /// `OPTIONS`: the only method with the `*` target.
    Options,
    /// `TRACE`.
    Trace,
    /// `CONNECT`: the only method with an authority target; a 2xx makes a tunnel.
    Connect,
    /// `PATCH`.
    Patch,
    /// Any other token.
    Other,
}

impl Method {
    /// The method named by `token`.
    pub fn of(token: &[u8]) -> Method {
        match token {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"OPTIONS" => Method::Options,
            b"TRACE" => Method::Trace,
            b"CONNECT" => Method::Connect,
            b"PATCH" => Method::Patch,
            _ => Method::Other,
        }
    }

    /// Whether sending it twice means what sending it once does (RFC 9110 §9.2.2): a request
    /// that failed with no answer may be tried on another server.
    pub fn is_idempotent(self) -> bool {
        matches!(
            self,
            Method::Get
                | Method::Head
                | Method::Put
                | Method::Delete
                | Method::Options
                | Method::Trace
        )
    }
}
