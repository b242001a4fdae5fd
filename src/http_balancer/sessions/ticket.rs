//! The `TOTVS_BROKER_SH_001` cookie's value, `<REMOTE_SERVER id>.<22 base64url characters>`,
//! and the keys that sign it. The 22 characters are 16 bytes: a random nonce of 8
//! and the first 8 bytes of HMAC-SHA256 over the balancer's section name, the id and the
//! nonce under `SESSION_SECRET`. Only a value this broker (or its pair, with the same secret
//! and section names) issued for this very balancer verifies: a forged one counts as no
//! cookie, so it cannot steer a request to a server an operator took out, nor make sessions;
//! and one issued by another balancer of the file, whose server 02 is another AppServer, is
//! no session here either.
//!
//! Values of the earlier form, whose tag covered the id and nonce alone (a label of their
//! own, so neither form verifies as the other), still verify as [`Signed::Unbound`]: the
//! balancer honours them for one `SESSION_TIMEOUT` after the first start of the build that
//! binds cookies, then no more.
//!
//! Why these sizes: 22 base64url characters hold 132 bits (the form the TOTVS broker's
//! cookie has, and browsers and tests already expect). A 64-bit tag leaves an attacker one
//! chance in 2^64 per request (at a million requests a second, about 400,000 years for an
//! even chance); a 64-bit nonce keeps two browsers' values apart (a collision only merges
//! their counts, never their servers). The last character's 4 spare bits are zero.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use aws_lc_rs::{constant_time, hmac};

use crate::config::ServerId;
use crate::tls::files::Passphrase;

/// The cookie's name, as the TOTVS broker sets it.
pub const COOKIE: &str = "TOTVS_BROKER_SH_001";

/// Characters after the id and the dot: 22 base64url characters, 132 bits.
const RANDOM: usize = 22;

/// Bytes of nonce, then of tag, in the 16 the characters carry.
const NONCE: usize = 8;
const TAG: usize = 8;

/// What the MAC covers before the balancer, the id and the nonce: a value made for another
/// purpose under the same secret (the earlier form among them) can never pass for a cookie.
const LABEL: &[u8] = b"appbroker TOTVS_BROKER_SH_001 v2\0";

/// The earlier form's label, whose MAC covered the id and nonce alone: a cookie of it names
/// no balancer (see [`Signed::Unbound`]).
const UNBOUND_LABEL: &[u8] = b"appbroker TOTVS_BROKER_SH_001 v1\0";

/// The URL-safe base64 alphabet (RFC 4648 §5): safe in a cookie without quoting.
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Whether `c` is one of [`ALPHABET`]'s characters: by class, not by a search of the
/// alphabet (a search per character was a share of every request worth cutting: the figures
/// in docs/benchmarks.md, "Instructions per connection and per request").
fn in_alphabet(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
}

/// Random bytes of a generated secret: 256 bits, written as 43 base64url characters.
const SECRET_BYTES: usize = 32;

/// One cookie value as a request brought it: the server it names and its 22 characters,
/// not yet verified. Stored inline (24 bytes), so a session costs no allocation of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    /// The `REMOTE_SERVER` id the value names.
    pub server: ServerId,
    random: [u8; RANDOM],
}

impl Ticket {
    /// Parses a value as bytes; `None` for anything but `<two-character id>.<22 base64url
    /// characters>`. Says nothing of who made it: see [`CookieKeys::verify`].
    pub fn parse(value: &[u8]) -> Option<Ticket> {
        let dot = value.iter().position(|&b| b == b'.')?;
        let id = std::str::from_utf8(&value[..dot]).ok()?;
        let server = ServerId::parse(id)?;
        let random: [u8; RANDOM] = value[dot + 1..].try_into().ok()?;
        random
            .iter()
            .all(|&c| in_alphabet(c))
            .then_some(Ticket { server, random })
    }

    /// A value for `server` carrying `bytes`, encoded as base64url without padding.
    fn encode(server: ServerId, bytes: [u8; NONCE + TAG]) -> Ticket {
        let bits = u128::from_be_bytes(bytes);
        let mut random = [0u8; RANDOM];
        // 21 characters of 6 bits, the most significant first, then the last 2 bits in the
        // top of the 22nd (its low 4 bits zero), as RFC 4648 writes 16 bytes.
        for (i, c) in random.iter_mut().take(RANDOM - 1).enumerate() {
            *c = ALPHABET[((bits >> (122 - 6 * i)) & 63) as usize];
        }
        random[RANDOM - 1] = ALPHABET[((bits & 3) << 4) as usize];
        Ticket { server, random }
    }

    /// The 16 bytes the characters carry; `None` when the spare bits are not zero (no value
    /// this broker wrote).
    fn decode(&self) -> Option<[u8; NONCE + TAG]> {
        let sextet = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|v| v as u128);
        let mut bits: u128 = 0;
        for &c in &self.random[..RANDOM - 1] {
            bits = (bits << 6) | sextet(c)?;
        }
        let last = sextet(self.random[RANDOM - 1])?;
        if last & 0x0f != 0 {
            return None;
        }
        Some(((bits << 2) | (last >> 4)).to_be_bytes())
    }

    /// The `Set-Cookie` value that hands this ticket to a browser (`Secure` over TLS).
    pub fn set_cookie(&self, secure: bool) -> String {
        let secure = if secure { "; Secure" } else { "" };
        format!("{COOKIE}={self}; Path=/; HttpOnly; SameSite=Lax{secure}")
    }
}

impl std::fmt::Display for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The random part is ASCII from ALPHABET by construction.
        let random = std::str::from_utf8(&self.random).unwrap_or("");
        write!(f, "{}.{random}", self.server)
    }
}

/// Which secret signed a value, for the balancer asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signed {
    /// `SESSION_SECRET` (or the broker's own secret), for this balancer.
    Current,
    /// `SESSION_SECRET_PREVIOUS`, for this balancer: to be signed anew.
    Previous,
    /// Either secret, in the earlier form that names no balancer: honoured only in its
    /// upgrade window ([`CookieKeys::honours_unbound`]), and then signed anew, bound.
    Unbound,
    /// Neither: forged, issued for another balancer, or from before cookies were signed.
    Neither,
}

/// The keys cookies are signed and verified with: the current secret signs and verifies,
/// the previous one (`SESSION_SECRET_PREVIOUS`, during a rotation) verifies only. Also when
/// the upgrade windows opened (see [`CookieKeys::honours_unsigned`] and
/// [`CookieKeys::honours_unbound`]).
pub struct CookieKeys {
    /// Unique to these keys in the process: what a verified ticket is remembered under.
    id: u64,
    current: hmac::Key,
    previous: Option<hmac::Key>,
    /// Wall ms of the first start that signed cookies, when it opened a window for the
    /// unsigned cookies of the version before; `None`: no such window.
    signed_since_wall_ms: Option<u64>,
    /// Wall ms of the first start that bound cookies to their balancer, when it opened a
    /// window for cookies of the earlier form; `None`: no such window (and they are not even
    /// checked, which saves a forged cookie's two MACs).
    bound_since_wall_ms: Option<u64>,
}

impl std::fmt::Debug for CookieKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CookieKeys")
            .field("previous", &self.previous.is_some())
            .field("signed_since_wall_ms", &self.signed_since_wall_ms)
            .field("bound_since_wall_ms", &self.bound_since_wall_ms)
            .finish_non_exhaustive()
    }
}

impl CookieKeys {
    /// Keys from the secrets' bytes.
    pub fn new(
        current: &[u8],
        previous: Option<&[u8]>,
        signed_since_wall_ms: Option<u64>,
    ) -> CookieKeys {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        CookieKeys {
            id: NEXT_ID.fetch_add(1, Relaxed),
            current: hmac::Key::new(hmac::HMAC_SHA256, current),
            previous: previous.map(|p| hmac::Key::new(hmac::HMAC_SHA256, p)),
            signed_since_wall_ms,
            bound_since_wall_ms: None,
        }
    }

    /// The same keys, with the window for cookies of the earlier form opened at
    /// `since_wall_ms` (`None`: no window).
    pub fn with_unbound_window(mut self, since_wall_ms: Option<u64>) -> CookieKeys {
        self.bound_since_wall_ms = since_wall_ms;
        self
    }

    /// A new value for `server` of the balancer `[balancer]`, with a fresh random nonce.
    pub fn issue(&self, balancer: &str, server: ServerId) -> Ticket {
        self.sign(balancer, server, random_bytes())
    }

    /// The value for `server` of the balancer `[balancer]` (its section's name) with
    /// `nonce`, signed with the current secret. Deterministic, for tests and benchmarks that
    /// need a fixed valid value; [`CookieKeys::issue`] is the broker's.
    pub fn sign(&self, balancer: &str, server: ServerId, nonce: [u8; NONCE]) -> Ticket {
        let mut bytes = [0u8; NONCE + TAG];
        bytes[..NONCE].copy_from_slice(&nonce);
        bytes[NONCE..].copy_from_slice(&tag(&self.current, Some(balancer), server, &nonce));
        Ticket::encode(server, bytes)
    }

    /// The value of the earlier form for `server` with `nonce`, bound to no balancer, signed
    /// with the current secret: what a broker of an earlier build issued, for tests.
    pub fn sign_unbound(&self, server: ServerId, nonce: [u8; NONCE]) -> Ticket {
        let mut bytes = [0u8; NONCE + TAG];
        bytes[..NONCE].copy_from_slice(&nonce);
        bytes[NONCE..].copy_from_slice(&tag(&self.current, None, server, &nonce));
        Ticket::encode(server, bytes)
    }

    /// Which secret signed `ticket` for the balancer `[balancer]`, if either did. The tags
    /// are compared in constant time: how long a refusal takes says nothing of how close a
    /// guess came.
    pub fn check(&self, balancer: &'static str, ticket: &Ticket) -> Signed {
        if let Some(signed) = Verified::recall(self.id, balancer, ticket) {
            return signed;
        }
        let signed = self.compute(balancer, ticket);
        if signed != Signed::Neither {
            Verified::remember(self.id, balancer, ticket, signed);
        }
        signed
    }

    /// [`CookieKeys::check`] without the memory of tickets verified before.
    fn compute(&self, balancer: &str, ticket: &Ticket) -> Signed {
        let Some(bytes) = ticket.decode() else {
            return Signed::Neither;
        };
        let (nonce, given) = bytes.split_at(NONCE);
        let by = |key: &hmac::Key, balancer: Option<&str>| {
            let expected = tag(key, balancer, ticket.server, nonce);
            constant_time::verify_slices_are_equal(&expected, given).is_ok()
        };
        let by_either = |balancer: Option<&str>| {
            by(&self.current, balancer) || self.previous.as_ref().is_some_and(|p| by(p, balancer))
        };
        if by(&self.current, Some(balancer)) {
            Signed::Current
        } else if self
            .previous
            .as_ref()
            .is_some_and(|p| by(p, Some(balancer)))
        {
            Signed::Previous
        } else if self.bound_since_wall_ms.is_some() && by_either(None) {
            Signed::Unbound
        } else {
            Signed::Neither
        }
    }

    /// True when the current or the previous secret signed `ticket` for `[balancer]`.
    pub fn verify(&self, balancer: &'static str, ticket: &Ticket) -> bool {
        matches!(
            self.check(balancer, ticket),
            Signed::Current | Signed::Previous
        )
    }

    /// True when `ticket`, which does not verify for the balancer asking, was issued by one
    /// of `others` (the file's other HTTP balancers): a value no window may honour, since it
    /// names another balancer's server. Only asked in the window for unsigned cookies, so a
    /// forged cookie costs these MACs only then.
    pub fn bound_elsewhere<'a>(
        &self,
        mut others: impl Iterator<Item = &'a str>,
        ticket: &Ticket,
    ) -> bool {
        others.any(|balancer| {
            matches!(
                self.compute(balancer, ticket),
                Signed::Current | Signed::Previous
            )
        })
    }

    /// `ticket` signed again for `[balancer]` with the current secret, its server and nonce
    /// kept: what a cookie signed with the previous secret (or of the earlier form) becomes at
    /// its next request, so that once a `SESSION_TIMEOUT` has passed every live session
    /// carries the current one, bound.
    pub fn renew(&self, balancer: &str, ticket: &Ticket) -> Ticket {
        let nonce = ticket.decode().map_or([0; NONCE], |bytes| {
            let mut nonce = [0u8; NONCE];
            nonce.copy_from_slice(&bytes[..NONCE]);
            nonce
        });
        self.sign(balancer, ticket.server, nonce)
    }

    /// True while a cookie that does not verify may still be honoured (once per request,
    /// when its server takes new clients, re-issued signed): for one `session_timeout` after
    /// the first start that signed cookies, so the sessions of the version before survive the
    /// upgrade. Those sessions cannot be older: idle longer, they had ended anyway.
    pub fn honours_unsigned(&self, now_wall_ms: u64, session_timeout: Duration) -> bool {
        within(self.signed_since_wall_ms, now_wall_ms, session_timeout)
    }

    /// True while a cookie of the earlier form, bound to no balancer ([`Signed::Unbound`]),
    /// is honoured: for one `session_timeout` after the first start that bound cookies, so
    /// the sessions of the build before survive the upgrade; then only bound cookies count.
    pub fn honours_unbound(&self, now_wall_ms: u64, session_timeout: Duration) -> bool {
        within(self.bound_since_wall_ms, now_wall_ms, session_timeout)
    }

    /// A new secret from the system's random source (256 bits as 43 base64url characters):
    /// what the broker keeps in `<state>.secret` when `SESSION_SECRET` is not set.
    pub fn generate_secret() -> Passphrase {
        let bytes: [u8; SECRET_BYTES] = random_bytes();
        let mut text = String::with_capacity(SECRET_BYTES * 4 / 3 + 1);
        for chunk in bytes.chunks(3) {
            let mut group = [0u8; 3];
            group[..chunk.len()].copy_from_slice(chunk);
            let bits = u32::from_be_bytes([0, group[0], group[1], group[2]]);
            for i in 0..=chunk.len() {
                text.push(char::from(ALPHABET[((bits >> (18 - 6 * i)) & 63) as usize]));
            }
        }
        Passphrase::new(text)
    }
}

/// Tickets a thread verified lately, each with the keys that verified it and which secret
/// signed it: a browser sends the same cookie with each request, and its HMAC (a large share of
/// a proxied request's instructions: docs/benchmarks.md) need not be computed every time. A
/// fixed table per thread, a ticket's slot chosen by its random characters (an attacker choosing
/// them only evicts); only a ticket that verified is kept, under keys of that very instance
/// (a reload makes new keys, which find nothing kept) and for the balancer it verified for
/// (a ticket of one balancer is no session of another, whatever a thread recalls), and it is
/// matched in constant time, as a tag is.
struct Verified;

/// Slots of a thread's table: 64 sessions' cookies in turn on one worker (about 2 KB).
const REMEMBERED: usize = 64;

/// One ticket remembered: the keys that verified it, the balancer it verified for, and
/// which secret signed it.
type Remembered = (u64, &'static str, Ticket, Signed);

thread_local! {
    static VERIFIED: std::cell::RefCell<[Option<Remembered>; REMEMBERED]> =
        const { std::cell::RefCell::new([None; REMEMBERED]) };
}

impl Verified {
    fn slot(ticket: &Ticket) -> usize {
        // The first characters carry the nonce's first bits: random for a ticket the broker
        // issued.
        (usize::from(ticket.random[0]) ^ (usize::from(ticket.random[1]) << 3)) % REMEMBERED
    }

    /// Which secret signed `ticket`, when keys `keys` verified this very ticket for
    /// `[balancer]` lately.
    fn recall(keys: u64, balancer: &str, ticket: &Ticket) -> Option<Signed> {
        let slot = Verified::slot(ticket);
        VERIFIED
            .try_with(|table| {
                let (id, kept_for, kept, signed) = table.borrow()[slot]?;
                let same = id == keys
                    && kept_for == balancer
                    && kept.server == ticket.server
                    && constant_time::verify_slices_are_equal(&kept.random, &ticket.random).is_ok();
                same.then_some(signed)
            })
            .ok()
            .flatten()
    }

    fn remember(keys: u64, balancer: &'static str, ticket: &Ticket, signed: Signed) {
        let slot = Verified::slot(ticket);
        let kept = Some((keys, balancer, *ticket, signed));
        let _ = VERIFIED.try_with(|table| table.borrow_mut()[slot] = kept);
    }
}

/// True while `since` (wall ms, `None`: never) is less than `timeout` before `now`.
fn within(since: Option<u64>, now_wall_ms: u64, timeout: Duration) -> bool {
    since.is_some_and(|since| now_wall_ms.saturating_sub(since) < timeout.as_millis() as u64)
}

/// The first [`TAG`] bytes of HMAC-SHA256 under `key` over the label, the balancer's section
/// name and a NUL (which no name holds, so no two names and ids run together), the id and the
/// nonce; without a balancer, the earlier form's: its own label, the id and the nonce.
fn tag(key: &hmac::Key, balancer: Option<&str>, server: ServerId, nonce: &[u8]) -> [u8; TAG] {
    let mut context = hmac::Context::with_key(key);
    match balancer {
        Some(balancer) => {
            context.update(LABEL);
            context.update(balancer.as_bytes());
            context.update(b"\0");
        }
        None => context.update(UNBOUND_LABEL),
    }
    context.update(server.as_str().as_bytes());
    context.update(nonce);
    let full = context.sign();
    let mut tag = [0u8; TAG];
    tag.copy_from_slice(&full.as_ref()[..TAG]);
    tag
}

/// `N` bytes from aws-lc's generator (seeded from the operating system's source, the one
/// rustls uses for TLS).
fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    if aws_lc_rs::rand::fill(&mut bytes).is_err() {
        // aws-lc aborts rather than return an error on Linux; should it return one, the
        // standard library's hasher keys (random per process, from the OS) and a counter
        // still give distinct nonces. Secrets are never made this way in practice.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        for chunk in bytes.chunks_mut(8) {
            use std::hash::{BuildHasher, Hasher};
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(COUNTER.fetch_add(1, Relaxed));
            let value = hasher.finish().to_be_bytes();
            chunk.copy_from_slice(&value[..chunk.len()]);
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> ServerId {
        ServerId::parse(text).expect("an id")
    }

    fn keys(secret: &str) -> CookieKeys {
        CookieKeys::new(secret.as_bytes(), None, None)
    }

    const SECRET: &str = "a session secret of at least 32 chars";

    /// The balancer the tests' values are for.
    const HTTP: &str = "BALANCE_HTTP";

    #[test]
    fn a_value_matches_hmac_sha256_as_openssl_computes_it() {
        // printf 'appbroker TOTVS_BROKER_SH_001 v2\0BALANCE_HTTP\0%s' "01BenchFix" |
        //   openssl dgst -sha256 -hmac 'a session secret of at least 32 chars' -binary |
        //   head -c 8: the tag; then base64url of "BenchFix" + tag, without padding.
        let t = keys(SECRET).sign(HTTP, id("01"), *b"BenchFix");
        assert_eq!(t.to_string(), EXPECTED);
        assert_eq!(Ticket::parse(EXPECTED.as_bytes()), Some(t));
        // The earlier form: printf 'appbroker TOTVS_BROKER_SH_001 v1\0%s' "01BenchFix" | ...
        let old = keys(SECRET).sign_unbound(id("01"), *b"BenchFix");
        assert_eq!(old.to_string(), EXPECTED_UNBOUND);
    }

    /// Computed with openssl (see the test above).
    const EXPECTED: &str = "01.QmVuY2hGaXgOI9NH9fTT_Q";
    const EXPECTED_UNBOUND: &str = "01.QmVuY2hGaXgITL_cGggwrg";

    #[test]
    fn a_value_is_bound_to_its_balancer_and_the_earlier_form_verifies_only_in_its_window() {
        let k = keys(SECRET);
        let public = k.sign("BALANCE_HTTP_PUBLIC", id("02"), *b"nonce-02");
        assert_eq!(k.check("BALANCE_HTTP_PUBLIC", &public), Signed::Current);
        // Recalled on this thread for PUBLIC: still no session of INTERNAL's 02.
        assert_eq!(k.check("BALANCE_HTTP_INTERNAL", &public), Signed::Neither);
        assert!(k.bound_elsewhere(["BALANCE_HTTP", "BALANCE_HTTP_PUBLIC"].into_iter(), &public));
        assert!(!k.bound_elsewhere(["BALANCE_HTTP"].into_iter(), &public));
        // The earlier form, unbound: nothing without a window, Unbound with one.
        let old = k.sign_unbound(id("02"), *b"nonce-02");
        assert_eq!(k.check("BALANCE_HTTP_INTERNAL", &old), Signed::Neither);
        let windowed = keys(SECRET).with_unbound_window(Some(1_000_000));
        assert_eq!(
            windowed.check("BALANCE_HTTP_INTERNAL", &old),
            Signed::Unbound
        );
        assert!(!windowed.verify("BALANCE_HTTP_INTERNAL", &old));
        let renewed = windowed.renew("BALANCE_HTTP_INTERNAL", &old);
        assert_eq!(
            windowed.check("BALANCE_HTTP_INTERNAL", &renewed),
            Signed::Current
        );
        // No bound value verifies as the earlier form, nor the other way round.
        assert_ne!(old, k.sign("", id("02"), *b"nonce-02"));
        let minute = Duration::from_secs(60);
        assert!(windowed.honours_unbound(1_059_999, minute));
        assert!(!windowed.honours_unbound(1_060_000, minute));
        assert!(!k.honours_unbound(0, minute), "no window known");
    }

    #[test]
    fn a_ticket_verified_is_remembered_for_its_keys_only() {
        let k = keys(SECRET);
        let t = k.sign(HTTP, id("01"), *b"Remember");
        assert_eq!(Verified::recall(k.id, HTTP, &t), None);
        assert_eq!(k.check(HTTP, &t), Signed::Current);
        assert_eq!(Verified::recall(k.id, HTTP, &t), Some(Signed::Current));
        assert_eq!(k.check(HTTP, &t), Signed::Current, "recalled");
        // For another balancer, nothing is recalled (and it does not verify there).
        assert_eq!(Verified::recall(k.id, "BALANCE_HTTP_2", &t), None);
        // Other keys, even of the same secret, find nothing kept; another secret's refuse it.
        assert_eq!(Verified::recall(keys(SECRET).id, HTTP, &t), None);
        assert_eq!(
            keys("another secret of at least 32 chars").check(HTTP, &t),
            Signed::Neither
        );
        // The same nonce with another tag falls in the same slot and is not taken for it.
        let mut forged = t;
        forged.random[RANDOM - 2] = if forged.random[RANDOM - 2] == b'A' {
            b'B'
        } else {
            b'A'
        };
        assert_eq!(Verified::slot(&forged), Verified::slot(&t));
        assert_eq!(k.check(HTTP, &forged), Signed::Neither);
        // A forged ticket is not kept: the one verified still is.
        assert_eq!(Verified::recall(k.id, HTTP, &t), Some(Signed::Current));
    }

    #[test]
    fn the_alphabet_test_agrees_with_the_alphabet() {
        for c in 0..=u8::MAX {
            assert_eq!(in_alphabet(c), ALPHABET.contains(&c), "byte {c}");
        }
    }

    #[test]
    fn issued_values_verify_and_differ() {
        let k = keys(SECRET);
        let (a, b) = (k.issue(HTTP, id("01")), k.issue(HTTP, id("01")));
        assert_ne!(a, b, "fresh nonces");
        for t in [a, b] {
            let text = t.to_string();
            assert_eq!(text.len(), 2 + 1 + RANDOM);
            assert!(text.starts_with("01."));
            assert!(k.verify(HTTP, &Ticket::parse(text.as_bytes()).expect("parses")));
        }
    }

    #[test]
    fn a_value_with_another_id_nonce_secret_or_spare_bits_does_not_verify() {
        let k = keys(SECRET);
        let t = k.sign(HTTP, id("01"), *b"12345678");
        assert!(k.verify(HTTP, &t));
        // The same characters naming another server.
        let text = t.to_string().replacen("01.", "02.", 1);
        assert!(!k.verify(HTTP, &Ticket::parse(text.as_bytes()).expect("parses")));
        // Any one character changed.
        let original = t.to_string();
        for at in 3..original.len() {
            for c in [b'A', b'z', b'-'] {
                let mut bytes = original.clone().into_bytes();
                if bytes[at] == c {
                    continue;
                }
                bytes[at] = c;
                let other = Ticket::parse(&bytes).expect("parses");
                assert!(
                    !k.verify(HTTP, &other),
                    "{}",
                    String::from_utf8_lossy(&bytes)
                );
            }
        }
        assert!(!keys("another secret, just as long as it").verify(HTTP, &t));
        // Old-style values (22 random characters) almost never verify.
        let forged = Ticket::parse(b"01.q3VdAbCdEfGhIjKlMnOpQr").expect("parses");
        assert!(!k.verify(HTTP, &forged));
    }

    #[test]
    fn the_previous_secret_verifies_but_does_not_sign() {
        let old = keys("the secret before the rotation, 32+");
        let t = old.sign(HTTP, id("07"), *b"nonce-07");
        let rotated = CookieKeys::new(
            SECRET.as_bytes(),
            Some(b"the secret before the rotation, 32+"),
            None,
        );
        assert_eq!(rotated.check(HTTP, &t), Signed::Previous);
        let new = rotated.issue(HTTP, id("07"));
        assert!(
            !old.verify(HTTP, &new)
                && rotated.verify(HTTP, &new)
                && keys(SECRET).verify(HTTP, &new)
        );
        // Renewed: the same server and nonce, signed with the current secret.
        let renewed = rotated.renew(HTTP, &t);
        assert_eq!(rotated.check(HTTP, &renewed), Signed::Current);
        assert_eq!(renewed, keys(SECRET).sign(HTTP, id("07"), *b"nonce-07"));
    }

    #[test]
    fn anything_else_is_no_value() {
        let good = "01.q3VdAbCdEfGhIjKlMnOpQr";
        assert!(Ticket::parse(good.as_bytes()).is_some());
        for bad in [
            &b""[..],
            b"01",
            b"01.",
            b"1.q3VdAbCdEfGhIjKlMnOpQr",
            b"001.q3VdAbCdEfGhIjKlMnOpQr",
            b"01.q3VdAbCdEfGhIjKlMnOpQ",
            b"01.q3VdAbCdEfGhIjKlMnOpQrs",
            b"01.q3VdAbCdEfGhIjKlMnOp+/",
            "0é.q3VdAbCdEfGhIjKlMnOpQr".as_bytes(),
            "01.q3VdAbCdEfGhIjKlMnOpQé".as_bytes(),
            b"01.q3VdAbCdEfGhIjKlMnOpQ\xe3",
            b"\xff\xfe.q3VdAbCdEfGhIjKlMnOpQr",
        ] {
            assert_eq!(Ticket::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_upgrade_window_lasts_one_session_timeout_from_the_first_signed_start() {
        let minute = Duration::from_secs(60);
        let k = CookieKeys::new(SECRET.as_bytes(), None, Some(1_000_000));
        assert!(k.honours_unsigned(1_000_000, minute));
        assert!(k.honours_unsigned(1_059_999, minute));
        assert!(!k.honours_unsigned(1_060_000, minute));
        assert!(!keys(SECRET).honours_unsigned(0, minute), "no window known");
    }

    #[test]
    fn a_generated_secret_is_43_base64url_characters_and_new_each_time() {
        let (a, b) = (CookieKeys::generate_secret(), CookieKeys::generate_secret());
        assert_eq!(a.expose().len(), 43);
        assert!(a.expose().iter().all(|c| ALPHABET.contains(c)));
        assert_ne!(a, b);
    }

    #[test]
    fn set_cookie_is_the_documented_line() {
        let t = Ticket::encode(id("01"), [0; 16]);
        assert_eq!(
            t.set_cookie(false),
            "TOTVS_BROKER_SH_001=01.AAAAAAAAAAAAAAAAAAAAAA; Path=/; HttpOnly; SameSite=Lax"
        );
        assert!(t.set_cookie(true).ends_with("; SameSite=Lax; Secure"));
    }
}
