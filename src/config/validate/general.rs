//! `[General]`: the process's own settings, and the balancer keys it holds as every
//! balancer's default. Keys appbroker does not use (an AppServer's `MaxStringSize`, ...) are
//! ignored with one notice naming them, but for a typo of one of appbroker's keys and a key of
//! a balancer section's own, which are errors.

use super::super::keys::{self, KEYS, Stands};
use super::super::{ConfigError, General};
use super::super::{TOTVS_GENERAL, TOTVS_UNUSED};
use super::{Section, SectionLookup, Validator, suggest};

/// Unknown keys named in one notice at most; the rest are counted.
const MAX_NAMED: usize = 20;

impl Validator {
    /// Reads `[General]` (every default when there is none).
    pub(super) fn general(&mut self, section: Option<&Section>) -> General {
        let mut general = General::defaults();
        let Some(section) = section else {
            return general;
        };
        self.duplicates(section);
        self.unused_general_keys(section);
        let lookup = SectionLookup {
            section,
            general: None,
        };
        for key in keys::general() {
            self.read(&lookup, key, |text| key.set_general(&mut general, text));
        }
        if !general.console_log && general.console_file.is_none() {
            self.notices.push(ConfigError::new(
                section.line,
                &section.written,
                Some("ConsoleLog"),
                "is 0 and there is no ConsoleFile: the broker will log nothing",
            ));
        }
        general
    }

    /// One notice naming the keys of `[General]` that appbroker does not use; a key that
    /// looks like a typo of one of appbroker's, and is no TOTVS key, is an error instead (a
    /// `LANGAUGE=pt-BR` taken for an AppServer's key would leave the page in English without
    /// a word), as is a key of a balancer section's own.
    fn unused_general_keys(&mut self, section: &Section) {
        let known: Vec<&str> = KEYS
            .iter()
            .filter(|k| k.stands != Stands::OwnSection)
            .map(|k| k.name)
            .collect();
        let mut unused = Vec::new();
        let mut more_unused = 0;
        for entry in &section.entries {
            let key = keys::find(&entry.key);
            if key.is_some_and(|k| k.stands != Stands::OwnSection) {
                continue;
            }
            if let Some(message) = misplaced_or_misspelt(&entry.key, &known) {
                if !self.errors.worth_keeping(Some(entry.line)) {
                    self.errors.uncounted(1);
                    continue;
                }
                let error =
                    ConfigError::new(entry.line, &section.written, Some(&entry.written), message);
                self.errors.push(error);
            } else if unused.len() == MAX_NAMED {
                more_unused += 1;
            } else {
                unused.push(entry.written.clone());
            }
        }
        if !unused.is_empty() {
            let more = if more_unused > 0 {
                format!(" and {more_unused} more")
            } else {
                String::new()
            };
            self.section_notice(
                section,
                format!(
                    "ignoring keys appbroker does not use: {}{more}",
                    unused.join(", ")
                ),
            );
        }
    }
}

/// The error for `key` (upper case) in `[General]`, where it is not one of appbroker's keys
/// that may stand there: a balancer section's own key, or a typo of one of appbroker's keys
/// (by the rule of [`suggest`]) among `known` that is no TOTVS key. `None`: a key to ignore
/// with a notice.
fn misplaced_or_misspelt(key: &str, known: &[&str]) -> Option<String> {
    if keys::find(key).is_some() {
        return Some(
            "is read in a balancer section only (each balancer listens on its own address and \
             port): move it there"
                .into(),
        );
    }
    let totvs = TOTVS_GENERAL
        .iter()
        .copied()
        .chain(TOTVS_UNUSED.iter().map(|(k, _)| *k))
        .any(|k| k.eq_ignore_ascii_case(key));
    if totvs {
        return None;
    }
    let nearest = suggest(key, known)?;
    Some(format!("unknown key; did you mean {nearest}?"))
}
