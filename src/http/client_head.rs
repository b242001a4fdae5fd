//! A client's request head as the balancer sees it: the core's parsed head over the buffer it
//! was read into, borrowed for the length of a call (choose, intercept, rewrite), so nothing
//! is copied or built for the balancer: its cookies are slices of that buffer.

use super::h1::{FieldId, FieldName, FieldRef, Method, RequestHead, Version};

/// A request head, read in place.
#[derive(Debug, Clone, Copy)]
pub struct ClientHead<'a> {
    head: &'a RequestHead,
    buf: &'a [u8],
}

impl<'a> ClientHead<'a> {
    /// `head`, parsed from `buf`.
    pub fn new(head: &'a RequestHead, buf: &'a [u8]) -> ClientHead<'a> {
        ClientHead { head, buf }
    }

    /// The parsed head.
    pub fn head(&self) -> &'a RequestHead {
        self.head
    }

    /// The method.
    pub fn method(&self) -> Method {
        self.head.method()
    }

    /// The method as received.
    pub fn method_bytes(&self) -> &'a [u8] {
        self.head.method_bytes(self.buf)
    }

    /// The target as received (path and query; or an absolute address).
    pub fn target(&self) -> &'a [u8] {
        self.head.target(self.buf)
    }

    /// The path and query a server is sent (an absolute target's path).
    pub fn path_and_query(&self) -> &'a [u8] {
        self.head.path(self.buf)
    }

    /// The version received.
    pub fn version(&self) -> Version {
        self.head.version()
    }

    /// Every header line, with its id (what an [`Editor`](super::h1::Editor) takes).
    pub fn fields(&self) -> impl Iterator<Item = (FieldId, FieldRef<'a>)> + 'a {
        self.head.fields().iter(self.buf)
    }

    /// The values of the lines named `kind`, in order.
    pub fn values(&self, kind: FieldName) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.lines(kind).map(|(_, value)| value)
    }

    /// The lines named `kind`, in order, each as its id and value: the others are not
    /// looked at.
    pub fn lines(&self, kind: FieldName) -> impl Iterator<Item = (FieldId, &'a [u8])> + 'a {
        let (fields, buf) = (self.head.fields(), self.buf);
        fields
            .named(kind)
            .filter_map(move |id| fields.get(buf, id).map(|field| (id, field.value)))
    }

    /// The value of the first line named `name`, in any case.
    pub fn value(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.head.fields().value(self.buf, name)
    }

    /// Whether the request carries an `Upgrade` line (a WebSocket asked for).
    pub fn asks_upgrade(&self) -> bool {
        self.head.fields().has(FieldName::Upgrade)
    }
}
