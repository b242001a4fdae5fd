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

/// A blank around a name, a value or a pair: space or horizontal tab.
fn blank(byte: &u8) -> bool {
    matches!(byte, b' ' | b'\t')
}

/// Where `bytes` start and end (inclusive) without the blanks around them; `None` when they
/// are all blanks.
fn unblanked(bytes: &[u8]) -> Option<(usize, usize)> {
    let start = bytes.iter().position(|b| !blank(b))?;
    let end = bytes.iter().rposition(|b| !blank(b))?;
    Some((start, end))
}

/// `bytes` without the blanks around them.
fn trim(bytes: &[u8]) -> &[u8] {
    unblanked(bytes).map_or(&[], |(start, end)| &bytes[start..=end])
}

/// The value of `item` (`name=value`) when its name is the broker's cookie: trimmed of blanks
/// and of the double quotes RFC 6265 allows around it.
fn broker_value(item: &[u8]) -> Option<&[u8]> {
    let equals = memchr::memchr(b'=', item)?;
    if trim(&item[..equals]) != COOKIE.as_bytes() {
        return None;
    }
    let value = trim(&item[equals + 1..]);
    Some(match value {
        [b'"', inner @ .., b'"'] => inner,
        other => other,
    })
}

/// A separator between items, or a blank around one.
fn separator_or_blank(byte: &u8) -> bool {
    blank(byte) || matches!(byte, b';' | b',')
}

/// The items of `header` that are the broker's cookie (items: every `;`-separated pair split
/// again on `,`), each as where it starts and ends (its separators excluded) and its value as
/// [`broker_value`] gives it. Found by a vectorised search for the name's first byte and for
/// the separators, not by splitting every item and looking for its `=` a byte at a time.
fn broker_items(header: &[u8]) -> impl Iterator<Item = (usize, usize, &[u8])> {
    let name = COOKIE.as_bytes();
    let mut from = 0;
    // Where the item around the last name found starts, and how far separators were looked
    // for: each byte is looked at once, however many names a hostile line repeats in one item
    // (looking back from each to its item's start would be quadratic in the line).
    let (mut item_start, mut scanned) = (0, 0);
    std::iter::from_fn(move || {
        while let Some(found) = memchr::memchr(name[0], &header[from..]) {
            let at = from + found;
            from = at + 1;
            if !header[at..].starts_with(name) {
                continue;
            }
            if let Some(s) = memchr::memrchr2(b';', b',', &header[scanned..at]) {
                item_start = scanned + s + 1;
            }
            scanned = at;
            // The name starts its item when only blanks come between the separator and it;
            // looked at from the name back, so only the blanks just before it are read.
            let start = item_start;
            if !header[start..at].iter().rev().all(blank) {
                continue;
            }
            let end = memchr::memchr2(b';', b',', &header[at..]).map_or(header.len(), |e| at + e);
            from = end;
            if let Some(value) = broker_value(&header[start..end]) {
                return Some((start, end, value));
            }
        }
        None
    })
}

/// True when `header` may hold the broker's cookie (its name appears anywhere): the cheap
/// test before [`without_broker_cookie`] rebuilds anything.
pub fn mentions_broker_cookie(header: &[u8]) -> bool {
    let name = COOKIE.as_bytes();
    memchr::memchr_iter(name[0], header).any(|at| header[at..].starts_with(name))
}

/// `header` without the broker's cookie, every other byte of the other cookies kept as the
/// client wrote them (their order, their separators); `None` when no cookie is left (the
/// header goes). A removed item takes the separator before it along (the one after, for a
/// first item). Written in one pass into one buffer, which a header holding the broker's
/// cookie alone never allocates.
pub fn without_broker_cookie(header: &[u8]) -> Option<Vec<u8>> {
    // The usual line holds the broker's cookie alone: nothing is left, with no pass over its
    // pairs and items. Most often it is written `name=value` with no separator at all, known
    // so by one look for one (the walk below finds the same, at several times the cost).
    let alone = header.strip_prefix(COOKIE.as_bytes());
    if alone.is_some_and(|rest| {
        rest.first() == Some(&b'=') && memchr::memchr2(b';', b',', rest).is_none()
    }) {
        return None;
    }
    let mut after = 0;
    let mut others = false;
    for (start, end, _) in broker_items(header) {
        others |= !header[after..start].iter().all(separator_or_blank);
        after = end;
    }
    if !others && header[after..].iter().all(separator_or_blank) {
        return None;
    }
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
    let (start, end) = unblanked(&kept)?;
    if kept[start..=end].iter().all(separator_or_blank) {
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
            .flat_map(broker_items)
            .filter_map(|(_, _, value)| Ticket::parse(value))
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

    /// The broker's values and the stripped line as the first implementation found them
    /// (every pair split, every item looked at for its `=`, the pairs joined again): what the
    /// one-pass walk must agree with.
    fn by_splitting(header: &[u8]) -> (Vec<&[u8]>, Option<Vec<u8>>) {
        let values = header
            .split(|&b| b == b';')
            .flat_map(|pair| pair.split(|&b| b == b','))
            .filter_map(broker_value)
            .collect();
        let mut pairs: Vec<Vec<u8>> = Vec::new();
        for pair in header.split(|&b| b == b';') {
            let items = || pair.split(|&b| b == b',');
            if !items().any(|item| broker_value(item).is_some()) {
                pairs.push(pair.to_vec());
                continue;
            }
            let others: Vec<&[u8]> = items().filter(|i| broker_value(i).is_none()).collect();
            if !others.is_empty() {
                pairs.push(others.join(&b","[..]));
            }
        }
        let joined = pairs.join(&b";"[..]);
        let left = trim(&joined);
        let stripped = (!left.iter().all(separator_or_blank)).then(|| left.to_vec());
        (values, stripped)
    }

    #[test]
    fn the_one_pass_walk_agrees_with_splitting_every_item() {
        let items: [&[u8]; 9] = [
            b"a=1",
            b"TOTVS_BROKER_SH_001=01.x",
            b" TOTVS_BROKER_SH_001 = \"y\" ",
            b"",
            b" ",
            b"x=TOTVS_BROKER_SH_001=z",
            b"TOTVS_BROKER_SH_0011=k",
            b"TOTVS_BROKER_SH_001",
            b"\tTOTVS_BROKER_SH_001=",
        ];
        let separators: [&[u8]; 4] = [b";", b",", b"; ", b" ,"];
        let mut checked = 0;
        for a in items {
            for b in items {
                for c in items {
                    for s in separators {
                        for t in separators {
                            let header = [a, s, b, t, c].concat();
                            let (values, stripped) = by_splitting(&header);
                            let found: Vec<&[u8]> =
                                broker_items(&header).map(|(_, _, v)| v).collect();
                            let shown = String::from_utf8_lossy(&header);
                            assert_eq!(found, values, "{shown}");
                            assert_eq!(without_broker_cookie(&header), stripped, "{shown}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 9 * 9 * 9 * 16);
        // A line of one item, which the look for no separator may settle alone.
        for header in items {
            let (_, stripped) = by_splitting(header);
            let shown = String::from_utf8_lossy(header);
            assert_eq!(without_broker_cookie(header), stripped, "{shown}");
        }
    }

    #[test]
    fn a_line_repeating_the_name_in_one_item_is_walked_as_splitting_walks_it() {
        // What a hostile client would send to make a walk that looks back from every name
        // to its item's start quadratic: the answers stay the splitting walk's.
        let name = COOKIE;
        for header in [
            format!("x{}", name.repeat(500)),
            format!("{}x{}=v", " ".repeat(5000), name.repeat(50)),
            format!("a=1;{}{}=01.x", " \t".repeat(300), name),
            format!("{}=01.x;{}", name, format!(" {name}").repeat(200)),
        ] {
            let header = header.as_bytes();
            let (values, stripped) = by_splitting(header);
            let found: Vec<&[u8]> = broker_items(header).map(|(_, _, v)| v).collect();
            assert_eq!(found, values);
            assert_eq!(without_broker_cookie(header), stripped);
        }
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
