//! Which secret signs the session cookies: `SESSION_SECRET` when set (the same on
//! both brokers of a pair), else the broker's own, kept in `<state>.secret` so that a restart
//! keeps every session (or made for this run only, with `STATE_FILE=0`);
//! `SESSION_SECRET_PREVIOUS` verifies too, for a rotation. A reload may change either: the
//! keys are swapped whole, and a request reads them with one atomic load. Reading and writing
//! the file is `admin`'s; this is what the broker does with its content.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use super::ticket::CookieKeys;
use crate::config::General;
use crate::tls::files::Passphrase;

/// The broker's own secret, which signs cookies while `SESSION_SECRET` is not set.
#[derive(Debug, Clone)]
pub struct OwnSecret {
    /// The secret (43 base64url characters when generated).
    pub secret: Passphrase,
    /// Where it is kept.
    pub kept: Kept,
    /// Wall ms of the first start that signed cookies (the file's birth), which opens the
    /// window for the unsigned cookies of the version before; `None` when nothing remembers
    /// it, or when that start was a first install (no window).
    pub since_wall_ms: Option<u64>,
    /// Wall ms of the first start that bound cookies to their balancer, which opens the
    /// window for cookies of the earlier form; `None` when nothing remembers it, or when no
    /// cookie of that form can exist (no window).
    pub bound_since_wall_ms: Option<u64>,
}

/// Where the broker's own secret is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// Read from this file, written by an earlier start.
    Read(PathBuf),
    /// Generated at this start and written to this file.
    Created(PathBuf),
    /// Generated for this run only, for this reason (`STATE_FILE=0`, a file that cannot be
    /// written...): sessions move at the next start unless `SESSION_SECRET` is set.
    Nowhere(String),
}

impl OwnSecret {
    /// A secret generated for this run only, for `why`; no upgrade window.
    pub fn for_this_run(why: impl Into<String>) -> OwnSecret {
        OwnSecret {
            secret: CookieKeys::generate_secret(),
            kept: Kept::Nowhere(why.into()),
            since_wall_ms: None,
            bound_since_wall_ms: None,
        }
    }
}

/// The secrets of a running broker: its own, and the keys in force (from the configuration's
/// `[General]`, falling back to its own).
#[derive(Debug)]
pub struct SessionSecrets {
    own: OwnSecret,
    keys: ArcSwap<CookieKeys>,
}

/// What the start's line says, and how loud.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// True when it is a warning: sessions will move at the next start.
    pub warn: bool,
    /// The line.
    pub line: String,
}

impl SessionSecrets {
    /// The secrets for `general`, with `own` as the fallback.
    pub fn new(own: OwnSecret, general: &General) -> SessionSecrets {
        let keys = ArcSwap::from_pointee(keys_for(&own, general));
        SessionSecrets { own, keys }
    }

    /// The keys in force now.
    pub fn keys(&self) -> Guard<Arc<CookieKeys>> {
        self.keys.load()
    }

    /// The secret in force for `general`: `SESSION_SECRET`, else the broker's own; what the
    /// page of actions signs its tokens with, under a label of its own.
    pub fn in_force(&self, general: &General) -> Passphrase {
        general
            .session_secret
            .clone()
            .unwrap_or_else(|| self.own.secret.clone())
    }

    /// A reload's `[General]`: the keys it names (or the broker's own) from now on.
    pub fn configure(&self, general: &General) {
        self.keys.store(Arc::new(keys_for(&self.own, general)));
    }

    /// The start's line: which secret signs cookies, and what that means for a restart and a
    /// pair.
    pub fn describe(&self, general: &General) -> Described {
        let previous = if general.session_secret_previous.is_some() {
            "; cookies signed with SESSION_SECRET_PREVIOUS count too"
        } else {
            ""
        };
        let pair = "(a pair of brokers needs the same SESSION_SECRET on both)";
        let (warn, what) = match (&general.session_secret, &self.own.kept) {
            (Some(_), _) => (false, "SESSION_SECRET".to_string()),
            (None, Kept::Read(path)) => (
                false,
                format!("the secret kept in {} {pair}", path.display()),
            ),
            (None, Kept::Created(path)) => (
                false,
                format!(
                    "a secret generated now and kept in {} {pair}",
                    path.display()
                ),
            ),
            (None, Kept::Nowhere(why)) => (
                true,
                format!(
                    "a secret generated for this run only ({why}): every HTTP session may move \
                     to another server when appbroker starts again; set SESSION_SECRET to keep \
                     them"
                ),
            ),
        };
        Described {
            warn,
            line: format!("session cookies are signed with {what}{previous}"),
        }
    }

    /// When the upgrade window for unsigned cookies opened, wall ms (see
    /// [`CookieKeys::honours_unsigned`]).
    pub fn since_wall_ms(&self) -> Option<u64> {
        self.own.since_wall_ms
    }

    /// When the upgrade window for cookies of the earlier form opened, wall ms (see
    /// [`CookieKeys::honours_unbound`]).
    pub fn bound_since_wall_ms(&self) -> Option<u64> {
        self.own.bound_since_wall_ms
    }
}

/// The keys `general` names, falling back to `own`.
fn keys_for(own: &OwnSecret, general: &General) -> CookieKeys {
    let current = general.session_secret.as_ref().unwrap_or(&own.secret);
    CookieKeys::new(
        current.expose(),
        general
            .session_secret_previous
            .as_ref()
            .map(Passphrase::expose),
        own.since_wall_ms,
    )
    .with_unbound_window(own.bound_since_wall_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerId;

    fn general(current: Option<&str>, previous: Option<&str>) -> General {
        General {
            session_secret: current.map(Passphrase::new),
            session_secret_previous: previous.map(Passphrase::new),
            ..General::defaults()
        }
    }

    const A: &str = "secret A, at least thirty-two characters";
    const HTTP: &str = "BALANCE_HTTP";
    const B: &str = "secret B, at least thirty-two characters";

    #[test]
    fn the_key_wins_over_the_own_secret_and_a_reload_swaps_them() {
        let id = ServerId::parse("01").expect("an id");
        let own = OwnSecret::for_this_run("a test");
        let secrets = SessionSecrets::new(own.clone(), &general(None, None));
        let by_own = secrets.keys().issue(HTTP, id);
        secrets.configure(&general(Some(A), None));
        let by_a = secrets.keys().issue(HTTP, id);
        assert!(
            !secrets.keys().verify(HTTP, &by_own),
            "the own secret no longer counts"
        );
        // Rotation: B signs, A still verifies.
        secrets.configure(&general(Some(B), Some(A)));
        assert!(secrets.keys().verify(HTTP, &by_a));
        let by_b = secrets.keys().issue(HTTP, id);
        secrets.configure(&general(None, None));
        assert!(secrets.keys().verify(HTTP, &by_own) && !secrets.keys().verify(HTTP, &by_b));
    }

    #[test]
    fn the_line_says_where_the_secret_comes_from() {
        let path = PathBuf::from("/var/lib/appbroker/appserver.state.secret");
        let own = |kept| OwnSecret {
            kept,
            ..OwnSecret::for_this_run("")
        };
        let line =
            |kept, general: &General| SessionSecrets::new(own(kept), general).describe(general);
        let set = line(Kept::Read(path.clone()), &general(Some(A), Some(B)));
        assert!(!set.warn);
        assert_eq!(
            set.line,
            "session cookies are signed with SESSION_SECRET; cookies signed with \
             SESSION_SECRET_PREVIOUS count too"
        );
        assert!(!set.line.contains(A) && !set.line.contains(B));
        let read = line(Kept::Read(path.clone()), &general(None, None));
        assert!(
            read.line
                .contains("the secret kept in /var/lib/appbroker/appserver.state.secret")
        );
        let created = line(Kept::Created(path), &general(None, None));
        assert!(created.line.contains("a secret generated now and kept in"));
        let nowhere = line(Kept::Nowhere("STATE_FILE=0".into()), &general(None, None));
        assert!(nowhere.warn && nowhere.line.contains("this run only (STATE_FILE=0)"));
    }
}
