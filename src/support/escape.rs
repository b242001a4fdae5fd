//! Text from outside the broker (a server's certificate names, a server's reply, a client's
//! request target or headers, a command's output) made safe for one log line or one
//! environment variable: its control characters written out (`\n`, `\x1b`, `\u{9b}`), so
//! that none breaks a line in two, forges a line of its own or reaches a terminal; and its
//! length bounded, with a mark where it was cut, so that no peer fills a line. Applied once,
//! where the lines and a command's variables are made (the log's formatter,
//! `alerts::command`), rather than at each call site, which a new one would forget.

use std::borrow::Cow;

/// Bytes of one field of a log line (`server=...`) or one variable of a command at most,
/// escaped: a line stays readable, an address or a reason fits whole.
pub const FIELD_MAX: usize = 512;

/// Bytes of a log line's message at most, escaped. More than a field: the message is the
/// broker's own sentence with outside text inside (a certificate refused is told with its
/// subject, issuer, names and what to change), which a field's bound would cut short.
pub const MESSAGE_MAX: usize = 4096;

/// `text` with its control characters written out: `\n`, `\r`, `\t`, `\x1b` for the other
/// ASCII ones, `\u{9b}` beyond ASCII. Printable text, whatever its script, is kept as it is.
pub fn escape_controls(text: &str) -> String {
    escaped(text).into_owned()
}

/// [`escape_controls`], borrowing `text` when it holds no control character (the usual case,
/// which then costs one scan).
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() && c.is_ascii() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `text` escaped ([`escaped`]) and cut to at most `max` bytes (at a character's boundary),
/// with a mark saying how many bytes of the escaped text were left out: `...[+3584 bytes]`.
pub fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    let text = escaped(text);
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}...[+{} bytes]", &text[..end], text.len() - end))
}

/// `text` as one quoted field of a log line (`"..."`), as Rust's `Debug` quotes a string:
/// `\` and `"` escaped first, so that the quotes end where the field does, then the control
/// characters ([`escaped`]), bounded to [`FIELD_MAX`].
pub fn quoted(text: &str) -> String {
    let mut raw = String::with_capacity(text.len() + 2);
    for c in text.chars() {
        match c {
            '"' => raw.push_str("\\\""),
            '\\' => raw.push_str("\\\\"),
            c => raw.push(c),
        }
    }
    format!("\"{}\"", bounded(&raw, FIELD_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_written_out_and_printable_text_kept() {
        let forged = "patch\nWARN  server 10.0.0.9:1234 enabled\x1b[2J\u{9b}\r\t\0";
        assert_eq!(
            escape_controls(forged),
            "patch\\nWARN  server 10.0.0.9:1234 enabled\\x1b[2J\\u{9b}\\r\\t\\x00"
        );
        assert!(!escape_controls(forged).chars().any(char::is_control));
        assert!(matches!(escaped("São Paulo, 東京"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_long_text_is_cut_at_a_character_with_a_mark() {
        assert_eq!(bounded("short", 8), "short");
        assert_eq!(bounded("0123456789", 4), "0123...[+6 bytes]");
        // The cut counts the escaped text: a line break is two bytes there.
        assert_eq!(bounded("a\nbcd", 3), "a\\n...[+3 bytes]");
        // Never inside a character: é is two bytes.
        assert_eq!(bounded("ééé", 3), "é...[+4 bytes]");
        let long = "x".repeat(10_000);
        let cut = bounded(&long, FIELD_MAX);
        assert!(cut.starts_with(&"x".repeat(FIELD_MAX)) && cut.ends_with("...[+9488 bytes]"));
    }

    #[test]
    fn a_quoted_field_ends_where_its_quotes_do() {
        assert_eq!(quoted("a b"), "\"a b\"");
        assert_eq!(quoted("x\" forged=\"1\n\\"), r#""x\" forged=\"1\n\\""#);
    }
}
