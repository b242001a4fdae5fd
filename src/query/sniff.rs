//! Telling a query from a client: a connection whose first bytes are `GET` or `HEAD` for
//! `/TOTVS_BROKER_QUERY` (in any case; the path exactly that, or going on with `/`, `?` or a
//! blank) is answered by the broker; anything else is forwarded, its first bytes included.

use std::cell::RefCell;
use std::io;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

/// What the first bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A request for the query interface.
    Query,
    /// Anything else: forward it (with the bytes read so far).
    Forward,
    /// The client closed before sending anything: nothing to forward, no server to bother.
    Closed,
    /// The start of a query request line that was never finished: drop the connection.
    Abandoned,
}

const PATH: &[u8] = b"/TOTVS_BROKER_QUERY";

/// Classifies the bytes a client has sent so far: `None` while they could still be either.
pub fn classify(bytes: &[u8]) -> Option<Verdict> {
    let mut best: Option<Verdict> = Some(Verdict::Forward);
    for method in [&b"GET "[..], &b"HEAD "[..]] {
        match classify_with(bytes, method) {
            Some(Verdict::Query) => return Some(Verdict::Query),
            None => best = None,
            Some(_) => {}
        }
    }
    best
}

/// The same for one method. The method is compared exactly (HTTP methods are case-sensitive,
/// and hyper would refuse `get`), the path without regard to case.
fn classify_with(bytes: &[u8], method: &[u8]) -> Option<Verdict> {
    let expected = method.iter().chain(PATH);
    let mut matched = 0;
    for (i, (have, want)) in bytes.iter().zip(expected).enumerate() {
        let same = if i < method.len() {
            have == want
        } else {
            have.eq_ignore_ascii_case(want)
        };
        if !same {
            return Some(Verdict::Forward);
        }
        matched += 1;
    }
    let whole = method.len() + PATH.len();
    if matched < whole {
        return None; // a prefix of the query request line so far
    }
    match bytes.get(whole) {
        None => None,
        Some(b'/' | b'?' | b' ') => Some(Verdict::Query),
        Some(_) => Some(Verdict::Forward), // `/TOTVS_BROKER_QUERYX`: another path
    }
}

/// How much of a client's first bytes is read while classifying; the rest waits in the
/// socket. Large enough to hold any request line's start.
const SNIFF_READ: usize = 4096;

/// Reads a client's first bytes into `first` until they classify. A client that sends nothing
/// within `silence` is taken for a server-first protocol client and forwarded. One whose bytes
/// so far could be a query gets up to `partial` to finish its request line, holding a query
/// place from `take_place` meanwhile, so half-sent lines are bounded by
/// `QUERY_MAX_CONNECTIONS` (when no place is free, it is taken for a query at once and will be
/// told to retry). Returns the place when one was taken.
pub async fn sniff<P>(
    stream: &TcpStream,
    first: &mut Vec<u8>,
    silence: Duration,
    partial: Duration,
    mut take_place: impl FnMut() -> Option<P>,
) -> io::Result<(Verdict, Option<P>)> {
    let started = Instant::now();
    let mut place = None;
    // A client-first client's bytes are usually there already: the first read goes straight
    // to the socket, without waiting for the reactor to report a new socket readable and
    // without arming a timer (which costs the runtime a wake-up of its own).
    let mut read = read_now(stream, first);
    loop {
        match read {
            Ok(0) if first.is_empty() => return Ok((Verdict::Closed, place)),
            // Closed after a few bytes that could have been a query: they are the client's.
            Ok(0) => return Ok((Verdict::Forward, place)),
            Ok(_) => match classify(first) {
                Some(verdict) => return Ok((verdict, place)),
                None if place.is_none() => match take_place() {
                    Some(taken) => place = Some(taken),
                    None => return Ok((Verdict::Query, None)),
                },
                None => {}
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let limit = if first.is_empty() { silence } else { partial };
        match tokio::time::timeout_at(started + limit, stream.readable()).await {
            Err(_) if first.is_empty() => return Ok((Verdict::Forward, None)),
            Err(_) => return Ok((Verdict::Abandoned, None)),
            Ok(ready) => ready?,
        }
        first.reserve(SNIFF_READ);
        read = stream.try_read_buf(first);
    }
}

/// One non-blocking read straight from the socket, whatever the reactor knows of it yet.
/// Through a per-thread buffer, so `first` is sized to what came (usually a few bytes) rather
/// than to the most that could.
fn read_now(stream: &TcpStream, first: &mut Vec<u8>) -> io::Result<usize> {
    use std::io::Read;
    thread_local! {
        static BUFFER: RefCell<[u8; SNIFF_READ]> = const { RefCell::new([0; SNIFF_READ]) };
    }
    BUFFER.with(|buffer| {
        let mut buf = buffer.borrow_mut();
        let n = (&*socket2::SockRef::from(stream)).read(&mut buf[..])?;
        first.extend_from_slice(&buf[..n]);
        Ok(n)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let cases: &[(&[u8], Option<Verdict>)] = &[
            (b"", None),
            (b"G", None),
            (b"GET /totvs_broker_q", None),
            (b"get /TOTVS_BROKER_QUERY/PING", Some(Verdict::Forward)),
            (b"GET /TOTVS_BROKER_QUERY", None),
            (b"GET /TOTVS_BROKER_QUERY ", Some(Verdict::Query)),
            (
                b"GET /TOTVS_BROKER_QUERY/STATUS HTTP/1.1\r\n",
                Some(Verdict::Query),
            ),
            (
                b"GET /totvs_broker_query?x=1 HTTP/1.1",
                Some(Verdict::Query),
            ),
            (b"HEAD /TOTVS_BROKER_QUERY/PING", Some(Verdict::Query)),
            (b"GET /TOTVS_BROKER_QUERYX HTTP/1.1", Some(Verdict::Forward)),
            (b"GET /rest/api HTTP/1.1", Some(Verdict::Forward)),
            (b"POST /TOTVS_BROKER_QUERY HTTP/1.1", Some(Verdict::Forward)),
            (b"GE", None),
            (b"GEX", Some(Verdict::Forward)),
            (b"HEA", None),
            (b"\x00\x01SmartClient", Some(Verdict::Forward)),
            (b"SSH-2.0-OpenSSH", Some(Verdict::Forward)),
        ];
        for (bytes, verdict) in cases {
            assert_eq!(
                classify(bytes),
                *verdict,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}
