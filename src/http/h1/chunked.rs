//! The chunked coding (RFC 9112 §7.1) checked byte by byte as it passes, never buffered: a
//! step says how many of the next input bytes are chunk framing, data or trailer, so the
//! wiring forwards framing and data as they came (or data only, to an HTTP/1.0 client) and
//! drops the trailers. Every CRLF is checked (a bare LF is the classic smuggling step), a
//! size line is bounded with its extensions, sizes are checked for overflow, and trailers are
//! bounded. Trailers are dropped, not forwarded: a recipient that merged them into the head
//! could be steered by them, and nothing the broker serves needs them (pingora drops them
//! too); forwarding the last chunk as it came but for them leaves `0` CRLF CRLF.

use super::{MAX_CHUNK_LINE, MAX_TRAILERS};

/// Where the decoder is in the coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At a size line's first byte: a hex digit.
    SizeStart,
    /// In the size's digits.
    Size,
    /// After the digits: blanks, then `;` or CR.
    SizeBlank,
    /// In the extensions, to CR.
    Extension,
    /// The size line's CR came: LF.
    SizeLf,
    /// In a chunk's data.
    Data,
    /// After the data: CR.
    DataCr,
    /// After the data's CR: LF.
    DataLf,
    /// At a trailer line's first byte, or the final CRLF's CR.
    TrailerStart,
    /// In a trailer line, to CR.
    Trailer,
    /// A trailer line's CR came: LF.
    TrailerLf,
    /// The final CR came: LF.
    EndLf,
    /// The body ended; what follows is the next message.
    Done,
}

/// What the next bytes of a chunked body are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Size lines, extensions, the CRLF after data, the final CRLF: forwarded as they came
    /// to a client that speaks chunked, not to one that does not.
    Framing,
    /// The body's content.
    Data,
    /// Trailer lines: checked, never forwarded.
    Trailer,
}

/// Why a chunked body is refused (400 from a client, 502 from a server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkedError {
    /// A byte a size line may not hold, or a line end other than CRLF.
    #[error("a chunk size line is malformed")]
    SizeLine,
    /// A size line longer than [`MAX_CHUNK_LINE`].
    #[error("a chunk size line is longer than {} KiB", MAX_CHUNK_LINE / 1024)]
    SizeLineTooLong,
    /// A size that does not fit 64 bits.
    #[error("a chunk size is too large")]
    Overflow,
    /// The data is not followed by CRLF: the size lied.
    #[error("a chunk's data is not followed by CRLF")]
    DataEnd,
    /// A trailer line with a byte it may not hold, or a line end other than CRLF.
    #[error("a trailer line is malformed")]
    Trailer,
    /// Trailers longer than [`MAX_TRAILERS`].
    #[error("the trailers are longer than {} KiB", MAX_TRAILERS / 1024)]
    TrailersTooLong,
}

/// The chunked decoder: 16 bytes of state, whatever the body's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedDecoder {
    state: State,
    /// The size being read, then the data left of the chunk.
    remaining: u64,
    /// Bytes of the current size line, or of the trailers.
    counted: u32,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the body's first byte.
    pub fn new() -> ChunkedDecoder {
        ChunkedDecoder {
            state: State::SizeStart,
            remaining: 0,
            counted: 0,
        }
    }

    /// Whether the last chunk and the trailers ended: bytes after are the next message's.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Data bytes that follow before any framing: a splice may move them unseen.
    pub fn data_ahead(&self) -> u64 {
        if self.state == State::Data {
            self.remaining
        } else {
            0
        }
    }

    /// `n` data bytes (at most [`ChunkedDecoder::data_ahead`]) went by without passing
    /// through [`ChunkedDecoder::step`].
    pub fn skip_data(&mut self, n: u64) {
        if self.state == State::Data {
            self.remaining = self.remaining.saturating_sub(n);
            if self.remaining == 0 {
                self.state = State::DataCr;
            }
        }
    }

    /// How many of the first bytes of `input` are of one kind, and which: at least one when
    /// `input` is not empty and the body is not done (so a caller's loop always advances),
    /// none after the end. The bytes are consumed: call again with the rest.
    pub fn step(&mut self, input: &[u8]) -> Result<(Part, usize), ChunkedError> {
        match self.state {
            State::Done => Ok((Part::Framing, 0)),
            State::Data => Ok((Part::Data, self.data(input))),
            State::Trailer | State::TrailerLf => self.run(input, Part::Trailer),
            State::TrailerStart if input.first().is_some_and(|&b| b != b'\r') => {
                self.run(input, Part::Trailer)
            }
            _ => self.run(input, Part::Framing),
        }
    }

    /// Data bytes of `input`, up to the chunk's end.
    fn data(&mut self, input: &[u8]) -> usize {
        let n = usize::try_from(self.remaining).map_or(input.len(), |r| r.min(input.len()));
        self.skip_data(n as u64);
        n
    }

    /// Bytes of `kind` from the start of `input`, one at a time, until the kind changes.
    fn run(&mut self, input: &[u8], kind: Part) -> Result<(Part, usize), ChunkedError> {
        let mut n = 0;
        for &b in input {
            self.byte(b)?;
            n += 1;
            if self.kind() != Some(kind) {
                break;
            }
        }
        Ok((kind, n))
    }

    /// The kind of the next byte, or `None` when done.
    fn kind(&self) -> Option<Part> {
        match self.state {
            State::Done => None,
            State::Data => Some(Part::Data),
            State::Trailer | State::TrailerLf => Some(Part::Trailer),
            // A trailer line or the final CRLF: only its first byte tells, so a run of
            // trailers stops here and the next step looks.
            State::TrailerStart => None,
            _ => Some(Part::Framing),
        }
    }

    /// One framing or trailer byte.
    fn byte(&mut self, b: u8) -> Result<(), ChunkedError> {
        match self.state {
            State::SizeStart
            | State::Size
            | State::SizeBlank
            | State::Extension
            | State::SizeLf => self.size_line(b),
            State::DataCr => self.expect(b, b'\r', State::DataLf, ChunkedError::DataEnd),
            State::DataLf => self.expect(b, b'\n', State::SizeStart, ChunkedError::DataEnd),
            State::EndLf => self.expect(b, b'\n', State::Done, ChunkedError::Trailer),
            _ => self.trailer(b),
        }
    }

    fn expect(
        &mut self,
        b: u8,
        wanted: u8,
        next: State,
        error: ChunkedError,
    ) -> Result<(), ChunkedError> {
        if b != wanted {
            return Err(error);
        }
        self.state = next;
        Ok(())
    }

    /// A byte of a size line: `1*HEXDIG [BWS] *(";" ext) CRLF`, bounded.
    fn size_line(&mut self, b: u8) -> Result<(), ChunkedError> {
        self.counted += 1;
        if self.counted as usize > MAX_CHUNK_LINE {
            return Err(ChunkedError::SizeLineTooLong);
        }
        self.state = match (self.state, b) {
            (State::SizeStart | State::Size, _) if b.is_ascii_hexdigit() => {
                self.add_digit(b)?;
                State::Size
            }
            (State::Size | State::SizeBlank, b' ' | b'\t') => State::SizeBlank,
            (State::Size | State::SizeBlank | State::Extension, b';') => State::Extension,
            (State::Size | State::SizeBlank | State::Extension, b'\r') => State::SizeLf,
            (State::Extension, _) if b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80 => {
                State::Extension
            }
            (State::SizeLf, b'\n') => self.size_line_end(),
            _ => return Err(ChunkedError::SizeLine),
        };
        Ok(())
    }

    fn add_digit(&mut self, b: u8) -> Result<(), ChunkedError> {
        let digit = char::from(b).to_digit(16).unwrap_or(0);
        self.remaining = self
            .remaining
            .checked_mul(16)
            .and_then(|r| r.checked_add(u64::from(digit)))
            .ok_or(ChunkedError::Overflow)?;
        Ok(())
    }

    /// The size line ended: data, or the last chunk's trailers.
    fn size_line_end(&mut self) -> State {
        self.counted = 0;
        if self.remaining == 0 {
            State::TrailerStart
        } else {
            State::Data
        }
    }

    /// A byte of the trailers: lines of field bytes ending in CRLF (a line may not begin
    /// with a blank: no folding), then CRLF; bounded in all.
    fn trailer(&mut self, b: u8) -> Result<(), ChunkedError> {
        self.counted += 1;
        if self.counted as usize > MAX_TRAILERS {
            return Err(ChunkedError::TrailersTooLong);
        }
        let field_byte = b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80;
        self.state = match (self.state, b) {
            (State::TrailerStart, b'\r') => State::EndLf,
            (State::TrailerStart, b' ' | b'\t') => return Err(ChunkedError::Trailer),
            (State::TrailerStart | State::Trailer, _) if field_byte => State::Trailer,
            (State::Trailer, b'\r') => State::TrailerLf,
            (State::TrailerLf, b'\n') => State::TrailerStart,
            _ => return Err(ChunkedError::Trailer),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` whole: the data, the framing kept, how many bytes the body took.
    pub(crate) fn decode(input: &[u8]) -> Result<(Vec<u8>, Vec<u8>, usize), ChunkedError> {
        let mut decoder = ChunkedDecoder::new();
        let (mut data, mut kept, mut at) = (Vec::new(), Vec::new(), 0);
        while at < input.len() && !decoder.is_done() {
            let (kind, n) = decoder.step(&input[at..])?;
            let bytes = &input[at..at + n];
            match kind {
                Part::Data => {
                    data.extend_from_slice(bytes);
                    kept.extend_from_slice(bytes);
                }
                Part::Framing => kept.extend_from_slice(bytes),
                Part::Trailer => {}
            }
            at += n;
        }
        if !decoder.is_done() {
            return Err(ChunkedError::SizeLine);
        }
        Ok((data, kept, at))
    }

    /// A body, its data, the framing and data forwarded, the bytes it took.
    type Case = (&'static [u8], &'static [u8], &'static [u8], usize);

    #[test]
    fn bodies_decode_and_trailers_are_dropped() {
        let cases: &[Case] = &[
            (
                b"5\r\nhello\r\n0\r\n\r\nGET",
                b"hello",
                b"5\r\nhello\r\n0\r\n\r\n",
                15,
            ),
            (
                b"3;a=b\r\nabc\r\n0;x\r\n\r\n",
                b"abc",
                b"3;a=b\r\nabc\r\n0;x\r\n\r\n",
                19,
            ),
            (
                b"A \r\n0123456789\r\n0\r\n\r\n",
                b"0123456789",
                b"A \r\n0123456789\r\n0\r\n\r\n",
                21,
            ),
            (b"0\r\nX-Sum: 1\r\nY: 2\r\n\r\nnext", b"", b"0\r\n\r\n", 21),
            (
                b"000001\r\nz\r\n0\r\n\r\n",
                b"z",
                b"000001\r\nz\r\n0\r\n\r\n",
                16,
            ),
        ];
        for (input, data, kept, used) in cases {
            let got = decode(input);
            assert_eq!(
                got,
                Ok((data.to_vec(), kept.to_vec(), *used)),
                "{}",
                input.escape_ascii()
            );
        }
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let long_line = [b"1;".as_slice(), &[b'a'; MAX_CHUNK_LINE], b"\r\n"].concat();
        let long_trailers = [b"0\r\nX: ".as_slice(), &[b'a'; MAX_TRAILERS], b"\r\n\r\n"].concat();
        let cases: Vec<(&[u8], ChunkedError)> = vec![
            (b"5\nhello\r\n0\r\n\r\n", ChunkedError::SizeLine),
            (b"5\r\nhello\n0\r\n\r\n", ChunkedError::DataEnd),
            (b"5\r\nhelloX\r\n", ChunkedError::DataEnd),
            (b"\r\n", ChunkedError::SizeLine),
            (b" 5\r\n", ChunkedError::SizeLine),
            (b"-5\r\n", ChunkedError::SizeLine),
            (b"0x5\r\n", ChunkedError::SizeLine),
            (b"5 5\r\n", ChunkedError::SizeLine),
            (b"5;a\nb\r\n", ChunkedError::SizeLine),
            (b"5;a\0\r\n", ChunkedError::SizeLine),
            (b"5\r\r\n", ChunkedError::SizeLine),
            (b"10000000000000000\r\n", ChunkedError::Overflow),
            (b"0\r\nX: 1\n\r\n", ChunkedError::Trailer),
            (b"0\r\n folded\r\n\r\n", ChunkedError::Trailer),
            (b"0\r\nX: \x01\r\n\r\n", ChunkedError::Trailer),
            (b"0\r\n\r\r", ChunkedError::Trailer),
            (&long_line, ChunkedError::SizeLineTooLong),
            (&long_trailers, ChunkedError::TrailersTooLong),
        ];
        for (input, error) in cases {
            assert_eq!(decode(input).err(), Some(error), "{}", input.escape_ascii());
        }
    }

    #[test]
    fn the_largest_size_fits_and_data_can_be_skipped() {
        let mut decoder = ChunkedDecoder::new();
        assert_eq!(
            decoder.step(b"ffffffffffffffff\r\n"),
            Ok((Part::Framing, 18))
        );
        assert_eq!(decoder.data_ahead(), u64::MAX);
        decoder.skip_data(u64::MAX - 2);
        assert_eq!(decoder.step(b"abc"), Ok((Part::Data, 2)));
        assert_eq!(decoder.data_ahead(), 0);
        assert_eq!(decoder.step(b"c"), Err(ChunkedError::DataEnd));
    }
}
