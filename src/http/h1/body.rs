//! A message body read as it passes, whatever frames it: the one state machine the wiring
//! steps for request and response bodies alike. It never holds bytes, only counts: each step
//! names how many of the next input bytes are data, framing or trailer, and the end is where
//! the framing says, never where the input runs out, so the bytes after it (a pipelined
//! request, a server's stray bytes) are never taken for body.

use super::chunked::{ChunkedDecoder, ChunkedError, Part};
use super::{Body, Framing};

/// One step over a body: the first `len` bytes of the input are `part`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// What they are.
    pub part: Part,
    /// How many.
    pub len: usize,
}

/// Why a body did not arrive whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The chunked coding is malformed (400 from a client, 502 from a server).
    #[error(transparent)]
    Chunked(#[from] ChunkedError),
    /// The peer closed before the framed end.
    #[error("the body ended before its framed end ({missing})")]
    Truncated {
        /// What was still due, in words.
        missing: &'static str,
    },
}

/// Where a body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// So many bytes are left.
    Length(u64),
    /// Chunks.
    Chunked(ChunkedDecoder),
    /// To the connection's end.
    UntilClose,
    /// The framed end came.
    Done,
}

/// A body being read: 16 bytes, kept in the connection's struct while the body passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyReader {
    reading: Reading,
}

impl BodyReader {
    /// The reader of a body framed so.
    pub fn new(body: Body) -> BodyReader {
        let reading = match body {
            Body::Empty | Body::Length(0) => Reading::Done,
            Body::Length(n) => Reading::Length(n),
            Body::Chunked => Reading::Chunked(ChunkedDecoder::new()),
            Body::UntilClose => Reading::UntilClose,
        };
        BodyReader { reading }
    }

    /// The reader of a response's body: none after an interim head or before a tunnel.
    pub fn of_response(framing: Framing) -> BodyReader {
        match framing {
            Framing::Body(body) => BodyReader::new(body),
            Framing::Interim | Framing::Tunnel => BodyReader::new(Body::Empty),
        }
    }

    /// Whether the body reached its framed end: the bytes after belong to the next message.
    pub fn is_done(&self) -> bool {
        match self.reading {
            Reading::Done => true,
            Reading::Chunked(decoder) => decoder.is_done(),
            _ => false,
        }
    }

    /// How many of the first bytes of `input` are one part of the body, and which. At least
    /// one when `input` is not empty and the body not done; none once done.
    pub fn step(&mut self, input: &[u8]) -> Result<Step, BodyError> {
        let (part, len) = match &mut self.reading {
            Reading::Done => (Part::Data, 0),
            Reading::UntilClose => (Part::Data, input.len()),
            Reading::Length(left) => {
                let n = usize::try_from(*left).map_or(input.len(), |l| l.min(input.len()));
                *left -= n as u64;
                if *left == 0 {
                    self.reading = Reading::Done;
                }
                (Part::Data, n)
            }
            Reading::Chunked(decoder) => decoder.step(input)?,
        };
        Ok(Step { part, len })
    }

    /// Data bytes due before any framing: what a splice may move without the bytes passing
    /// through user space (a length's rest, a chunk's rest; `u64::MAX` until a close).
    pub fn data_ahead(&self) -> u64 {
        match self.reading {
            Reading::Length(left) => left,
            Reading::Chunked(decoder) => decoder.data_ahead(),
            Reading::UntilClose => u64::MAX,
            Reading::Done => 0,
        }
    }

    /// `n` data bytes (at most [`BodyReader::data_ahead`]) went by another way (a splice).
    pub fn skip_data(&mut self, n: u64) {
        match &mut self.reading {
            Reading::Length(left) => {
                *left = left.saturating_sub(n);
                if *left == 0 {
                    self.reading = Reading::Done;
                }
            }
            Reading::Chunked(decoder) => decoder.skip_data(n),
            Reading::UntilClose | Reading::Done => {}
        }
    }

    /// The peer closed its side: the end of a body read until close, a truncated body
    /// otherwise.
    pub fn at_eof(&mut self) -> Result<(), BodyError> {
        let missing = match self.reading {
            Reading::Done => return Ok(()),
            Reading::UntilClose => {
                self.reading = Reading::Done;
                return Ok(());
            }
            Reading::Chunked(decoder) if decoder.is_done() => return Ok(()),
            Reading::Length(_) => "bytes of its Content-Length",
            Reading::Chunked(_) => "chunks to the last one",
        };
        Err(BodyError::Truncated { missing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps `reader` over `input` whole; the data, and where the body ended if it did.
    fn run(mut reader: BodyReader, input: &[u8]) -> Result<(Vec<u8>, Option<usize>), BodyError> {
        let (mut data, mut at) = (Vec::new(), 0);
        while at < input.len() && !reader.is_done() {
            let step = reader.step(&input[at..])?;
            if step.part == Part::Data {
                data.extend_from_slice(&input[at..at + step.len]);
            }
            at += step.len;
        }
        Ok((data, reader.is_done().then_some(at)))
    }

    /// A framing, an input, the data read, where the body ended.
    type Case = (Body, &'static [u8], &'static [u8], Option<usize>);

    #[test]
    fn each_framing_ends_where_it_says() {
        let next = b"GET / HTTP/1.1\r\n\r\n";
        let cases: &[Case] = &[
            (Body::Empty, next, b"", Some(0)),
            (Body::Length(3), b"abcGET", b"abc", Some(3)),
            (Body::Length(5), b"abc", b"abc", None),
            (Body::Chunked, b"3\r\nabc\r\n0\r\n\r\nGET", b"abc", Some(13)),
            (Body::UntilClose, b"abc", b"abc", None),
        ];
        for (body, input, data, end) in cases {
            let got = run(BodyReader::new(*body), input);
            assert_eq!(got, Ok((data.to_vec(), *end)), "{body:?}");
        }
    }

    #[test]
    fn the_end_of_the_connection_ends_only_a_close_delimited_body() {
        let cases: &[(Body, bool)] = &[
            (Body::Empty, true),
            (Body::Length(1), false),
            (Body::Chunked, false),
            (Body::UntilClose, true),
        ];
        for (body, whole) in cases {
            let mut reader = BodyReader::new(*body);
            assert_eq!(reader.at_eof().is_ok(), *whole, "{body:?}");
            assert_eq!(reader.is_done(), *whole, "{body:?}");
        }
    }

    #[test]
    fn spliced_data_counts_against_the_length() {
        let mut reader = BodyReader::new(Body::Length(1 << 20));
        assert_eq!(reader.data_ahead(), 1 << 20);
        reader.skip_data((1 << 20) - 1);
        assert_eq!(
            reader.step(b"xy"),
            Ok(Step {
                part: Part::Data,
                len: 1
            })
        );
        assert!(reader.is_done());
        assert_eq!(BodyReader::of_response(Framing::Tunnel).data_ahead(), 0);
    }
}
