//! The anti-forgery token every action carries: the page a signed-in user gets puts it in its
//! forms, and an action without it (a form on another site posting with the browser's Basic
//! credentials) is refused. It is the user's name and an expiry an hour away, signed with
//! HMAC-SHA256 under a key made from the session secret in force (`SESSION_SECRET`, or the
//! broker's own) and a label of its own, so it is no session cookie's signature, and a pair's
//! brokers sharing `SESSION_SECRET` take each other's after a failover. Reusable until it
//! expires: the page has no JavaScript to fetch a new one for each form.

use std::time::Duration;

use aws_lc_rs::{constant_time, hmac};

use crate::tls::files::Passphrase;

/// The label the token's key is made under: no other use of the secret signs with it.
const LABEL: &[u8] = b"appbroker ADMIN anti-forgery token v1";

/// How long a token is good for: a page left open over lunch still acts; a leaked one soon
/// stops.
pub(super) const LIFE: Duration = Duration::from_secs(3600);

/// The bytes of the signature kept in a token: 128 bits.
const KEPT: usize = 16;

/// The token's key, made from `secret` under [`LABEL`].
fn key(secret: &Passphrase) -> hmac::Key {
    let root = hmac::Key::new(hmac::HMAC_SHA256, secret.expose());
    hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&root, LABEL).as_ref())
}

/// The signature of `user`'s token expiring at `expires` (seconds since the Unix epoch).
fn signature(secret: &Passphrase, user: &str, expires: u64) -> Vec<u8> {
    let mut message = Vec::with_capacity(user.len() + 24);
    message.extend_from_slice(user.as_bytes());
    message.push(0);
    message.extend_from_slice(expires.to_string().as_bytes());
    hmac::sign(&key(secret), &message).as_ref()[..KEPT].to_vec()
}

/// A token for `user`, made at `now` (seconds since the Unix epoch): `<expiry>.<hex>`.
pub(super) fn issue(secret: &Passphrase, user: &str, now: u64) -> String {
    let expires = now + LIFE.as_secs();
    let hex: String = signature(secret, user, expires)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{expires}.{hex}")
}

/// Whether `token` is `user`'s and has not expired at `now`.
pub(super) fn holds(secret: &Passphrase, user: &str, token: &str, now: u64) -> bool {
    let Some((expires, hex)) = token.split_once('.') else {
        return false;
    };
    let Ok(expires) = expires.parse::<u64>() else {
        return false;
    };
    if expires <= now || expires > now + LIFE.as_secs() || hex.len() != KEPT * 2 {
        return false;
    }
    let given: Option<Vec<u8>> = (0..KEPT)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    let Some(given) = given else {
        return false;
    };
    constant_time::verify_slices_are_equal(&given, &signature(secret, user, expires)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_its_users_for_an_hour_and_under_its_secret() {
        let secret = Passphrase::new("a secret of thirty-two characters!");
        let other = Passphrase::new("another secret of thirty-two chars");
        let token = issue(&secret, "ana", 1_000);
        assert!(holds(&secret, "ana", &token, 1_000));
        assert!(holds(&secret, "ana", &token, 1_000 + 3_599));
        assert!(!holds(&secret, "ana", &token, 1_000 + 3_600), "expired");
        assert!(!holds(&secret, "bob", &token, 1_000), "another user's");
        assert!(!holds(&other, "ana", &token, 1_000), "another secret's");
        let far = issue(&secret, "ana", 90_000);
        assert!(!holds(&secret, "ana", &far, 1_000), "from the future");
        for bad in ["", "1", "x.y", "4600.zz", &token[..token.len() - 1]] {
            assert!(!holds(&secret, "ana", bad, 1_000), "{bad}");
        }
    }
}
