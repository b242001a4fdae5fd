//! A pure driver of the core, as the wiring will drive it but over bytes instead of sockets:
//! a client's bytes, arriving in given pieces, become the requests they frame (each head and
//! its body), up to a refusal, a broken body, a connection that does not stay, or the end of
//! the input; a server's bytes become the responses to one request. The property and
//! differential tests judge the core through it.

use crate::http::h1::{
    Asked, BodyReader, Framing, HeadScan, Part, RequestHead, ResponseHead, Version,
};

/// One request as framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) method: Vec<u8>,
    pub(crate) target: Vec<u8>,
    pub(crate) version: Version,
    /// Its body's data, or `None` when the body broke off or was malformed.
    pub(crate) body: Option<Vec<u8>>,
}

/// What a client's bytes came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Requests {
    pub(crate) messages: Vec<Message>,
    /// The status a head was refused with, if one was.
    pub(crate) refused: Option<u16>,
    /// Heads parsed only by the last try at the input's end: none, when the scan finds the
    /// end of every head that came whole.
    pub(crate) heads_at_eof: usize,
}

/// Bytes arriving in pieces: `input` cut at `cuts` (sorted or not, out of range ignored).
pub(crate) struct Arrival<'a> {
    input: &'a [u8],
    ends: Vec<usize>,
    next: usize,
}

impl<'a> Arrival<'a> {
    pub(crate) fn new(input: &'a [u8], cuts: &[usize]) -> Arrival<'a> {
        let mut ends: Vec<usize> = cuts
            .iter()
            .copied()
            .filter(|&c| c > 0 && c < input.len())
            .collect();
        ends.push(input.len());
        ends.sort_unstable();
        ends.dedup();
        Arrival {
            input,
            ends,
            next: 0,
        }
    }

    /// The next piece into `buf`; false at the end of the input.
    fn read(&mut self, buf: &mut Vec<u8>) -> bool {
        let from = self
            .ends
            .get(self.next.wrapping_sub(1))
            .copied()
            .unwrap_or(0);
        let Some(&to) = self.ends.get(self.next) else {
            return false;
        };
        self.next += 1;
        buf.extend_from_slice(&self.input[from.min(to)..to]);
        true
    }
}

/// The requests `input` frames, read in the pieces `cuts` make.
pub(crate) fn requests(input: &[u8], cuts: &[usize]) -> Requests {
    let mut arrival = Arrival::new(input, cuts);
    let mut buf = Vec::new();
    let mut seen = Requests::default();
    let mut start = 0;
    // Each turn frames one request: a bound on the turns guards the test from a loop.
    for _ in 0..=input.len() {
        let Some(head) = next_request(&mut buf, start, &mut arrival, &mut seen) else {
            break;
        };
        let (body, end) = read_body(
            BodyReader::new(head.body()),
            &mut buf,
            start + head.len(),
            &mut arrival,
        );
        let whole = body.is_some();
        seen.messages.push(Message {
            method: head.method_bytes(&buf[start..]).to_vec(),
            target: head.target(&buf[start..]).to_vec(),
            version: head.version(),
            body,
        });
        if !whole || !head.keep_alive() {
            break;
        }
        start = end;
    }
    seen
}

/// The next request head from `buf[start..]`, reading more as needed; `None` at a refusal
/// (noted in `seen`) or the input's end. A head in pieces is parsed again only once its
/// blank line came, so at the input's end a partial head is parsed once more, afresh: a
/// fault in it is then refused as it would have been had it come in one piece.
fn next_request(
    buf: &mut Vec<u8>,
    start: usize,
    arrival: &mut Arrival<'_>,
    seen: &mut Requests,
) -> Option<RequestHead> {
    let mut scan = HeadScan::default();
    let mut last = false;
    loop {
        if buf.len() > start {
            match RequestHead::parse(&mut buf[start..], &mut scan) {
                Ok(Some(head)) => {
                    seen.heads_at_eof += usize::from(last);
                    return Some(head);
                }
                Ok(None) if last => return None,
                Ok(None) => {}
                Err(e) => {
                    seen.refused = Some(e.status());
                    return None;
                }
            }
        }
        if !arrival.read(buf) {
            if last || buf.len() <= start {
                return None;
            }
            (last, scan) = (true, HeadScan::default());
        }
    }
}

/// A body from `buf[at..]` on, reading more as needed: its data (`None` if it broke), and
/// where it ended.
fn read_body(
    mut reader: BodyReader,
    buf: &mut Vec<u8>,
    mut at: usize,
    arrival: &mut Arrival<'_>,
) -> (Option<Vec<u8>>, usize) {
    let mut data = Vec::new();
    while !reader.is_done() {
        if at == buf.len() {
            if arrival.read(buf) {
                continue;
            }
            let whole = reader.at_eof().is_ok();
            return (whole.then_some(data), at);
        }
        let Ok(step) = reader.step(&buf[at..]) else {
            return (None, at);
        };
        if step.part == Part::Data {
            data.extend_from_slice(&buf[at..at + step.len]);
        }
        at += step.len;
    }
    (Some(data), at)
}

/// What a server's bytes came to, for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Responses {
    /// Interim statuses, in order.
    pub(crate) interim: Vec<u16>,
    /// The final status, if a final head came.
    pub(crate) status: Option<u16>,
    /// Its body's data (`None` if it broke off or was malformed, or there was no head).
    pub(crate) body: Option<Vec<u8>>,
    /// The final head as the client gets it.
    pub(crate) head_out: Vec<u8>,
    /// Bytes followed the framed end.
    pub(crate) more: bool,
}

/// The responses `input` holds for a request that `asked`.
pub(crate) fn responses(input: &[u8], cuts: &[usize], asked: Asked) -> Responses {
    let mut arrival = Arrival::new(input, cuts);
    let (mut buf, mut start, mut seen) = (Vec::new(), 0, Responses::default());
    for _ in 0..=input.len() {
        let Some(head) = next_response(&mut buf, start, &mut arrival, asked) else {
            return seen;
        };
        if head.framing() == Framing::Interim {
            seen.interim.push(head.status());
            start += head.len();
            continue;
        }
        seen.status = Some(head.status());
        let how = crate::http::h1::ToClient {
            version: Version::Http11,
            keep_alive: true,
        };
        let editor = head.to_client(&buf[start..], &how);
        seen.head_out = head.write(&buf[start..], editor).to_vec(&buf[start..]);
        let (body, end) = read_body(
            BodyReader::of_response(head.framing()),
            &mut buf,
            start + head.len(),
            &mut arrival,
        );
        seen.body = body;
        while arrival.read(&mut buf) {}
        seen.more = buf.len() > end && head.framing() != Framing::Tunnel;
        return seen;
    }
    seen
}

fn next_response(
    buf: &mut Vec<u8>,
    start: usize,
    arrival: &mut Arrival<'_>,
    asked: Asked,
) -> Option<ResponseHead> {
    let mut scan = HeadScan::default();
    loop {
        if buf.len() > start {
            match ResponseHead::parse(&mut buf[start..], &mut scan, asked) {
                Ok(Some(head)) => return Some(head),
                Ok(None) => {}
                Err(_) => return None,
            }
        }
        if !arrival.read(buf) {
            return None;
        }
    }
}
