//! The outgoing head as slices, for one vectored write (kawa's out queue): the unchanged
//! runs of the input buffer, the changed lines from a small scratch, separators from static
//! bytes. Consecutive runs of the input merge into one slice as they are pushed, so a head
//! with one line removed and a few added is about five slices; a cursor follows short
//! writes without copying.

use std::io::IoSlice;

use super::Span;

/// One slice of an outgoing head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Bytes of the input buffer.
    Input(Span),
    /// Bytes of the head's scratch.
    Scratch(Span),
    /// Constant bytes.
    Static(&'static [u8]),
}

impl Piece {
    fn len(self) -> usize {
        match self {
            Piece::Input(span) | Piece::Scratch(span) => span.len as usize,
            Piece::Static(bytes) => bytes.len(),
        }
    }
}

/// A head to write, and how much of it was written. It holds no bytes of the input, only
/// spans: give [`OutHead::io_slices`] the buffer the head was parsed from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutHead {
    pieces: Vec<Piece>,
    scratch: Vec<u8>,
    /// The first piece not written whole.
    next: usize,
    /// Bytes of it written.
    offset: usize,
}

impl OutHead {
    /// An empty head whose changed lines are in `scratch`.
    pub(crate) fn new(scratch: Vec<u8>) -> OutHead {
        OutHead {
            pieces: Vec::with_capacity(16),
            scratch,
            next: 0,
            offset: 0,
        }
    }

    /// `piece` after the others; one slice with the last when they touch.
    pub(crate) fn push(&mut self, piece: Piece) {
        if piece.len() == 0 {
            return;
        }
        match (self.pieces.last_mut(), piece) {
            (Some(Piece::Input(last)), Piece::Input(span))
            | (Some(Piece::Scratch(last)), Piece::Scratch(span))
                if last.end() == span.start as usize =>
            {
                last.len += span.len;
            }
            _ => self.pieces.push(piece),
        }
    }

    /// Bytes of the input after the head (the body's first bytes, read with it), so they go
    /// in the same write.
    pub fn append_input(&mut self, span: Span) {
        self.push(Piece::Input(span));
    }

    /// How many slices: the size of the `IoSlice` array that takes the head in one call.
    pub fn slices(&self) -> usize {
        self.pieces.len() - self.next
    }

    /// The bytes left to write.
    pub fn remaining(&self) -> usize {
        let all: usize = self.pieces[self.next..].iter().map(|p| p.len()).sum();
        all - self.offset
    }

    /// Whether every byte was written.
    pub fn is_written(&self) -> bool {
        self.next == self.pieces.len()
    }

    /// The slices left to write, into `out`, from the buffer `input` the head was parsed
    /// from: how many were filled (fewer than [`OutHead::slices`] if `out` is shorter).
    pub fn io_slices<'a>(&'a self, input: &'a [u8], out: &mut [IoSlice<'a>]) -> usize {
        let mut filled = 0;
        for (slot, (i, piece)) in out
            .iter_mut()
            .zip(self.pieces.iter().enumerate().skip(self.next))
        {
            let bytes = self.bytes(*piece, input);
            let skip = if i == self.next { self.offset } else { 0 };
            *slot = IoSlice::new(bytes.get(skip..).unwrap_or_default());
            filled += 1;
        }
        filled
    }

    /// `n` more bytes were written.
    pub fn advance(&mut self, mut n: usize) {
        while let Some(piece) = self.pieces.get(self.next) {
            let left = piece.len() - self.offset;
            if n < left {
                self.offset += n;
                return;
            }
            n -= left;
            self.next += 1;
            self.offset = 0;
        }
    }

    /// The bytes left to write in one buffer: for a stream that does not write vectored,
    /// and for tests.
    pub fn to_vec(&self, input: &[u8]) -> Vec<u8> {
        let mut slices = vec![IoSlice::new(&[]); self.slices()];
        let n = self.io_slices(input, &mut slices);
        slices[..n].iter().flat_map(|s| s.iter().copied()).collect()
    }

    fn bytes<'a>(&'a self, piece: Piece, input: &'a [u8]) -> &'a [u8] {
        match piece {
            Piece::Input(span) => span.of(input),
            Piece::Scratch(span) => span.of(&self.scratch),
            Piece::Static(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> (OutHead, &'static [u8]) {
        let input: &[u8] = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\n\r\nbody";
        let mut out = OutHead::new(b"X: y\r\n".to_vec());
        out.push(Piece::Input(Span::new(0, 16)));
        out.push(Piece::Scratch(Span::new(0, 6)));
        out.push(Piece::Input(Span::new(16, 6)));
        out.push(Piece::Static(b""));
        out.push(Piece::Input(Span::new(28, 2)));
        out.append_input(Span::new(30, 4));
        (out, input)
    }

    #[test]
    fn touching_runs_merge_and_empty_ones_vanish() {
        let (out, input) = head();
        assert_eq!(out.slices(), 4);
        assert_eq!(
            out.to_vec(input),
            b"GET / HTTP/1.1\r\nX: y\r\nA: 1\r\n\r\nbody"
        );
    }

    #[test]
    fn short_writes_resume_where_they_stopped() {
        let (whole, input) = head();
        let expected = whole.to_vec(input);
        for chunk in 1..expected.len() {
            let (mut out, _) = head();
            let mut written = Vec::new();
            while !out.is_written() {
                let mut slices = [IoSlice::new(&[]); 2];
                let n = out.io_slices(input, &mut slices);
                let bytes: Vec<u8> = slices[..n]
                    .iter()
                    .flat_map(|s| s.iter().copied())
                    .take(chunk)
                    .collect();
                assert_eq!(out.remaining(), expected.len() - written.len());
                out.advance(bytes.len());
                written.extend(bytes);
            }
            assert_eq!(written, expected, "{chunk}");
        }
    }
}
