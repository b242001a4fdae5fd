//! The outgoing head: the changes made to a head on its way, kept small and typed (remove a
//! line, give a line a new value, add a line), and the head they make as slices for one
//! vectored write (kawa's out queue). Lines are named by the [`FieldId`] the head's fields
//! gave; values are bytes checked for what would split a line (CR, LF, NUL), so no edit can
//! inject a header. Changed bytes go to a scratch that the [`OutHead`] takes over; the rest
//! stays in the input buffer. The [`OutHead`] is the unchanged runs of the input buffer, the
//! changed lines from the scratch, separators from static bytes; consecutive runs of the input
//! merge into one slice as they are pushed, so a head with one line removed and a few added
//! is about five slices; a cursor follows short writes without copying.

use std::io::IoSlice;

use super::field::Field;
use super::{FieldId, Fields, Span};

/// Why an edit was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// A header name must be a token (RFC 9110 §5.1).
    #[error("a header name must be letters, digits and !#$%&'*+-.^_`|~")]
    Name,
    /// A value may not hold CR, LF, NUL or another control byte but tab.
    #[error("a header value may not hold CR, LF, NUL or another control byte")]
    Value,
}

/// A change besides removals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edit {
    /// Line `field` gets the value in scratch (written as `: value` CRLF).
    Set { field: u8, value: Span },
    /// A line added after the start line.
    Add(Piece),
}

/// The changes to one head, made by the standard rewriting each way and then by the wiring
/// and the balancer (its cookie out), written by the head's `write`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Editor {
    removed: FieldSet,
    set: FieldSet,
    edits: Vec<Edit>,
    scratch: Vec<u8>,
}

impl Editor {
    /// No change.
    pub fn new() -> Editor {
        Editor::default()
    }

    /// Line `field` is not forwarded.
    pub fn remove(&mut self, field: FieldId) {
        self.removed.insert(field);
    }

    /// Whether line `field` is not forwarded.
    pub fn is_removed(&self, field: FieldId) -> bool {
        self.removed.contains(field)
    }

    /// Line `field` goes with the value made of `parts` end to end (a cookie without the
    /// broker's crumb; `X-Forwarded-For` with the client appended), its name as received.
    pub fn set(&mut self, field: FieldId, parts: &[&[u8]]) -> Result<(), EditError> {
        check_value(parts)?;
        let value = self.write_line(&[], parts.iter().copied());
        self.removed.take_out(field);
        self.set.insert(field);
        self.push(Edit::Set {
            field: field.0,
            value,
        });
        Ok(())
    }

    /// A line `name: parts…` added after the start line (`Set-Cookie`, `X-Real-IP`).
    pub fn add(&mut self, name: &[u8], parts: &[&[u8]]) -> Result<(), EditError> {
        if name.is_empty() || !name.iter().all(|&b| is_token(b)) {
            return Err(EditError::Name);
        }
        check_value(parts)?;
        self.add_unchecked(name, parts.iter().copied());
        Ok(())
    }

    /// [`Editor::add`] for bytes already checked (the client's own, parsed).
    pub(crate) fn add_unchecked<'a>(
        &mut self,
        name: &[u8],
        parts: impl IntoIterator<Item = &'a [u8]>,
    ) {
        let line = self.write_line(name, parts);
        self.push(Edit::Add(Piece::Scratch(line)));
    }

    /// A constant line added (`Transfer-Encoding: chunked`, `Connection: close`), with its
    /// CRLF.
    pub(crate) fn add_line(&mut self, line: &'static [u8]) {
        self.push(Edit::Add(Piece::Static(line)));
    }

    fn push(&mut self, edit: Edit) {
        if self.edits.capacity() == 0 {
            // The standard rewriting makes up to seven, the balancer one or two: grown once.
            self.edits.reserve(12);
        }
        self.edits.push(edit);
    }

    /// `name: parts` CRLF into the scratch (no name: `: parts` CRLF, a new value), where.
    fn write_line<'a>(&mut self, name: &[u8], parts: impl IntoIterator<Item = &'a [u8]>) -> Span {
        if self.scratch.capacity() == 0 {
            // The forwarded lines and a cookie fit: grown once.
            self.scratch.reserve(256);
        }
        let start = self.scratch.len();
        self.scratch.extend_from_slice(name);
        self.scratch.extend_from_slice(b": ");
        for part in parts {
            self.scratch.extend_from_slice(part);
        }
        self.scratch.extend_from_slice(b"\r\n");
        Span::between(start, self.scratch.len())
    }

    /// The head: `start` (its start line, empty pieces left out), the added lines, every
    /// line of `fields` not removed (as it came when it can be, else written anew with `: `
    /// and CRLF), then `end` (the blank line).
    pub(crate) fn write(self, start: &[Piece], fields: &Fields, end: Piece) -> OutHead {
        let mut out = OutHead::new(self.scratch);
        for piece in start {
            out.push(*piece);
        }
        for edit in &self.edits {
            if let Edit::Add(piece) = edit {
                out.push(*piece);
            }
        }
        // A word of each set per 128 lines, as a head's lines come; the second only for the
        // rare head of more (a server's, up to MAX_RESPONSE_FIELDS).
        for (chunk, lines) in fields.raw().chunks(FieldSet::WORD_BITS).enumerate() {
            let (removed, set) = (self.removed.word(chunk), self.set.word(chunk));
            for (at, field) in lines.iter().enumerate() {
                let mask = 1u128 << at;
                if removed & mask != 0 {
                    continue;
                }
                if set & mask != 0 {
                    let i = chunk * FieldSet::WORD_BITS + at;
                    out.push(Piece::Input(field.name));
                    out.push(Piece::Scratch(new_value(&self.edits, i)));
                } else {
                    write_field(&mut out, field);
                }
            }
        }
        out.push(end);
        out
    }
}

/// A set of a head's lines, a bit each: every [`FieldId`] fits (a byte's 256 values, so
/// [`MAX_RESPONSE_FIELDS`](super::MAX_RESPONSE_FIELDS) lines), in two words, the second
/// touched only by a head of more than 128 lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FieldSet([u128; 2]);

impl FieldSet {
    /// The lines each word holds.
    const WORD_BITS: usize = 128;

    fn insert(&mut self, field: FieldId) {
        let (word, bit) = Self::place(field);
        self.0[word] |= bit;
    }

    fn take_out(&mut self, field: FieldId) {
        let (word, bit) = Self::place(field);
        self.0[word] &= !bit;
    }

    fn contains(&self, field: FieldId) -> bool {
        let (word, bit) = Self::place(field);
        self.0[word] & bit != 0
    }

    /// The bits of lines `128 * n` to `128 * n + 127` (none past the set).
    fn word(&self, n: usize) -> u128 {
        self.0.get(n).copied().unwrap_or(0)
    }

    /// The word `field` is in, and its bit there.
    fn place(field: FieldId) -> (usize, u128) {
        let i = field.index();
        (i / Self::WORD_BITS, 1u128 << (i % Self::WORD_BITS))
    }
}

/// A line as it came when it is clean, else its name and value with `: ` and CRLF.
fn write_field(out: &mut OutHead, field: &Field) {
    if field.clean {
        out.push(Piece::Input(field.line()));
    } else {
        out.push(Piece::Input(field.name));
        out.push(Piece::Static(b": "));
        out.push(Piece::Input(field.value));
        out.push(Piece::Static(b"\r\n"));
    }
}

/// The last value set for field `i`.
fn new_value(edits: &[Edit], i: usize) -> Span {
    edits
        .iter()
        .rev()
        .find_map(|e| match *e {
            Edit::Set { field, value } if usize::from(field) == i => Some(value),
            _ => None,
        })
        .unwrap_or_default()
}

/// A token byte (RFC 9110 §5.6.2).
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `parts` may stand in a field value: tab, visible bytes, spaces, obs-text.
fn check_value(parts: &[&[u8]]) -> Result<(), EditError> {
    let ok = parts
        .iter()
        .all(|p| p.iter().all(|&b| VALUE_BYTES[usize::from(b)]));
    if ok { Ok(()) } else { Err(EditError::Value) }
}

/// The bytes a field value may hold, as a table (one load a byte).
static VALUE_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = b == 0x09 || (b >= 0x20 && b != 0x7f);
        b += 1;
    }
    table
};

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

    #[test]
    fn values_and_names_that_would_split_a_line_are_refused() {
        let mut editor = Editor::new();
        assert_eq!(editor.add(b"Set-Cookie", &[b"a=1"]), Ok(()));
        assert_eq!(
            editor.add(b"X", &[b"a\r\nInjected: 1"]),
            Err(EditError::Value)
        );
        assert_eq!(editor.add(b"X", &[b"a\0"]), Err(EditError::Value));
        assert_eq!(editor.add(b"X", &[b"caf\xc3\xa9\tok"]), Ok(()));
        assert_eq!(editor.add(b"X Y", &[b"1"]), Err(EditError::Name));
        assert_eq!(editor.add(b"", &[b"1"]), Err(EditError::Name));
        assert_eq!(editor.add(b"X:", &[b"1"]), Err(EditError::Name));
        assert_eq!(editor.set(FieldId(0), &[b"\n"]), Err(EditError::Value));
    }

    #[test]
    fn set_undoes_remove_and_the_last_set_wins() {
        let mut editor = Editor::new();
        editor.remove(FieldId(3));
        assert!(editor.is_removed(FieldId(3)));
        editor.set(FieldId(3), &[b"a"]).unwrap();
        editor.set(FieldId(3), &[b"b", b"c"]).unwrap();
        assert!(!editor.is_removed(FieldId(3)));
        assert_eq!(new_value(&editor.edits, 3).of(&editor.scratch), b": bc\r\n");
    }

    #[test]
    fn every_line_of_a_byte_s_ids_can_be_removed_and_set() {
        let mut editor = Editor::new();
        for i in [0u8, 127, 128, 200, 254, 255] {
            editor.remove(FieldId(i));
            assert!(editor.is_removed(FieldId(i)), "{i}");
        }
        assert!(!editor.is_removed(FieldId(129)));
        editor.set(FieldId(200), &[b"x"]).unwrap();
        assert!(!editor.is_removed(FieldId(200)));
        assert!(editor.is_removed(FieldId(128)) && editor.is_removed(FieldId(254)));
        assert_eq!(
            new_value(&editor.edits, 200).of(&editor.scratch),
            b": x\r\n"
        );
    }

    /// The outgoing head as slices.
    mod slices {
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
}
