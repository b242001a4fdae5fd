//! An operator's overrides of one server, set at run time (`appbroker ctl`): held out of the
//! balancing (disabled or draining) with a reason, who asked and when, and a weight in place
//! of the file's. Pure transitions returning what changed; the balancer applies them and
//! logs, as it does for [`super::health`]. Overrides outlive a reload while the server keeps its
//! id and address, and the state file keeps them over a restart.

use serde::{Deserialize, Serialize};

/// Why a server takes no new clients although it is healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `ctl disable`: out of the balancing; its open connections stay.
    Disabled,
    /// `ctl drain`: the same, while an operator waits for its connections to end.
    Drain,
}

impl Mode {
    /// The word in logs, pages and `ctl show`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Disabled => "disabled",
            Mode::Drain => "drain",
        }
    }
}

/// A server held out of the balancing by an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// Disabled or draining.
    pub mode: Mode,
    /// The operator's reason; empty when none was given.
    pub reason: String,
    /// Who asked, as `uid N` (the control socket's peer) or `state file`.
    pub by: String,
    /// When it started, wall ms.
    pub since_wall_ms: u64,
}

/// Every override of one server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// Out of the balancing, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// A weight in place of the file's, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// The most weight an operator may give: the file's own bound.
pub const MAX_WEIGHT: u32 = 1000;

/// Why `reason` cannot be an operator's reason, in words naming its control characters
/// (escaped); `None` when it can. A reason is shown in log lines, pages and terminals: a line
/// break in it would forge a log line, an escape sequence would reach whoever reads it.
pub fn reason_problem(reason: &str) -> Option<String> {
    let mut found: Vec<String> = Vec::new();
    for c in reason.chars().filter(|c| c.is_control()) {
        let shown = escape_controls(&c.to_string());
        if !found.contains(&shown) {
            found.push(shown);
        }
    }
    if found.is_empty() {
        return None;
    }
    Some(format!(
        "the reason holds control characters ({}); give it as one line of printable text",
        found.join(", ")
    ))
}

/// `text` with its control characters written out (`\n`, `\x1b`, `\u{9b}`): for text kept
/// from before [`reason_problem`] refused them (a state file), wherever it is shown. The
/// process's one escaping, which the log's lines use too.
pub use crate::support::escape::escape_controls;

impl Hold {
    /// The same hold with its reason and who asked escaped ([`escape_controls`]): as a hold
    /// read back from a state file enters the broker.
    pub fn escaped(self) -> Hold {
        Hold {
            reason: escape_controls(&self.reason),
            by: escape_controls(&self.by),
            ..self
        }
    }
}

impl Overrides {
    /// True when nothing is overridden.
    pub fn is_empty(&self) -> bool {
        self.hold.is_none() && self.weight.is_none()
    }

    /// Holds the server out (`hold`); the hold it replaces, if any. A hold of the same mode
    /// keeps its start and takes the new reason.
    pub fn hold(&mut self, mut hold: Hold) -> Option<Hold> {
        if let Some(old) = &self.hold
            && old.mode == hold.mode
        {
            hold.since_wall_ms = old.since_wall_ms;
        }
        self.hold.replace(hold)
    }

    /// Ends a hold; the one that ended, if any.
    pub fn enable(&mut self) -> Option<Hold> {
        self.hold.take()
    }

    /// Sets (or with `None` ends) the weight override; the weight the server takes now,
    /// given the file's.
    pub fn set_weight(&mut self, weight: Option<u32>, file_weight: u32) -> u32 {
        self.weight = weight;
        self.effective_weight(file_weight)
    }

    /// The weight the balancing uses: the override's, else the file's.
    pub fn effective_weight(&self, file_weight: u32) -> u32 {
        self.weight.unwrap_or(file_weight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_refused_in_a_reason_and_escaped_where_kept() {
        assert_eq!(reason_problem("OS patch, ticket #4411 (José)"), None);
        let forged = "patch\nWARN  server 10.0.0.9:1234 enabled\x1b[2J\u{9b}";
        let problem = reason_problem(forged).expect("refused");
        assert!(problem.contains("(\\n, \\x1b, \\u{9b})"), "{problem}");
        let escaped = escape_controls(forged);
        assert_eq!(
            escaped,
            "patch\\nWARN  server 10.0.0.9:1234 enabled\\x1b[2J\\u{9b}"
        );
        assert!(!escaped.chars().any(char::is_control));
        assert_eq!(escape_controls("plain"), "plain");
    }

    fn hold(mode: Mode, reason: &str, at: u64) -> Hold {
        Hold {
            mode,
            reason: reason.into(),
            by: "uid 0".into(),
            since_wall_ms: at,
        }
    }

    #[test]
    fn holding_again_keeps_the_start_of_the_same_mode_only() {
        let mut o = Overrides::default();
        assert!(o.hold(hold(Mode::Disabled, "patch", 10)).is_none());
        let old = o
            .hold(hold(Mode::Disabled, "patch 2", 20))
            .expect("replaced");
        assert_eq!(old.reason, "patch");
        assert_eq!(o.hold.as_ref().map(|h| h.since_wall_ms), Some(10));
        o.hold(hold(Mode::Drain, "", 30));
        assert_eq!(o.hold.as_ref().map(|h| h.since_wall_ms), Some(30));
        assert_eq!(o.enable().map(|h| h.mode), Some(Mode::Drain));
        assert!(o.enable().is_none() && o.is_empty());
    }

    #[test]
    fn the_weight_override_wins_over_the_files_until_cleared() {
        let mut o = Overrides::default();
        assert_eq!(o.effective_weight(3), 3);
        assert_eq!(o.set_weight(Some(0), 3), 0);
        assert_eq!(
            o.effective_weight(7),
            0,
            "a reload's weight stays behind it"
        );
        assert_eq!(o.set_weight(None, 7), 7);
    }

    #[test]
    fn overrides_round_trip_through_json() {
        let mut o = Overrides::default();
        o.hold(hold(Mode::Drain, "kernel update", 5));
        o.set_weight(Some(4), 1);
        let text = serde_json::to_string(&o).expect("serializes");
        assert_eq!(serde_json::from_str::<Overrides>(&text).ok(), Some(o));
        assert_eq!(
            serde_json::from_str::<Overrides>("{}").ok(),
            Some(Overrides::default())
        );
    }
}
