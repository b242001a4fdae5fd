//! `[General]`: the process's own settings, and the balancer keys it holds as every
//! balancer's default. Keys appbroker does not use (an AppServer's `MaxStringSize`, ...) are
//! ignored with one notice naming them.

use super::super::keys::{self, KEYS, Stands};
use super::super::{ConfigError, General};
use super::{Lookup, Section, Validator, suggest};

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
        let lookup = Lookup {
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

    /// One notice naming the keys of `[General]` that appbroker does not use, each with the
    /// known key it is closest to when it looks like a typo.
    fn unused_general_keys(&mut self, section: &Section) {
        let all: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        let mut unused = Vec::new();
        let mut more_unused = 0;
        for entry in &section.entries {
            let known = keys::find(&entry.key).is_some_and(|k| k.stands != Stands::OwnSection);
            if !known && unused.len() == MAX_NAMED {
                more_unused += 1;
            } else if !known {
                let mut name = entry.written.clone();
                if let Some(s) = suggest(&entry.key, &all) {
                    name.push_str(&format!(" (did you mean {s}?)"));
                }
                unused.push(name);
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
