//! Which language a page is written in, for each request: `?lang=pt-BR` or `?lang=en` when
//! the reader asked (the page's links then keep it); else `LANGUAGE` where the file sets it
//! (an operator's choice for everyone); else the browser's `Accept-Language`, by its
//! q-values (Portuguese of any region is pt-BR, anything else English); else the default, as
//! before any of this: a monitor that sends none of them gets the page it always got.
//!
//! `Accept-Language` comes from anyone who reaches the port: it is read as bytes, only so far
//! ([`HEADER_BYTES`], [`RANGES`]), and an entry that does not parse is skipped, never an error.

use std::cmp::Reverse;

use crate::config::Language;

/// How much of `Accept-Language` is read: a browser's is under a hundred bytes (`pt-BR,pt;
/// q=0.9,en-US;q=0.8,en;q=0.7`); what lies past this is no reader's preference.
const HEADER_BYTES: usize = 1024;

/// How many of its language ranges are weighed, for the same reason.
const RANGES: usize = 32;

/// A page's language, and whether the reader asked for it (`?lang=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chosen {
    pub(super) language: Language,
    /// Asked with `?lang=`: the page's links carry it on, so the next page is in it too.
    pub(super) asked: bool,
}

/// The language of a page asked with the query string `query`, under a file that sets
/// `LANGUAGE` to `file` (`None` when it leaves it unset), from a browser that sent the
/// `Accept-Language` values `accept_language` (in order); `default` when none says.
pub(super) fn choose<'a>(
    query: Option<&str>,
    file: Option<Language>,
    accept_language: impl IntoIterator<Item = &'a [u8]>,
    default: Language,
) -> Chosen {
    if let Some(language) = query.and_then(asked) {
        return Chosen {
            language,
            asked: true,
        };
    }
    let language = file
        .or_else(|| from_browser(accept_language))
        .unwrap_or(default);
    Chosen {
        language,
        asked: false,
    }
}

/// `lang=pt-BR` (or `pt`, `en`, any case) among the query string's pairs; the last one
/// counts. An unknown value asks nothing.
fn asked(query: &str) -> Option<Language> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| key.eq_ignore_ascii_case("lang"))
        .filter_map(|(_, value)| value.parse().ok())
        .next_back()
}

/// What a language range weighs: its q-value in thousandths, whether it names the language
/// itself (not `*`), and where it stands in the header (an earlier one wins a tie).
type RangeWeight = (u16, bool, Reverse<usize>);

/// The language the browser prefers among ours, by `Accept-Language`'s q-values; `None`
/// when no range in it could be read.
fn from_browser<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Language> {
    let mut read = 0;
    let ranges = values
        .into_iter()
        .flat_map(|value| value.split(|&b| b == b','))
        .take_while(move |range| {
            read += range.len() + 1;
            read <= HEADER_BYTES
        })
        .filter_map(range)
        .take(RANGES);
    let (mut portuguese, mut english, mut any) = (None, None, None);
    let mut read_any = false;
    for (position, (primary, q)) in ranges.enumerate() {
        read_any = true;
        let slot = match primary {
            Primary::Portuguese => &mut portuguese,
            Primary::English => &mut english,
            Primary::Any => &mut any,
            Primary::Other => continue,
        };
        // The first range of the highest q-value names it.
        if slot.is_none_or(|(best, _, _): RangeWeight| q > best) {
            *slot = Some((q, primary != Primary::Any, Reverse(position)));
        }
    }
    if !read_any {
        return None;
    }
    // A language the header does not name weighs what `*` does, behind any that is named.
    let unnamed = any.map(|(q, _, position)| (q, false, position));
    let weigh = |named: Option<RangeWeight>| named.or(unnamed).unwrap_or((0, false, Reverse(0)));
    let (portuguese, english) = (weigh(portuguese), weigh(english));
    Some(if portuguese.0 > 0 && portuguese > english {
        Language::Portuguese
    } else {
        Language::English
    })
}

/// What a range's primary subtag names, for our two languages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Primary {
    Portuguese,
    English,
    /// `*`: any language.
    Any,
    Other,
}

/// One language range (`pt-BR;q=0.9`): what it names and its q-value in thousandths (1000
/// without one); `None` when it is malformed (then it is skipped, as if it were not there).
fn range(text: &[u8]) -> Option<(Primary, u16)> {
    let mut parts = text.split(|&b| b == b';');
    let tag = parts.next()?.trim_ascii();
    let primary = tag.split(|&b| b == b'-').next()?;
    let named = match primary {
        b"*" if tag.len() == 1 => Primary::Any,
        _ if primary.is_empty() || primary.len() > 8 => return None,
        _ if !primary.iter().all(u8::is_ascii_alphabetic) => return None,
        _ if primary.eq_ignore_ascii_case(b"pt") => Primary::Portuguese,
        _ if primary.eq_ignore_ascii_case(b"en") => Primary::English,
        _ => Primary::Other,
    };
    let mut q = 1000;
    for parameter in parts {
        let (name, value) = split_once(parameter.trim_ascii(), b'=')?;
        if name.trim_ascii().eq_ignore_ascii_case(b"q") {
            q = qvalue(value.trim_ascii())?;
        }
    }
    Some((named, q))
}

/// A q-value (`0`, `0.8`, `1.000`) in thousandths; `None` when it is none (RFC 9110, 12.4.2).
fn qvalue(text: &[u8]) -> Option<u16> {
    let (whole, fraction) = split_once(text, b'.').unwrap_or((text, b""));
    if fraction.len() > 3 || !fraction.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let thousandths = fraction
        .iter()
        .chain(std::iter::repeat(&b'0'))
        .take(3)
        .fold(0u16, |n, digit| n * 10 + u16::from(digit - b'0'));
    match whole {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

fn split_once(text: &[u8], separator: u8) -> Option<(&[u8], &[u8])> {
    let at = text.iter().position(|&b| b == separator)?;
    Some((&text[..at], &text[at + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Language::{English, Portuguese};

    fn browser(header: &str) -> Option<Language> {
        from_browser([header.as_bytes()])
    }

    #[test]
    fn the_browsers_preference_among_ours_by_q_values() {
        for (header, wanted) in [
            ("pt-BR,pt;q=0.9,en-US;q=0.8,en;q=0.7", Some(Portuguese)),
            ("pt-PT", Some(Portuguese)),
            ("PT-br", Some(Portuguese)),
            ("pt", Some(Portuguese)),
            ("en-US,en;q=0.9,pt-BR;q=0.8", Some(English)),
            ("en-GB", Some(English)),
            // French first, which we have not: of ours, Portuguese is the one it takes.
            ("fr-FR, pt;q=0.5", Some(Portuguese)),
            ("en;q=0.4, pt;q=0.6", Some(Portuguese)),
            ("en ; q=0.6 , pt;q=0.4", Some(English)),
            // q=0: not acceptable at all.
            ("pt;q=0, en", Some(English)),
            ("pt;q=0", Some(English)),
            ("de, fr;q=0.9", Some(English)),
            ("*", Some(English)),
            ("*;q=0.5, pt;q=0.4", Some(English)),
            ("de, *;q=0.1", Some(English)),
            // A tie goes to the first named.
            ("pt, en", Some(Portuguese)),
            ("en, pt", Some(English)),
            // Malformed ranges are skipped.
            ("pt;q=nonsense", None),
            ("pt;q=1.5", None),
            ("pt;q=0.0001", None),
            ("portuguese", None),
            ("p1, pt-BR", Some(Portuguese)),
            (",,;;=q=;pt", None),
            (",,;q=, pt", Some(Portuguese)),
            ("", None),
            ("\u{fffd}, pt", Some(Portuguese)),
        ] {
            assert_eq!(browser(header), wanted, "{header:?}");
        }
        // Several header lines are one list, in order.
        assert_eq!(from_browser([&b"de"[..], b"pt;q=0.5"]), Some(Portuguese));
    }

    #[test]
    fn a_long_header_is_read_only_so_far() {
        // A Portuguese range past the first kilobyte, or past the 32nd range, is not read.
        let padding = "x".repeat(HEADER_BYTES);
        assert_eq!(browser(&format!("{padding}, pt")), None);
        let many = vec!["de"; RANGES].join(",");
        assert_eq!(browser(&format!("{many},pt")), Some(English));
        assert_eq!(browser(&many), Some(English));
    }

    #[test]
    fn q_values_in_thousandths() {
        for (text, wanted) in [
            ("1", Some(1000)),
            ("1.000", Some(1000)),
            ("1.", Some(1000)),
            ("0", Some(0)),
            ("0.8", Some(800)),
            ("0.125", Some(125)),
            ("1.001", None),
            ("0.1234", None),
            ("2", None),
            ("", None),
            ("-0.5", None),
            ("0.x", None),
        ] {
            assert_eq!(qvalue(text.as_bytes()), wanted, "{text:?}");
        }
    }

    #[test]
    fn asked_then_the_file_then_the_browser_then_the_default() {
        let pt = [&b"pt-BR"[..]];
        let chosen =
            |query, file, header: &[&[u8]]| choose(query, file, header.iter().copied(), English);
        assert_eq!(
            chosen(Some("refresh=5&lang=pt-BR"), Some(English), &[]),
            Chosen {
                language: Portuguese,
                asked: true
            }
        );
        assert_eq!(chosen(Some("lang=en"), None, &pt).language, English);
        assert_eq!(chosen(Some("LANG=pt"), None, &[]).language, Portuguese);
        // An unknown value asks nothing.
        let unknown = chosen(Some("lang=xx"), None, &pt);
        assert_eq!((unknown.language, unknown.asked), (Portuguese, false));
        assert_eq!(chosen(None, Some(English), &pt).language, English);
        assert_eq!(chosen(None, None, &pt).language, Portuguese);
        assert_eq!(chosen(None, None, &[]).language, English);
        assert_eq!(
            choose(None, None, [], Portuguese).language,
            Portuguese,
            "no header: the default, as before"
        );
    }
}
