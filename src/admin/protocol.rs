//! The control socket's protocol: one JSON request per line, one JSON answer per line. The
//! same types serve both ends (the broker and `appbroker ctl`), and docs/operations.md shows
//! them; `ctl show --json` prints the answer's objects as they come.

use serde::{Deserialize, Serialize};

use crate::balancer::rules::health::OperatorAsk;
use crate::balancer::rules::overrides::Overrides;

/// The longest request line the broker reads; anything longer is answered with an error and
/// the connection closed. Requests are a few hundred bytes; a reason of a few lines fits.
pub const MAX_REQUEST: usize = 16 * 1024;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Every balancer (or one section's) with its servers.
    Show {
        /// Only this section.
        #[serde(default)]
        section: Option<String>,
    },
    /// No new clients for the server; its connections stay.
    Disable {
        /// `BALANCE_SMART_CLIENT_DESKTOP` or `SMART_CLIENT_DESKTOP`, any case.
        section: String,
        /// `01`, or `10.0.0.1:1234`.
        server: String,
        /// Why, for logs and pages.
        #[serde(default)]
        reason: Option<String>,
    },
    /// As disable, named so while waiting for its connections to end.
    Drain {
        /// `BALANCE_SMART_CLIENT_DESKTOP` or `SMART_CLIENT_DESKTOP`, any case.
        section: String,
        /// `01`, or `10.0.0.1:1234`.
        server: String,
        /// Why, for logs and pages.
        #[serde(default)]
        reason: Option<String>,
    },
    /// Ends disable or drain.
    Enable {
        /// `BALANCE_SMART_CLIENT_DESKTOP` or `SMART_CLIENT_DESKTOP`, any case.
        section: String,
        /// `01`, or `10.0.0.1:1234`.
        server: String,
    },
    /// A weight for now (0-1000); `null` gives the file's back.
    Weight {
        /// `BALANCE_SMART_CLIENT_DESKTOP` or `SMART_CLIENT_DESKTOP`, any case.
        section: String,
        /// `01`, or `10.0.0.1:1234`.
        server: String,
        /// The weight.
        weight: Option<u32>,
    },
    /// Quarantine now, for `duration` (default `QUARANTINE_TIME`), until then or a release.
    Quarantine {
        /// `BALANCE_SMART_CLIENT_DESKTOP` or `SMART_CLIENT_DESKTOP`, any case.
        section: String,
        /// `01`, or `10.0.0.1:1234`.
        server: String,
        /// `30s`, `10m`, `500ms` or seconds.
        #[serde(default)]
        duration: Option<String>,
        /// Why, for logs, pages and `show`: shown instead of the server's last error, so a
        /// healthy server taken out on purpose does not read as failing.
        #[serde(default)]
        reason: Option<String>,
    },
    /// Ends a quarantine now, whoever started it.
    Release {
        /// `BALANCE_SMART_CLIENT_DESKTOP` or `SMART_CLIENT_DESKTOP`, any case.
        section: String,
        /// `01`, or `10.0.0.1:1234`.
        server: String,
    },
    /// Closes the server's open connections now.
    Cut {
        /// `BALANCE_SMART_CLIENT_DESKTOP` or `SMART_CLIENT_DESKTOP`, any case.
        section: String,
        /// `01`, or `10.0.0.1:1234`.
        server: String,
    },
    /// Answers when the server has no connection left, or when `timeout` (default 10
    /// minutes) is over, with the count left.
    Wait {
        /// `BALANCE_SMART_CLIENT_DESKTOP` or `SMART_CLIENT_DESKTOP`, any case.
        section: String,
        /// `01`, or `10.0.0.1:1234`.
        server: String,
        /// `30s`, `10m` or seconds.
        #[serde(default)]
        timeout: Option<String>,
    },
    /// Runs `RESTART_COMMAND` for the server now, answering when it ends; within the
    /// restarts' bounds, `RESTART_COOLDOWN` included unless `force`.
    Restart {
        /// `BALANCE_SMART_CLIENT_DESKTOP` or `SMART_CLIENT_DESKTOP`, any case.
        section: String,
        /// `01`, or `10.0.0.1:1234`.
        server: String,
        /// Run it within the cooldown too.
        #[serde(default)]
        force: bool,
    },
    /// Reads the configuration file again and applies it (as SIGHUP), answering with what
    /// changed or every error.
    Reload,
    /// Answers while the broker runs and is not stopping.
    Ping,
}

impl Request {
    /// The section and server a request names: its balancer's section (as in the file, or
    /// without `BALANCE_`) and the server's id or `host:port`.
    pub fn target(&self) -> Option<(&str, &str)> {
        match self {
            Request::Disable {
                section, server, ..
            }
            | Request::Drain {
                section, server, ..
            }
            | Request::Enable { section, server }
            | Request::Weight {
                section, server, ..
            }
            | Request::Quarantine {
                section, server, ..
            }
            | Request::Release { section, server }
            | Request::Cut { section, server }
            | Request::Restart {
                section, server, ..
            }
            | Request::Wait {
                section, server, ..
            } => Some((section, server)),
            Request::Show { .. } | Request::Reload | Request::Ping => None,
        }
    }
}

/// One answer. `ok: false` comes with `error`; the rest depends on the request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// Whether the broker did what was asked.
    pub ok: bool,
    /// Why not, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What was done, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A reload's changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// A reload's errors (the file's, or a port that could not be bound).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Connections still open (`wait`, `cut`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// `show`'s balancers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub balancers: Vec<BalancerView>,
}

impl Answer {
    /// Done, with `message`.
    pub fn done(message: impl Into<String>) -> Answer {
        Answer {
            ok: true,
            message: Some(message.into()),
            ..Answer::default()
        }
    }

    /// Refused, because of `error`.
    pub fn refused(error: impl Into<String>) -> Answer {
        Answer {
            ok: false,
            error: Some(error.into()),
            ..Answer::default()
        }
    }
}

/// A balancer as `show` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalancerView {
    /// `BALANCE_SMART_CLIENT_DESKTOP`.
    pub section: String,
    /// Where it listens.
    pub listen: String,
    /// Client connections open now.
    pub connections: u64,
    /// Its servers, in the file's order.
    pub servers: Vec<ServerView>,
}

/// A server as `show` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerView {
    /// `REMOTE_SERVER_<id>`'s id.
    pub id: String,
    /// `host:port`.
    pub address: String,
    /// `available`, `quarantined`, `draining` (weight 0), `disabled` or `drain`.
    pub state: String,
    /// Connections open now.
    pub connections: u64,
    /// Live HTTP sessions bound to it (0 on a TCP balancer).
    pub sessions: u64,
    /// The weight in use.
    pub weight: u32,
    /// The file's weight.
    pub file_weight: u32,
    /// The operator's overrides.
    pub overrides: Overrides,
    /// The quarantine it is in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<QuarantineView>,
    /// The last run of `RESTART_COMMAND` for it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted: Option<RestartView>,
}

/// A run of `RESTART_COMMAND` as `show` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartView {
    /// When it started, ms since the Unix epoch.
    pub at_epoch_ms: u64,
    /// Its exit code; absent when it was killed or could not start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<i32>,
    /// How it ended, in words (`exit 0`, `killed after 2m (its timeout)`).
    pub outcome: String,
    /// Its last lines of output.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output: String,
    /// Why it ran: how long the server had been in quarantine, or who asked.
    pub why: String,
}

/// A quarantine as `show` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantineView {
    /// When it started, ms since the Unix epoch.
    pub since_epoch_ms: u64,
    /// When it ends, ms since the Unix epoch.
    pub until_epoch_ms: u64,
    /// `monitor`, `connect` or `operator`.
    pub reason: String,
    /// Asked for by an operator: checks do not end it.
    pub forced: bool,
    /// An operator's: who asked and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<OperatorAsk>,
}

/// True when `name` names `section` (`BALANCE_WEB_SERVICES`): as written, or without
/// `BALANCE_`, in any case.
pub fn names_section(name: &str, section: &str) -> bool {
    let bare = |s: &str| {
        let upper = s.to_ascii_uppercase();
        upper
            .strip_prefix("BALANCE_")
            .map_or(upper.clone(), str::to_string)
    };
    bare(name) == bare(section)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_as_documented() {
        let table: &[(&str, Request)] = &[
            (r#"{"command":"show"}"#, Request::Show { section: None }),
            (
                r#"{"command":"disable","section":"SMART_CLIENT_DESKTOP","server":"01","reason":"patch"}"#,
                Request::Disable {
                    section: "SMART_CLIENT_DESKTOP".into(),
                    server: "01".into(),
                    reason: Some("patch".into()),
                },
            ),
            (
                r#"{"command":"weight","section":"x","server":"01","weight":null}"#,
                Request::Weight {
                    section: "x".into(),
                    server: "01".into(),
                    weight: None,
                },
            ),
            (
                r#"{"command":"quarantine","section":"x","server":"02","reason":"restart"}"#,
                Request::Quarantine {
                    section: "x".into(),
                    server: "02".into(),
                    duration: None,
                    reason: Some("restart".into()),
                },
            ),
            (r#"{"command":"reload"}"#, Request::Reload),
        ];
        for (line, request) in table {
            assert_eq!(&serde_json::from_str::<Request>(line).expect(line), request);
            let again = serde_json::to_string(request).expect("serializes");
            assert_eq!(
                &serde_json::from_str::<Request>(&again).expect("reads"),
                request
            );
        }
        for bad in [
            r#"{"command":"explode"}"#,
            r#"{"command":"disable","section":"x"}"#,
            r#"{"command":"show","extra":1}"#,
            "[]",
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sections_are_named_with_or_without_balance() {
        let s = "BALANCE_SMART_CLIENT_DESKTOP";
        assert!(names_section("BALANCE_SMART_CLIENT_DESKTOP", s));
        assert!(names_section("smart_client_desktop", s));
        assert!(!names_section("WEB_SERVICES", s));
        assert!(!names_section("", s));
    }
}
