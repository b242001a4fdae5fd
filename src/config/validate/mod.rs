//! Validation: scanned sections and entries to a typed [`Config`], collecting every error
//! rather than stopping at the first. Every key is read through the table of
//! [`super::keys`]. Split by concern:
//!
//! - [`sections`]: which sections are what.
//! - [`general`]: the `[General]` section.
//! - [`balancer`]: one balancer section.
//! - [`tls`]: a balancer's `SSL_*` keys, and the configuration doctor on its files.
//! - [`timing`]: a balancer's timings that contradict each other.
//! - [`across`]: the checks across balancers.

mod across;
mod balancer;
mod general;
mod sections;
mod timing;
mod tls;

use std::collections::BTreeMap;
use std::path::Path;

use super::ini::{self, IniEntry, Section};
use super::keys::Key;
use super::value;
use super::{
    BalancerConfig, Config, ConfigError, LoadError, Loaded, MAX_ERRORS_SHOWN, Notice, Origins,
    ValueOrigin,
};

/// Validates configuration text; `path` is only used to name the file in messages.
pub fn validate(text: &str, path: &Path) -> Result<Loaded, LoadError> {
    let scanned = ini::scan(text, MAX_ERRORS_SHOWN);
    let mut v = Validator::default();
    v.errors.uncounted(scanned.more_errors);
    let error_of = |e: ini::SyntaxError| ConfigError {
        line: Some(e.line),
        section: e.section,
        key: None,
        message: e.message,
    };
    for e in scanned.errors {
        v.errors.push(error_of(e));
    }
    if let Some(e) = scanned.truncated {
        v.errors.pin(error_of(e));
    }
    let sections = v.sections(&scanned.sections);
    let general = v.general(sections.general);
    let read: Vec<_> = sections
        .balancers
        .iter()
        .map(|(kind, section)| v.balancer(*kind, section, sections.general))
        .collect();
    // Across every section, its errors notwithstanding: all errors at once.
    v.across(&sections.balancers, &read);
    let balancers: Vec<_> = read
        .into_iter()
        .filter(|b| b.valid)
        .map(|b| b.config)
        .collect();
    if !v.errors.is_empty() {
        let (errors, total) = v.errors.into_first();
        return Err(LoadError::Invalid {
            path: path.to_path_buf(),
            errors,
            total,
        });
    }
    Ok(Loaded {
        config: Config {
            source: path.to_path_buf(),
            general,
            balancers,
            origins: v.origins,
        },
        notices: v.notices,
        warnings: v.warnings,
    })
}

/// The errors found so far: the [`MAX_ERRORS_SHOWN`] first by line are kept, the others only
/// counted, so a file of millions of bad lines costs neither memory nor time per error.
#[derive(Debug, Default)]
struct Errors {
    kept: Vec<ConfigError>,
    total: usize,
    /// Once more than enough were kept: the line of the last one worth keeping.
    last_kept_line: Option<usize>,
    /// Shown whatever its line (the file was not read to its end).
    pinned: Option<ConfigError>,
}

fn line_order(e: &ConfigError) -> usize {
    e.line.unwrap_or(usize::MAX)
}

impl Errors {
    fn push(&mut self, error: ConfigError) {
        self.total += 1;
        if !self.worth_keeping(error.line) {
            return;
        }
        self.kept.push(error);
        if self.kept.len() >= 2 * MAX_ERRORS_SHOWN {
            self.compact();
        }
    }

    /// An error shown after the first ones, whatever its line.
    fn pin(&mut self, error: ConfigError) {
        self.total += 1;
        self.pinned = Some(error);
    }

    /// Counts errors not worth a message (they come after the first ones shown).
    fn uncounted(&mut self, n: usize) {
        self.total += n;
    }

    /// False when an error at `line` would not be among those shown: the caller may skip
    /// composing its message.
    fn worth_keeping(&self, line: Option<usize>) -> bool {
        self.last_kept_line
            .is_none_or(|last| line.unwrap_or(usize::MAX) <= last)
    }

    fn compact(&mut self) {
        self.kept.sort_by_key(line_order);
        let before = self.kept.len();
        self.kept.dedup();
        self.total -= before - self.kept.len();
        self.kept.truncate(MAX_ERRORS_SHOWN);
        if self.kept.len() == MAX_ERRORS_SHOWN {
            self.last_kept_line = self.kept.last().map(line_order);
        }
    }

    fn len(&self) -> usize {
        self.total
    }

    fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The first errors in line order, and how many there are in all.
    fn into_first(mut self) -> (Vec<ConfigError>, usize) {
        self.compact();
        self.kept.extend(self.pinned);
        (self.kept, self.total)
    }
}

/// One balancer section as read, errors and all: the checks across balancers look at every
/// section, so that a file's errors are all reported at once.
struct ReadBalancer {
    /// Its settings and servers; a setting whose value is bad keeps its default, a server
    /// whose line is bad is left out.
    config: BalancerConfig,
    /// It has no error (on its own: the checks across balancers come after).
    valid: bool,
    /// Its listening address was read (`LOCAL_SERVER_PORT` given, it and
    /// `LOCAL_SERVER_ADDRESS` valid): only then does `config.listen` say where it listens.
    listen_read: bool,
}

/// What validation has found so far.
#[derive(Default)]
struct Validator {
    errors: Errors,
    notices: Vec<Notice>,
    /// The doctor's warnings ([`Loaded::warnings`]).
    warnings: Vec<Notice>,
    origins: Origins,
    /// The system's trusted roots, read once when a balancer's TLS is first checked.
    roots: Option<crate::tls::SystemRoots>,
}

/// One section's lookups, with `[General]` as the fallback for balancer keys.
struct SectionLookup<'a> {
    section: &'a Section,
    general: Option<&'a Section>,
}

impl<'a> SectionLookup<'a> {
    fn find(&self, key: &str) -> Option<(&'a IniEntry, ValueOrigin)> {
        if let Some(e) = self.section.entries.iter().find(|e| e.key == key) {
            return Some((e, ValueOrigin::Section(e.line)));
        }
        let general = self.general?;
        general
            .entries
            .iter()
            .find(|e| e.key == key)
            .map(|e| (e, ValueOrigin::General(e.line)))
    }
}

impl Validator {
    /// Reads `key` from `lookup` (its section, else `[General]` where the key may stand there),
    /// recording where its value came from, and hands the value to `set`. A bad value is
    /// recorded as an error at the line it is on, and the setting keeps its default, so
    /// validation goes on and reports everything at once. Returns the entry, when there is one.
    fn read<'a>(
        &mut self,
        lookup: &SectionLookup<'a>,
        key: &Key,
        set: impl FnOnce(&str) -> Result<(), String>,
    ) -> Option<&'a IniEntry> {
        let section = lookup.section.name.as_str();
        let Some((entry, origin)) = lookup.find(key.name) else {
            self.origins.set(section, key.name, ValueOrigin::Default);
            return None;
        };
        self.origins.set(section, key.name, origin);
        if let Err(message) = set(&entry.value) {
            let where_ = match origin {
                ValueOrigin::General(_) => "General",
                _ => &lookup.section.written,
            };
            // A secret is never repeated, not even a wrong one: the error may reach a log.
            let value = if key.domain.is_secret() {
                "the value (not shown)".to_string()
            } else {
                format!("`{}`", entry.value)
            };
            self.errors.push(ConfigError::new(
                entry.line,
                where_,
                Some(&entry.written),
                format!("{value} {message}"),
            ));
        }
        Some(entry)
    }

    /// A notice about a whole section (`line`), not one key.
    fn section_notice(&mut self, section: &Section, message: String) {
        self.notices.push(ConfigError {
            line: Some(section.line),
            section: Some(section.written.clone()),
            key: None,
            message,
        });
    }

    /// Keys given twice in `section` (`REMOTE_SERVER_aa` and `_AA` are the same key).
    fn duplicates(&mut self, section: &Section) {
        let mut first: BTreeMap<String, usize> = BTreeMap::new();
        for entry in &section.entries {
            let key = match value::server_id_of_key(&entry.key) {
                Some(Ok(id)) => format!("REMOTE_SERVER_{id}"),
                _ => entry.key.clone(),
            };
            if let Some(line) = first.insert(key, entry.line) {
                if !self.errors.worth_keeping(Some(entry.line)) {
                    self.errors.uncounted(1);
                    continue;
                }
                self.errors.push(ConfigError::new(
                    entry.line,
                    &section.written,
                    Some(&entry.written),
                    format!("given twice (first at line {line}); keep one"),
                ));
            }
        }
    }
}

/// The known name closest to `name`, when it is close enough to be a typo: within a quarter
/// of its length (two at least) in edits.
fn suggest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let length = name.chars().count();
    let close = |k: &str| (k.len() / 4).max(2);
    known
        .iter()
        // The lengths alone rule most names out: the distance is never less than their
        // difference, and a file may hold 100,000 unknown keys (known names are ASCII).
        .filter(|k| length.abs_diff(k.len()) <= close(k))
        .filter_map(|k| Some((value::edit_distance_within(name, k, close(k))?, *k)))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}
