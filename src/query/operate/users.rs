//! Who may sign in: the htpasswd file `ADMIN_USERS` names (Apache's format, bcrypt entries
//! only: `htpasswd -B -c FILE user`), read at start and at every reload, and a request's
//! `Authorization: Basic` (RFC 7617) checked against it. bcrypt is slow on purpose (tens of
//! milliseconds and more), so it runs on tokio's blocking pool, a few at once, never on a
//! worker thread; a user the file does not name is checked against the file's costliest hash,
//! its answer thrown away, so a wrong user costs at least what a wrong password does (one
//! verification of a real hash's cost, the highest) and the answer's time tells no name.
//! A credential verified is remembered ([`KnownCredentials`]): browsers send it with every request and
//! the page refreshes itself.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lc_rs::hmac;
use tokio::sync::Semaphore;

/// The largest users file read: a line is about 80 bytes, so thousands of users.
const MAX_FILE: u64 = 1024 * 1024;

/// Verifications running at once on the blocking pool: each holds a thread for a bcrypt's
/// time, and sign-ins are a person's, a few a minute; more wait for their turn.
pub(super) const VERIFYING_AT_ONCE: usize = 4;

/// The longest a sign-in waits for one of the [`VERIFYING_AT_ONCE`] turns: past it, it is
/// answered busy, unchecked, rather than wait behind a queue without end.
pub(super) const MOST_TURN_WAIT: Duration = Duration::from_secs(5);

/// Sign-ins waiting at once, for their throttled turn or for a verification's turn, all
/// addresses together: past it an attempt is answered busy at once, so what waits (tasks,
/// memory) stays bounded whatever many addresses send. A credential already verified never
/// waits here.
pub(super) const SIGNING_IN_AT_ONCE: usize = 64;

/// Sign-ins waiting at once from addresses users signed in from lately
/// (`SignInThrottle::signed_in_from`), apart from [`SIGNING_IN_AT_ONCE`] and verified one at a
/// time on a turn of their own: a flood, which has no password, cannot take them, so a user
/// at their usual desk still signs in during one.
pub(super) const KEPT_SIGNING_IN_AT_ONCE: usize = 16;

/// Credentials remembered once verified: a team's browsers, with room to spare; past it the
/// oldest is forgotten (and verified again at its next request).
const REMEMBERED: usize = 256;

/// The longest `Authorization` value looked at: a user and password of a few hundred bytes.
const MAX_HEADER: usize = 1024;

/// The users of `ADMIN_USERS`, as read.
#[derive(Debug)]
pub struct Users {
    /// The file.
    pub path: PathBuf,
    /// Each user's bcrypt hash.
    hashes: HashMap<String, String>,
    /// The hash a user the file does not name is checked against: the costliest entry's
    /// (the first of them), whose answer is thrown away, so a wrong user costs a verification
    /// of a real hash's cost, and never less than a named user's: when the entries' costs
    /// differ, a quicker answer would tell the name was not there.
    dummy: String,
    /// bcrypt verifications run (a hash they could use, a wrong user's included): what the
    /// tests count, as time would be too noisy to tell one from two.
    verifications: AtomicU64,
}

/// Why the users file cannot be used, in words for `--check` and the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ADMIN_USERS {path}: {why}")]
pub struct UsersError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it, and what to do.
    pub why: String,
}

/// What makes a users file, said wherever one is refused.
const MAKE_ONE: &str = "make one with `htpasswd -B -c FILE user` (apache2-utils), and add users with `htpasswd -B FILE user`";

impl Users {
    /// Reads the htpasswd file at `path`: `user:hash` lines of bcrypt hashes (`$2y$`, `$2b$`,
    /// `$2a$`), blank lines and `#` comments aside. Another format (MD5, SHA-1, crypt, plain
    /// text) is refused, naming its line and the command that makes a good one.
    pub fn read(path: &Path) -> Result<Users, UsersError> {
        let error = |why: String| UsersError {
            path: path.to_path_buf(),
            why,
        };
        let meta =
            std::fs::metadata(path).map_err(|e| error(crate::support::os_error::words(&e)))?;
        if meta.len() > MAX_FILE {
            return Err(error(format!(
                "larger than {} KiB; is it an htpasswd file?",
                MAX_FILE / 1024
            )));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| error(crate::support::os_error::words(&e)))?;
        let mut hashes = HashMap::new();
        let mut costliest: Option<(u32, String)> = None;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (user, hash) = line
                .split_once(':')
                .ok_or_else(|| error(format!("line {} is not `user:hash`; {MAKE_ONE}", n + 1)))?;
            let Some(cost) = bcrypt_cost(hash) else {
                return Err(error(format!(
                    "line {} (user {user}) is not a bcrypt entry; only bcrypt is accepted: {MAKE_ONE}",
                    n + 1
                )));
            };
            if costliest.as_ref().is_none_or(|(most, _)| cost > *most) {
                costliest = Some((cost, hash.to_string()));
            }
            hashes.insert(user.to_string(), hash.to_string());
        }
        let Some((_, dummy)) = costliest else {
            return Err(error(format!("names no user; {MAKE_ONE}")));
        };
        Ok(Users {
            path: path.to_path_buf(),
            hashes,
            dummy,
            verifications: AtomicU64::new(0),
        })
    }

    /// Whether `password` is `user`'s: bcrypt, on the current thread (call it on the blocking
    /// pool). A user the file does not name costs a verification all the same, against the
    /// dummy hash, whatever its answer.
    fn verify(&self, user: &str, password: &str) -> bool {
        let known = self.hashes.get(user);
        let ran = bcrypt::verify(password, known.unwrap_or(&self.dummy));
        if ran.is_ok() {
            self.verifications.fetch_add(1, Relaxed);
        }
        known.is_some() && ran.unwrap_or(false)
    }
}

/// The cost of a bcrypt hash (`$2y$10$...`), or `None` when it is none.
fn bcrypt_cost(hash: &str) -> Option<u32> {
    let rest = ["$2y$", "$2b$", "$2a$"]
        .iter()
        .find_map(|prefix| hash.strip_prefix(prefix))?;
    let (cost, salted) = rest.split_once('$')?;
    let cost: u32 = cost.parse().ok()?;
    ((4..=31).contains(&cost) && salted.len() == 53).then_some(cost)
}

/// A request's `Authorization: Basic` credentials: the user and the password, or `None` when
/// the header is no Basic credential (malformed, too long, not UTF-8).
pub(super) fn basic(header: &[u8]) -> Option<(String, String)> {
    if header.len() > MAX_HEADER {
        return None;
    }
    let text = std::str::from_utf8(header).ok()?.trim();
    let (scheme, encoded) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64_decode(encoded.trim())?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// Standard base64 (with or without padding) to bytes; `None` on any other character.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let take = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        out.extend_from_slice(&n.to_be_bytes()[1..=take]);
    }
    Some(out)
}

/// Credentials verified, remembered by a keyed hash of their `Authorization` value (never the
/// value itself): bounded, the oldest forgotten first, emptied on reload.
#[derive(Debug)]
pub(super) struct KnownCredentials {
    /// The key of the hash: random, this process's own.
    key: hmac::Key,
    remembered: Mutex<CredentialTable>,
}

/// The credentials remembered, by the hash of their header: each one's user, and the hashes
/// oldest first.
type CredentialTable = (HashMap<[u8; 32], String>, VecDeque<[u8; 32]>);

impl KnownCredentials {
    pub(super) fn new() -> KnownCredentials {
        let mut key = [0u8; 32];
        // A failure leaves a zero key: the cache still works, its keys just guessable, and
        // they name nothing anyway but a hash.
        let _ = aws_lc_rs::rand::fill(&mut key);
        KnownCredentials {
            key: hmac::Key::new(hmac::HMAC_SHA256, &key),
            remembered: Mutex::default(),
        }
    }

    fn hash(&self, header: &[u8]) -> [u8; 32] {
        let tag = hmac::sign(&self.key, header);
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// The user whose `header` was verified, if it was.
    pub(super) fn user(&self, header: &[u8]) -> Option<String> {
        let hash = self.hash(header);
        let remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        remembered.0.get(&hash).cloned()
    }

    /// Remembers `header` as `user`'s.
    fn remember(&self, header: &[u8], user: &str) {
        let hash = self.hash(header);
        let mut guard = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *guard;
        if map.insert(hash, user.to_string()).is_none() {
            order.push_back(hash);
        }
        while order.len() > REMEMBERED {
            if let Some(oldest) = order.pop_front() {
                map.remove(&oldest);
            }
        }
    }

    /// Forgets every credential (a reload: the file may have changed).
    pub(super) fn forget(&self) {
        let mut guard = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        guard.0.clear();
        guard.1.clear();
    }
}

/// What checking a credential found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Checked {
    /// Good: its user.
    Good(String),
    /// Wrong, or no Basic credential.
    Wrong,
    /// Not checked: no verification's turn came within [`MOST_TURN_WAIT`].
    Busy,
}

/// Checks `header` against `users` on the blocking pool, one of [`VERIFYING_AT_ONCE`]
/// (`turns`, waited for at most [`MOST_TURN_WAIT`]); remembers it in `verified` when good.
pub(super) async fn check(
    users: &Arc<Users>,
    verified: &KnownCredentials,
    turns: &Semaphore,
    header: &[u8],
) -> Checked {
    let Some((user, password)) = basic(header) else {
        return Checked::Wrong;
    };
    let Ok(Ok(_turn)) = tokio::time::timeout(MOST_TURN_WAIT, turns.acquire()).await else {
        return Checked::Busy;
    };
    let file = Arc::clone(users);
    let name = user.clone();
    let good = tokio::task::spawn_blocking(move || file.verify(&name, &password))
        .await
        .unwrap_or(false);
    if !good {
        return Checked::Wrong;
    }
    verified.remember(header, &user);
    Checked::Good(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_read_and_anything_else_is_none() {
        // `ana:s3cret:x` (a colon in the password is the password's).
        assert_eq!(
            basic(b"Basic YW5hOnMzY3JldDp4"),
            Some(("ana".into(), "s3cret:x".into()))
        );
        assert_eq!(
            basic(b"basic YW5hOg=="),
            Some(("ana".into(), String::new()))
        );
        for bad in [
            &b"Bearer x"[..],
            b"Basic",
            b"Basic !!!!",
            b"Basic YW5h",
            b"\xff",
        ] {
            assert_eq!(basic(bad), None, "{bad:?}");
        }
        assert_eq!(basic(&[b'A'; 2000]), None);
    }

    #[test]
    fn only_bcrypt_entries_are_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("users");
        let hash = bcrypt::hash("right", 4).expect("hash");
        std::fs::write(&path, format!("# team\nana:{hash}\n\n")).expect("write");
        let users = Users::read(&path).expect("reads");
        assert!(users.verify("ana", "right"));
        assert!(!users.verify("ana", "wrong"));
        assert!(!users.verify("bob", "right"));
        for (text, says) in [
            ("ana:$apr1$abc$def\n", "not a bcrypt entry"),
            ("ana:{SHA}abc=\n", "not a bcrypt entry"),
            ("ana\n", "not `user:hash`"),
            ("# nobody\n", "names no user"),
        ] {
            std::fs::write(&path, text).expect("write");
            let error = Users::read(&path).expect_err(text).to_string();
            assert!(
                error.contains(says) && error.contains("htpasswd -B"),
                "{error}"
            );
        }
    }

    #[test]
    fn an_unknown_user_costs_one_verification_at_the_costliest_hashs_cost_as_a_wrong_password_does()
    {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("users");
        let (ana, bob) = (bcrypt::hash("right", 5), bcrypt::hash("other", 4));
        let (ana, bob) = (ana.expect("hash"), bob.expect("hash"));
        std::fs::write(&path, format!("ana:{ana}\nbob:{bob}\n")).expect("write");
        let users = Users::read(&path).expect("reads");
        let runs = |user: &str, password: &str| {
            let before = users.verifications.load(Relaxed);
            let good = users.verify(user, password);
            (good, users.verifications.load(Relaxed) - before)
        };
        assert_eq!(runs("ana", "wrong"), (false, 1), "a wrong password");
        assert_eq!(runs("nobody", "wrong"), (false, 1), "an unknown user");
        // The first entry's own password, under another name: still no one's.
        assert_eq!(runs("nobody", "right"), (false, 1));
        assert_eq!(runs("ana", "right"), (true, 1));
        // Checked against a hash bcrypt can use, of the highest cost among the entries.
        assert_eq!(bcrypt_cost(&users.dummy), Some(5));
        // Whatever the order of the lines.
        std::fs::write(&path, format!("bob:{bob}\nana:{ana}\n")).expect("write");
        let users = Users::read(&path).expect("reads");
        assert_eq!(bcrypt_cost(&users.dummy), Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sign_in_waits_for_a_verifications_turn_at_most_its_bound() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("users");
        let hash = bcrypt::hash("right", 4).expect("hash");
        std::fs::write(&path, format!("ana:{hash}\n")).expect("write");
        let users = Arc::new(Users::read(&path).expect("reads"));
        let verified = KnownCredentials::new();
        // Every turn taken, as by a queue of attempts ahead.
        let turns = Semaphore::new(VERIFYING_AT_ONCE);
        let _held = turns.acquire_many(VERIFYING_AT_ONCE as u32).await;
        let header = b"Basic YW5hOnJpZ2h0"; // ana:right
        let started = tokio::time::Instant::now();
        let checked = check(&users, &verified, &turns, header).await;
        assert_eq!(checked, Checked::Busy);
        assert_eq!(started.elapsed(), MOST_TURN_WAIT);
        assert_eq!(users.verifications.load(Relaxed), 0, "answered unchecked");
        drop(_held);
        let checked = check(&users, &verified, &turns, header).await;
        assert_eq!(checked, Checked::Good("ana".into()));
    }

    #[test]
    fn the_cache_is_bounded_and_forgets_on_reload() {
        let verified = KnownCredentials::new();
        for i in 0..(REMEMBERED + 10) {
            verified.remember(format!("Basic {i}").as_bytes(), "ana");
        }
        assert_eq!(verified.user(b"Basic 0"), None);
        assert_eq!(
            verified.user(format!("Basic {}", REMEMBERED + 9).as_bytes()),
            Some("ana".into())
        );
        verified.forget();
        assert_eq!(verified.user(b"Basic 300"), None);
    }
}
