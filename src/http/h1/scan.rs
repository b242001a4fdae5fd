//! Where a head ends, found across reads without parsing it again: the first read is parsed
//! at once (most heads arrive whole in it); after a partial head, each read only scans its new
//! bytes for the blank line, and httparse runs once more when it is there. The limits of a
//! head still arriving are checked here, so an endless line is refused before it is whole.

use super::{HeadError, MAX_HEAD};

/// How far the search for a head's end got; one per message being read (a fresh one for
/// each head, [`HeadScan::default`]). Twelve bytes: it stays in an idle connection's struct.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeadScan {
    /// The next byte to look at.
    at: u32,
    /// Where the line being scanned begins.
    line_start: u32,
    /// The start line has ended (empty lines before it are skipped, as httparse does).
    first_line_done: bool,
    /// A parse was tried: from now on, parse only once the scan found the end.
    tried: bool,
}

impl HeadScan {
    /// The head `parse` finds at the start of `buf` once the scan says it may be whole;
    /// until then `None`, the limits of a partial head checked (a start line longer than
    /// `line_limit` is `too_long`).
    pub(crate) fn parse_when_ready<T>(
        &mut self,
        buf: &mut [u8],
        line_limit: usize,
        too_long: HeadError,
        parse: impl FnOnce(&mut [u8]) -> Result<Option<T>, HeadError>,
    ) -> Result<Option<T>, HeadError> {
        if self.ready(buf) {
            if let Some(head) = parse(buf)? {
                return Ok(Some(head));
            }
            self.advance(buf);
        }
        self.check(buf.len(), line_limit, too_long)?;
        Ok(None)
    }

    /// Whether `buf` may hold a whole head: yes at the first try, then only when the bytes
    /// not yet scanned complete the blank line.
    pub(crate) fn ready(&mut self, buf: &[u8]) -> bool {
        if !self.tried {
            self.tried = true;
            return true;
        }
        self.advance(buf)
    }

    /// Scans the bytes of `buf` not yet seen: true once a blank line after the start line is
    /// among them.
    pub(crate) fn advance(&mut self, buf: &[u8]) -> bool {
        let mut at = self.at as usize;
        while let Some(lf) = buf
            .get(at..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
        {
            let lf = at + lf;
            let line = buf.get(self.line_start as usize..lf).unwrap_or_default();
            let empty = line.is_empty() || line == b"\r";
            at = lf + 1;
            self.line_start = u32::try_from(at).unwrap_or(u32::MAX);
            if empty && self.first_line_done {
                self.at = self.line_start;
                return true;
            }
            self.first_line_done |= !empty;
        }
        self.at = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        false
    }

    /// The limits on a head of which `len` bytes came and no end yet: a start line longer
    /// than `line_limit` is `too_long`, a head longer than [`MAX_HEAD`] is too large.
    pub(crate) fn check(
        &self,
        len: usize,
        line_limit: usize,
        too_long: HeadError,
    ) -> Result<(), HeadError> {
        if !self.first_line_done && len.saturating_sub(self.line_start as usize) > line_limit {
            return Err(too_long);
        }
        if len > MAX_HEAD {
            return Err(HeadError::HeadTooLarge);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `head` one byte more at a time; the length at which the scan first says ready.
    fn ready_at(head: &[u8]) -> Option<usize> {
        let mut scan = HeadScan {
            tried: true,
            ..HeadScan::default()
        };
        (1..=head.len()).find(|&n| scan.ready(&head[..n]))
    }

    #[test]
    fn the_end_is_the_first_blank_line_after_the_start_line() {
        let cases: &[(&[u8], Option<usize>)] = &[
            (b"GET / HTTP/1.1\r\nHost: a\r\n\r\nbody", Some(27)),
            (b"GET / HTTP/1.1\nHost: a\n\nbody", Some(24)),
            (b"\r\n\r\nGET / HTTP/1.1\r\n\r\n", Some(22)),
            (b"GET / HTTP/1.1\r\nHost: a\r\n", None),
            (b"GET / HTTP/1.1\r\nHost: a\r\r\n", None),
            (b"\r\n\n\r\n", None),
        ];
        for (head, end) in cases {
            assert_eq!(ready_at(head), *end, "{}", head.escape_ascii());
        }
    }

    #[test]
    fn the_first_try_parses_at_once_and_later_ones_scan() {
        let mut scan = HeadScan::default();
        assert!(scan.ready(b"GET / HT"), "the first read is parsed at once");
        assert!(!scan.advance(b"GET / HT"));
        assert!(!scan.ready(b"GET / HTTP/1.1\r\n"));
        assert!(scan.ready(b"GET / HTTP/1.1\r\n\r\n"));
    }

    #[test]
    fn an_endless_start_line_or_head_is_refused_before_it_ends() {
        let mut scan = HeadScan::default();
        let line = vec![b'a'; 100];
        scan.advance(&line);
        assert_eq!(
            scan.check(line.len(), 99, HeadError::TargetTooLong),
            Err(HeadError::TargetTooLong)
        );
        assert_eq!(
            scan.check(line.len(), 100, HeadError::TargetTooLong),
            Ok(())
        );
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        head.resize(MAX_HEAD + 1, b'a');
        let mut scan = HeadScan::default();
        scan.advance(&head);
        assert_eq!(
            scan.check(head.len(), 10, HeadError::TargetTooLong),
            Err(HeadError::HeadTooLarge)
        );
    }
}
