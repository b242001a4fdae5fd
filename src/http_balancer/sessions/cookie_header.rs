//! A request's `Cookie` header as bytes: finding the broker's cookie among the
//! others, and taking it out of the request forwarded to the server. Nothing here assumes
//! ASCII or UTF-8: a Windows-1252 application cookie (`lang=S\xe3o`) is as common in a
//! Protheus shop as a UTF-8 one, and neither may cost a user their affinity or leak the
//! broker's cookie to the server.
//!
//! Pairs are split on `;` (RFC 6265 §4.2.1), and within a pair on `,`: old clients and
//! proxies joined several `Cookie` headers with commas. Names are trimmed of blanks, so
//! `TOTVS_BROKER_SH_001 =...` is the broker's cookie too (browsers send what a script set).
//! Names are compared exactly, as browsers keep them.

use super::ticket::{COOKIE, CookieKeys, Signed, Ticket};

/// Blanks around a name, a value or a pair: space and horizontal tab.
fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = bytes.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(start), Some(end)) => &bytes[start..=end],
        _ => &[],
    }
}

/// The value of `item` (`name=value`) when its name is the broker's cookie: trimmed of blanks
/// and of the double quotes RFC 6265 allows around it.
fn broker_value(item: &[u8]) -> Option<&[u8]> {
    let equals = item.iter().position(|&b| b == b'=')?;
    if trim(&item[..equals]) != COOKIE.as_bytes() {
        return None;
    }
    let value = trim(&item[equals + 1..]);
    Some(match value {
        [b'"', inner @ .., b'"'] => inner,
        other => other,
    })
}

/// The items of one header value: every `;`-separated pair split again on `,` (so split on
/// either).
fn items(header: &[u8]) -> impl Iterator<Item = &[u8]> {
    header.split(|&b| b == b';' || b == b',')
}

/// True when `header` may hold the broker's cookie (its name appears anywhere): the cheap
/// test before [`without_broker_cookie`] rebuilds anything.
pub fn mentions_broker_cookie(header: &[u8]) -> bool {
    let name = COOKIE.as_bytes();
    // The name's first byte found first: a comparison per candidate, not per byte.
    header
        .iter()
        .enumerate()
        .any(|(at, &b)| b == name[0] && header[at..].starts_with(name))
}

/// `header` without the broker's cookie, every other byte of the other cookies kept as the
/// client wrote them (their order, their separators); `None` when no cookie is left (the
/// header goes). A removed item takes the separator before it along (the one after, for a
/// first item). Written in one pass into one buffer, which a header holding the broker's
/// cookie alone never allocates.
pub fn without_broker_cookie(header: &[u8]) -> Option<Vec<u8>> {
    let mut kept: Vec<u8> = Vec::new();
    // Whether a pair was kept yet: the pairs after it are joined to it with `;`.
    let mut any_pair = false;
    for pair in header.split(|&b| b == b';') {
        let items = || pair.split(|&b| b == b',');
        if !items().any(|item| broker_value(item).is_some()) {
            if any_pair {
                kept.push(b';');
            }
            kept.extend_from_slice(pair);
            any_pair = true;
            continue;
        }
        let mut any_item = false;
        for item in items().filter(|item| broker_value(item).is_none()) {
            if any_item {
                kept.push(b',');
            } else if any_pair {
                kept.push(b';');
            }
            kept.extend_from_slice(item);
            any_item = true;
        }
        any_pair |= any_item;
    }
    let start = kept.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = kept.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    let (Some(start), Some(end)) = (start, end) else {
        return None;
    };
    if kept[start..=end]
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b';' | b','))
    {
        return None;
    }
    kept.truncate(end + 1);
    kept.drain(..start);
    Some(kept)
}

/// Values of the broker's cookie checked per request at most: a browser holds a few (from other
/// paths or hosts); a request stuffed with forged ones costs no more than this many MACs.
const MAX_CHECKED: usize = 8;

/// What a request's cookies say about its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity {
    /// A value this broker (or its pair) signed for this balancer: a session, on the server
    /// it names.
    Signed(Ticket),
    /// A value signed with `SESSION_SECRET_PREVIOUS`: the same session, to be signed anew.
    Previous(Ticket),
    /// A value of the earlier form, bound to no balancer: the same session in its upgrade
    /// window (signed anew, bound), no cookie after it.
    Unbound(Ticket),
    /// A value of the right form that does not verify: forged, issued for another balancer,
    /// or issued before cookies were signed. Honoured only in the upgrade window, never a
    /// session.
    Unsigned(Ticket),
    /// No value of the right form.
    None,
}

impl Affinity {
    /// The first value signed for `[balancer]` with the current secret among the request's
    /// `Cookie` header values, else the first signed with the previous one, else the first of
    /// the earlier form, else the first of the right form (a browser may hold several, from
    /// other paths or hosts).
    pub fn of<'a>(
        headers: impl IntoIterator<Item = &'a [u8]>,
        keys: &CookieKeys,
        balancer: &'static str,
    ) -> Affinity {
        let (mut previous, mut unbound, mut unsigned) = (None, None, None);
        let tickets = headers
            .into_iter()
            .filter(|header| mentions_broker_cookie(header))
            .flat_map(items)
            .filter_map(broker_value)
            .filter_map(Ticket::parse)
            .take(MAX_CHECKED);
        for ticket in tickets {
            match keys.check(balancer, &ticket) {
                Signed::Current => return Affinity::Signed(ticket),
                Signed::Previous => previous = previous.or(Some(ticket)),
                Signed::Unbound => unbound = unbound.or(Some(ticket)),
                Signed::Neither => unsigned = unsigned.or(Some(ticket)),
            }
        }
        match (previous, unbound, unsigned) {
            (Some(ticket), _, _) => Affinity::Previous(ticket),
            (None, Some(ticket), _) => Affinity::Unbound(ticket),
            (None, None, Some(ticket)) => Affinity::Unsigned(ticket),
            (None, None, None) => Affinity::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerId;

    /// The balancer the tests' values are for.
    const HTTP: &str = "BALANCE_HTTP";

    fn keys() -> CookieKeys {
        CookieKeys::new(b"the cookie header tests' secret, 32+", None, None)
    }

    fn signed(id: &str) -> Ticket {
        keys().sign(HTTP, ServerId::parse(id).expect("an id"), *b"nonce-00")
    }

    fn strip(header: &[u8]) -> Option<Vec<u8>> {
        without_broker_cookie(header)
    }

    #[test]
    fn the_signed_value_is_found_among_others_and_wins_over_unsigned_ones() {
        let good = signed("02");
        let header = format!(
            "a=1; TOTVS_BROKER_SH_001=bogus; TOTVS_BROKER_SH_001=01.q3VdAbCdEfGhIjKlMnOpQr; \
             TOTVS_BROKER_SH_001={good}; b=2"
        );
        assert_eq!(
            Affinity::of([header.as_bytes()], &keys(), HTTP),
            Affinity::Signed(good)
        );
        let unsigned = Ticket::parse(b"01.q3VdAbCdEfGhIjKlMnOpQr").expect("parses");
        assert_eq!(
            Affinity::of(
                [&b"TOTVS_BROKER_SH_001=01.q3VdAbCdEfGhIjKlMnOpQr"[..]],
                &keys(),
                HTTP
            ),
            Affinity::Unsigned(unsigned)
        );
        assert_eq!(
            Affinity::of([&b"a=1; b=2"[..]], &keys(), HTTP),
            Affinity::None
        );
        // Past the first eight values, none is checked.
        let stuffed = format!(
            "{}TOTVS_BROKER_SH_001={good}",
            "TOTVS_BROKER_SH_001=01.q3VdAbCdEfGhIjKlMnOpQr; ".repeat(8)
        );
        assert_eq!(
            Affinity::of([stuffed.as_bytes()], &keys(), HTTP),
            Affinity::Unsigned(unsigned)
        );
        assert_eq!(
            Affinity::of([&b"\xff\xfe"[..]], &keys(), HTTP),
            Affinity::None
        );
    }

    #[test]
    fn any_byte_in_another_cookie_leaves_the_broker_cookie_found_and_stripped() {
        let good = signed("01");
        for byte in 0x80..=0xffu8 {
            for header in [
                [
                    &b"lang=S"[..],
                    &[byte],
                    b"o; TOTVS_BROKER_SH_001=",
                    good.to_string().as_bytes(),
                ]
                .concat(),
                [
                    b"TOTVS_BROKER_SH_001=",
                    good.to_string().as_bytes(),
                    b"; x=",
                    &[byte],
                ]
                .concat(),
            ] {
                assert_eq!(
                    Affinity::of([&header[..]], &keys(), HTTP),
                    Affinity::Signed(good)
                );
                let left = strip(&header).expect("the other cookie stays");
                assert!(!mentions_broker_cookie(&left));
                assert!(left.contains(&byte), "{byte:#x}");
            }
        }
    }

    #[test]
    fn blanks_around_the_name_quotes_and_commas_are_the_broker_cookie_too() {
        let good = signed("03");
        for header in [
            format!("TOTVS_BROKER_SH_001 ={good}"),
            format!("\tTOTVS_BROKER_SH_001\t= {good} "),
            format!("TOTVS_BROKER_SH_001=\"{good}\""),
            format!("a=1, TOTVS_BROKER_SH_001={good}, b=2"),
            format!("$Version=1; TOTVS_BROKER_SH_001={good}; $Path=/"),
        ] {
            assert_eq!(
                Affinity::of([header.as_bytes()], &keys(), HTTP),
                Affinity::Signed(good),
                "{header}"
            );
            let left = strip(header.as_bytes()).unwrap_or_default();
            assert!(!mentions_broker_cookie(&left), "{header}");
        }
        // Another name is another cookie.
        assert_eq!(
            Affinity::of(
                [format!("totvs_broker_sh_001={good}").as_bytes()],
                &keys(),
                HTTP
            ),
            Affinity::None
        );
    }

    #[test]
    fn stripping_keeps_every_other_byte_and_separator() {
        for (header, left) in [
            (&b"TOTVS_BROKER_SH_001=01.x"[..], None),
            (
                b"a=1; TOTVS_BROKER_SH_001=01.x; b=2",
                Some(&b"a=1; b=2"[..]),
            ),
            (b"a=1;TOTVS_BROKER_SH_001=anything", Some(b"a=1")),
            (b"TOTVS_BROKER_SH_001=x;  a=1", Some(b"a=1")),
            (b"a=1;b=2; TOTVS_BROKER_SH_001=x", Some(b"a=1;b=2")),
            (
                b"a = 1 ;TOTVS_BROKER_SH_001=x; b=\"q\"",
                Some(b"a = 1 ; b=\"q\""),
            ),
            (b"a=1, TOTVS_BROKER_SH_001=x, b=2", Some(b"a=1, b=2")),
            (b"TOTVS_BROKER_SH_001=x, a=1; b=2", Some(b"a=1; b=2")),
            (b"p=a,b, TOTVS_BROKER_SH_001=x", Some(b"p=a,b")),
            (b"TOTVS_BROKER_SH_001 =x; TOTVS_BROKER_SH_001=y", None),
            (
                b"TOTVS_BROKER_SH_0011=keep",
                Some(b"TOTVS_BROKER_SH_0011=keep"),
            ),
            (b"lang=S\xe3o; TOTVS_BROKER_SH_001=x", Some(b"lang=S\xe3o")),
            (
                b"n=\xc3\xa9\xff; TOTVS_BROKER_SH_001=x;m=\x80",
                Some(b"n=\xc3\xa9\xff;m=\x80"),
            ),
            (b"", None),
            (b" ; ", None),
        ] {
            assert_eq!(
                strip(header).as_deref(),
                left,
                "{}",
                String::from_utf8_lossy(header)
            );
        }
    }
}
