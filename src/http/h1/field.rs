//! Header fields as spans into the buffer they were read into: each name recognised once at
//! parse time (the framing, the rewriting and the balancer then compare a small enum, not
//! strings), each line marked clean when its bytes can be forwarded as they came.

use super::{MAX_RESPONSE_FIELDS, Span};

/// The header names the engine acts on, recognised case-insensitively at parse time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldName {
    /// `Host`.
    Host,
    /// `Content-Length`.
    ContentLength,
    /// `Transfer-Encoding`.
    TransferEncoding,
    /// `Connection`: hop-by-hop, and names more hop-by-hop fields.
    Connection,
    /// `Keep-Alive` (hop-by-hop).
    KeepAlive,
    /// `Proxy-Connection` (hop-by-hop, old clients).
    ProxyConnection,
    /// `TE` (hop-by-hop).
    Te,
    /// `Trailer` (not forwarded: trailers are dropped).
    Trailer,
    /// `Upgrade` (hop-by-hop but for an upgrade that goes on).
    Upgrade,
    /// `HTTP2-Settings`, which comes with an `h2c` upgrade.
    Http2Settings,
    /// `Expect`.
    Expect,
    /// `Cookie`: where the affinity cookie is.
    Cookie,
    /// `Set-Cookie`.
    SetCookie,
    /// `Max-Forwards` (TRACE, OPTIONS).
    MaxForwards,
    /// `Forwarded`: client-named, never passed on (the client may not tell the server an
    /// address of its own).
    Forwarded,
    /// `X-Forwarded-For`.
    XForwardedFor,
    /// `X-Forwarded-Host`.
    XForwardedHost,
    /// `X-Forwarded-Proto`.
    XForwardedProto,
    /// `X-Forwarded-Port`: client-named, never passed on.
    XForwardedPort,
    /// `X-Real-IP`: set by the broker, the client's never passed on.
    XRealIp,
    /// `True-Client-IP`: client-named, never passed on.
    TrueClientIp,
    /// `X-Client-IP`: client-named, never passed on.
    XClientIp,
    /// Any other name.
    Other,
}

impl FieldName {
    /// The name `name` is, in any case: its length and first letter pick the one known name
    /// it can be, compared once (a browser's head has about 15 names, most of them none of
    /// these).
    pub fn of(name: &[u8]) -> FieldName {
        let Some(&first) = name.first() else {
            return FieldName::Other;
        };
        let (known, kind): (&[u8], FieldName) = match (name.len(), first | 0x20) {
            (2, b't') => (b"te", FieldName::Te),
            (4, b'h') => (b"host", FieldName::Host),
            (6, b'c') => (b"cookie", FieldName::Cookie),
            (6, b'e') => (b"expect", FieldName::Expect),
            (7, b't') => (b"trailer", FieldName::Trailer),
            (7, b'u') => (b"upgrade", FieldName::Upgrade),
            (9, b'f') => (b"forwarded", FieldName::Forwarded),
            (9, b'x') => (b"x-real-ip", FieldName::XRealIp),
            (10, b'c') => (b"connection", FieldName::Connection),
            (10, b'k') => (b"keep-alive", FieldName::KeepAlive),
            (10, b's') => (b"set-cookie", FieldName::SetCookie),
            (11, b'x') => (b"x-client-ip", FieldName::XClientIp),
            (12, b'm') => (b"max-forwards", FieldName::MaxForwards),
            (14, b'c') => (b"content-length", FieldName::ContentLength),
            (14, b't') => (b"true-client-ip", FieldName::TrueClientIp),
            (14, b'h') => (b"http2-settings", FieldName::Http2Settings),
            (15, b'x') => (b"x-forwarded-for", FieldName::XForwardedFor),
            (16, b'p') => (b"proxy-connection", FieldName::ProxyConnection),
            (16, b'x') if name[12] | 0x20 == b'h' => {
                (b"x-forwarded-host", FieldName::XForwardedHost)
            }
            (16, b'x') => (b"x-forwarded-port", FieldName::XForwardedPort),
            (17, b't') => (b"transfer-encoding", FieldName::TransferEncoding),
            (17, b'x') => (b"x-forwarded-proto", FieldName::XForwardedProto),
            _ => return FieldName::Other,
        };
        if is_named(name, known) {
            kind
        } else {
            FieldName::Other
        }
    }

    /// Its bit in the set of names a head has.
    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// Whether `name` is `known` (lower-case letters, digits and `-`) in any case: a byte where
/// `known` has a letter matches it with its case bit (0x20) set, any other byte exactly. The
/// bytes' differences are folded together with no branch a byte: several times cheaper than
/// `eq_ignore_ascii_case`, which lowers both sides and stops at the first difference.
fn is_named(name: &[u8], known: &[u8]) -> bool {
    let differ = name.iter().zip(known).fold(0, |differ, (&b, &k)| {
        let case = if k.is_ascii_lowercase() { 0x20 } else { 0 };
        differ | ((b | case) ^ k)
    });
    name.len() == known.len() && differ == 0
}

/// One header line: where its name and value are, where the line ends, and whether the line
/// can be forwarded byte for byte (`Name:` then the value, ending in CRLF).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    pub(crate) name: Span,
    pub(crate) value: Span,
    /// Just past the line's LF.
    pub(crate) line_end: u32,
    pub(crate) kind: FieldName,
    pub(crate) clean: bool,
}

impl Field {
    /// The whole line, terminator included.
    pub(crate) fn line(&self) -> Span {
        Span::between(self.name.start as usize, self.line_end as usize)
    }
}

/// Which header line of a head: what [`Fields::iter`] gives and the [`Editor`] takes.
///
/// [`Editor`]: super::Editor
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldId(pub(crate) u8);

impl FieldId {
    /// Its place among the head's fields.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A header line as bytes of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldRef<'a> {
    /// The name as received (its case kept).
    pub name: &'a [u8],
    /// The value, without the whitespace around it.
    pub value: &'a [u8],
    /// The name, recognised.
    pub kind: FieldName,
}

/// A head's header lines, in order.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    list: Vec<Field>,
    /// The names present, a bit each: an absent one is known so without a look.
    kinds: u32,
}

impl Fields {
    /// How many lines.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Every line, with its id, as bytes of `buf` (the buffer the head was parsed from).
    pub fn iter<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = (FieldId, FieldRef<'a>)> {
        self.ids().map(move |id| (id, self.at(buf, id)))
    }

    /// The ids of the lines named `kind`.
    pub fn named(&self, kind: FieldName) -> impl Iterator<Item = FieldId> + '_ {
        let present = self.has(kind);
        self.ids()
            .take_while(move |_| present)
            .filter(move |id| self.list[id.index()].kind == kind)
    }

    /// Whether a line is named `kind`.
    pub fn has(&self, kind: FieldName) -> bool {
        self.kinds & kind.bit() != 0
    }

    /// Line `id` as bytes of `buf`, if the head has it.
    pub fn get<'a>(&self, buf: &'a [u8], id: FieldId) -> Option<FieldRef<'a>> {
        (id.index() < self.list.len()).then(|| self.at(buf, id))
    }

    /// The value of the first line named `name` (in any case).
    pub fn value<'a>(&self, buf: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
        self.list
            .iter()
            .find(|f| f.name.of(buf).eq_ignore_ascii_case(name))
            .map(|f| f.value.of(buf))
    }

    /// The comma-separated elements of every line named `kind`, trimmed, empty ones left
    /// out (RFC 9110 §5.6.1), in order.
    pub fn tokens<'a>(&'a self, buf: &'a [u8], kind: FieldName) -> impl Iterator<Item = &'a [u8]> {
        self.named(kind)
            .flat_map(move |id| list(self.list[id.index()].value.of(buf)))
    }

    pub(crate) fn raw(&self) -> &[Field] {
        &self.list
    }

    fn ids(&self) -> impl Iterator<Item = FieldId> + use<> {
        // At most MAX_RESPONSE_FIELDS lines (a request's are fewer): the ids fit a byte.
        let lines = self.list.len().min(MAX_RESPONSE_FIELDS);
        (0..lines).map(|i| FieldId(u8::try_from(i).unwrap_or(0)))
    }

    fn at<'a>(&self, buf: &'a [u8], id: FieldId) -> FieldRef<'a> {
        let field = &self.list[id.index()];
        FieldRef {
            name: field.name.of(buf),
            value: field.value.of(buf),
            kind: field.kind,
        }
    }

    /// The fields httparse found in `buf`. `lenient` (a server's head): a line folded onto
    /// the next has its CRs and LFs made spaces afterwards, by [`Fields::unfold`].
    pub(crate) fn of_httparse(
        buf: &[u8],
        headers: &[httparse::Header<'_>],
        lenient: bool,
    ) -> Fields {
        let list: Vec<Field> = headers
            .iter()
            .map(|h| field(buf, h.name.as_bytes(), h.value, lenient))
            .collect();
        let kinds = list.iter().fold(0, |kinds, f| kinds | f.kind.bit());
        Fields { list, kinds }
    }

    /// Makes each folded value one line (RFC 9112 §5.2: a proxy replaces each obs-fold with
    /// spaces before forwarding), in place.
    pub(crate) fn unfold(&self, buf: &mut [u8]) {
        for f in self.list.iter().filter(|f| !f.clean) {
            let Some(value) = buf.get_mut(f.value.start as usize..f.value.end()) else {
                continue;
            };
            for b in value.iter_mut().filter(|b| **b == b'\r' || **b == b'\n') {
                *b = b' ';
            }
        }
    }
}

/// One field: its line ends at the first LF after its value; it is clean when the colon
/// follows the name, the line ends with CRLF and the value is not folded.
fn field(buf: &[u8], name: &[u8], value: &[u8], lenient: bool) -> Field {
    let name = Span::within(buf, name);
    let value = Span::within(buf, value);
    let lf = buf
        .get(value.end()..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
        .map_or(buf.len(), |at| value.end() + at);
    let crlf = lf > 0 && buf.get(lf - 1) == Some(&b'\r');
    let colon = buf.get(name.end()) == Some(&b':');
    let folded = lenient && value.of(buf).contains(&b'\n');
    Field {
        name,
        value,
        line_end: u32::try_from(lf + 1).unwrap_or(u32::MAX),
        kind: FieldName::of(name.of(buf)),
        clean: colon && crlf && !folded,
    }
}

/// The elements of a comma-separated list, trimmed of spaces and tabs, empty ones left out.
pub(crate) fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(|e| e.trim_ascii())
        .filter(|e| !e.is_empty())
}

/// What a head's `Connection` lines say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Connection {
    pub(crate) close: bool,
    pub(crate) keep_alive: bool,
    pub(crate) upgrade: bool,
    /// Some token names another field, which is then hop-by-hop too.
    pub(crate) names_others: bool,
}

impl Connection {
    /// The tokens of `fields`' `Connection` lines.
    pub(crate) fn of(fields: &Fields, buf: &[u8]) -> Connection {
        let mut connection = Connection::default();
        for token in fields.tokens(buf, FieldName::Connection) {
            if token.eq_ignore_ascii_case(b"close") {
                connection.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                connection.keep_alive = true;
            } else if token.eq_ignore_ascii_case(b"upgrade") {
                connection.upgrade = true;
            } else {
                connection.names_others = true;
            }
        }
        connection
    }

    /// Whether a `Connection` line names `name`, making it hop-by-hop.
    pub(crate) fn names(self, fields: &Fields, buf: &[u8], name: &[u8]) -> bool {
        self.names_others
            && fields
                .tokens(buf, FieldName::Connection)
                .any(|t| t.eq_ignore_ascii_case(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name [`FieldName::of`] knows.
    const KNOWN: [(&[u8], FieldName); 22] = [
        (b"te", FieldName::Te),
        (b"host", FieldName::Host),
        (b"cookie", FieldName::Cookie),
        (b"expect", FieldName::Expect),
        (b"trailer", FieldName::Trailer),
        (b"upgrade", FieldName::Upgrade),
        (b"forwarded", FieldName::Forwarded),
        (b"x-real-ip", FieldName::XRealIp),
        (b"connection", FieldName::Connection),
        (b"keep-alive", FieldName::KeepAlive),
        (b"set-cookie", FieldName::SetCookie),
        (b"x-client-ip", FieldName::XClientIp),
        (b"max-forwards", FieldName::MaxForwards),
        (b"content-length", FieldName::ContentLength),
        (b"true-client-ip", FieldName::TrueClientIp),
        (b"http2-settings", FieldName::Http2Settings),
        (b"x-forwarded-for", FieldName::XForwardedFor),
        (b"proxy-connection", FieldName::ProxyConnection),
        (b"x-forwarded-host", FieldName::XForwardedHost),
        (b"x-forwarded-port", FieldName::XForwardedPort),
        (b"transfer-encoding", FieldName::TransferEncoding),
        (b"x-forwarded-proto", FieldName::XForwardedProto),
    ];

    #[test]
    fn names_are_recognised_in_any_case_and_only_whole() {
        let cases: &[(&[u8], FieldName)] = &[
            (b"Host", FieldName::Host),
            (b"HOST", FieldName::Host),
            (b"hosts", FieldName::Other),
            (b"Content-Length", FieldName::ContentLength),
            (b"content-lengt", FieldName::Other),
            (b"Transfer-Encoding", FieldName::TransferEncoding),
            (b"Transfer_Encoding", FieldName::Other),
            (b"TE", FieldName::Te),
            (b"X-Forwarded-Proto", FieldName::XForwardedProto),
            (b"x-forwarded-port", FieldName::XForwardedPort),
            (b"x-forwarded-xost", FieldName::Other),
            (b"Proxy-Connection", FieldName::ProxyConnection),
            (b"Set-Cookie", FieldName::SetCookie),
            (b"cookie", FieldName::Cookie),
            (b"", FieldName::Other),
            (b"x-custom-header-that-is-long", FieldName::Other),
        ];
        for (name, kind) in cases {
            assert_eq!(FieldName::of(name), *kind, "{}", name.escape_ascii());
        }
        for (name, kind) in KNOWN {
            assert_eq!(FieldName::of(name), kind);
            assert_eq!(FieldName::of(&name.to_ascii_uppercase()), kind);
            let mut other = name.to_vec();
            other[name.len() - 1] ^= 0x01;
            assert_eq!(
                FieldName::of(&other),
                FieldName::Other,
                "{}",
                other.escape_ascii()
            );
        }
    }

    #[test]
    fn a_known_name_with_any_one_byte_changed_is_itself_only_in_another_case() {
        for (name, kind) in KNOWN {
            for at in 0..name.len() {
                for byte in 0..=u8::MAX {
                    let mut other = name.to_vec();
                    other[at] = byte;
                    let same = byte.to_ascii_lowercase() == name[at];
                    let expected = if same { kind } else { FieldName::Other };
                    assert_eq!(FieldName::of(&other), expected, "{}", other.escape_ascii());
                }
            }
        }
    }

    #[test]
    fn lists_skip_empty_elements_and_trim() {
        let cases: &[(&[u8], &[&[u8]])] = &[
            (b"close", &[b"close"]),
            (b" keep-alive ,\tUpgrade", &[b"keep-alive", b"Upgrade"]),
            (b",,a,, b ,", &[b"a", b"b"]),
            (b"", &[]),
            (b" , ", &[]),
        ];
        for (value, elements) in cases {
            assert_eq!(list(value).collect::<Vec<_>>(), *elements);
        }
    }
}
