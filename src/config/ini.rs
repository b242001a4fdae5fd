//! The line scanner: `appserver.ini` text to sections and entries, each with its line number.
//!
//! Why not rust-ini: it stops at the first syntax error and keeps no line numbers, while every
//! message here must name its line and all of them must be reported at once (docs/architecture.md).
//! The dialect is the TOTVS one: `[SECTION]` headers, `KEY=VALUE` entries, whole-line comments
//! with `;` or `#`, names case-insensitive, backslashes literal, no quotes or escapes, and no
//! comment after a value.

/// One `KEY=VALUE` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IniEntry {
    /// The key in upper case, for lookups.
    pub key: String,
    /// The key as written, for messages.
    pub written: String,
    /// The value with surrounding blanks removed.
    pub value: String,
    /// 1-based line number.
    pub line: usize,
}

/// One `[SECTION]` and the entries under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The name in upper case.
    pub name: String,
    /// The name as written.
    pub written: String,
    /// Line of the `[SECTION]` header.
    pub line: usize,
    /// Entries in file order.
    pub entries: Vec<IniEntry>,
    /// Keys (upper case) of lines rejected with a syntax error of their own (a `;` after the
    /// value): present in the file, so no other message should call them missing.
    pub rejected: Vec<String>,
}

/// A syntax error on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    /// 1-based line number.
    pub line: usize,
    /// The section the line is in, when there is one.
    pub section: Option<String>,
    /// What is wrong and what was expected.
    pub message: String,
}

/// Sections and entries read at most: an `appserver.ini` has a few hundred (a balancer
/// section at most 1296 servers and some 40 keys), and each costs memory while the file is
/// checked. A file past this is not one; it is reported rather than read to its end.
pub const MAX_LINES: usize = 100_000;

/// Scans the whole text; syntax errors are collected, never fatal, so the caller reports all:
/// the first `keep` of them, and the count of the others.
pub fn scan(text: &str, keep: usize) -> Scanned {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut scanner = Scanner {
        sections: Vec::new(),
        errors: SyntaxErrors {
            kept: Vec::new(),
            keep,
            more: 0,
        },
    };
    let mut read = 0;
    let mut truncated = None;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with(';') || trimmed.starts_with('#') {
            continue;
        }
        if read == MAX_LINES {
            truncated = Some(SyntaxError {
                line,
                section: scanner.current(),
                message: format!(
                    "more than {MAX_LINES} sections and entries: an appserver.ini has a few \
                     hundred; is it the right file? (nothing from this line on is read)"
                ),
            });
            break;
        }
        read += 1;
        scanner.line(line, trimmed);
    }
    Scanned {
        sections: scanner.sections,
        errors: scanner.errors.kept,
        more_errors: scanner.errors.more,
        truncated,
    }
}

/// The sections read so far, and the errors.
struct Scanner {
    sections: Vec<Section>,
    errors: SyntaxErrors,
}

impl Scanner {
    /// The section lines belong to now, as written.
    fn current(&self) -> Option<String> {
        self.sections.last().map(|s| s.written.clone())
    }

    /// One line that is neither blank nor a comment.
    fn line(&mut self, line: usize, trimmed: &str) {
        if self.errors.full() && !self.may_be_read(trimmed) {
            // Only counted: no message is composed for an error that will not be shown.
            self.errors.more += 1;
            return;
        }
        let current = self.current();
        let error = |message: String| SyntaxError {
            line,
            section: current.clone(),
            message,
        };
        if let Some(rest) = trimmed.strip_prefix('[') {
            match rest.strip_suffix(']') {
                Some(name) if !name.trim().is_empty() && !name.contains([']', '[']) => {
                    let written = name.trim().to_string();
                    self.sections.push(Section {
                        name: written.to_ascii_uppercase(),
                        written,
                        line,
                        entries: Vec::new(),
                        rejected: Vec::new(),
                    });
                }
                _ => self.errors.push(error(format!(
                    "`{trimmed}` is not a section header; expected `[NAME]` alone on the line"
                ))),
            }
            return;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            self.errors.push(error(format!(
                "`{trimmed}` is neither `KEY=VALUE`, a `[SECTION]` header nor a comment"
            )));
            return;
        };
        if let Err(message) = self.entry(line, key.trim(), value.trim()) {
            self.errors.push(error(message));
        }
    }

    /// Once every error to be shown is in: whether the line could still be read without one
    /// (a header, or an entry under a section).
    fn may_be_read(&self, trimmed: &str) -> bool {
        let is_header = trimmed.starts_with('[') && trimmed.ends_with(']');
        let is_entry = trimmed
            .split_once('=')
            .is_some_and(|(k, v)| !k.trim().is_empty() && !comment_after(k.trim(), v));
        let skipped = !is_header && !is_entry || (is_entry && self.sections.is_empty());
        !skipped
    }

    /// A `KEY=VALUE` line, added to the current section; the error's message otherwise.
    fn entry(&mut self, line: usize, key: &str, value: &str) -> Result<(), String> {
        if key.is_empty() {
            return Err("a line starts with `=`; expected `KEY=VALUE`".into());
        }
        if comment_after(key, value) {
            if let Some(section) = self.sections.last_mut() {
                section.rejected.push(key.to_ascii_uppercase());
            }
            return Err(format!(
                "{key}: `;` after a value is not a comment in appserver.ini (the TOTVS \
                 broker does not support it either); put the comment on a line of its own"
            ));
        }
        let Some(section) = self.sections.last_mut() else {
            return Err(format!(
                "{key} comes before any [SECTION] header; put it under the section it belongs to"
            ));
        };
        section.entries.push(IniEntry {
            key: key.to_ascii_uppercase(),
            written: key.to_string(),
            value: value.to_string(),
            line,
        });
        Ok(())
    }
}

/// True when `value` holds a `;`, which TOTVS files do not allow after a value: but in a shell
/// command (`ALERT_COMMAND`, `RESTART_COMMAND`), where it separates commands.
fn comment_after(key: &str, value: &str) -> bool {
    value.contains(';') && !super::keys::SHELL_COMMANDS.contains(&key.to_ascii_uppercase().as_str())
}

/// What [`scan`] found.
#[derive(Debug)]
pub struct Scanned {
    /// The sections, in file order.
    pub sections: Vec<Section>,
    /// The first syntax errors, in line order.
    pub errors: Vec<SyntaxError>,
    /// How many more syntax errors there are.
    pub more_errors: usize,
    /// Past [`MAX_LINES`]: the error saying where reading stopped.
    pub truncated: Option<SyntaxError>,
}

/// Syntax errors come in line order: the first `keep` are kept, the others counted.
struct SyntaxErrors {
    kept: Vec<SyntaxError>,
    keep: usize,
    more: usize,
}

impl SyntaxErrors {
    fn full(&self) -> bool {
        self.kept.len() >= self.keep
    }

    fn push(&mut self, error: SyntaxError) {
        if self.kept.len() < self.keep {
            self.kept.push(error);
        } else {
            self.more += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_entries_and_comments() {
        let text = "\u{feff}; comment\n# other\n[General]\nConsoleLog = 1\n\n[balance_x]\n  Key=C:\\totvs\\logs  \n";
        let Scanned {
            sections, errors, ..
        } = scan(text, 100);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(sections.len(), 2);
        assert_eq!(sections[0].name, "GENERAL");
        assert_eq!(sections[0].entries[0].key, "CONSOLELOG");
        assert_eq!(sections[0].entries[0].line, 4);
        assert_eq!(sections[1].name, "BALANCE_X");
        assert_eq!(sections[1].written, "balance_x");
        assert_eq!(sections[1].entries[0].value, "C:\\totvs\\logs");
        assert_eq!(sections[1].entries[0].line, 7);
    }

    #[test]
    fn every_syntax_error_is_reported_with_its_line() {
        let text = "orphan=1\n[A]\nno equals here\n=5\nK=1 ; note\n[broken\nOK=2\n";
        let Scanned {
            sections, errors, ..
        } = scan(text, 100);
        let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![1, 3, 4, 5, 6]);
        assert!(errors[3].message.contains("`;` after a value"));
        assert_eq!(errors[3].section.as_deref(), Some("A"));
        assert_eq!(sections[0].rejected, ["K"], "the key is there, not missing");
        // The good entry after the bad header still lands in the last good section.
        assert_eq!(sections[0].entries.len(), 1);
        assert_eq!(sections[0].entries[0].key, "OK");
    }

    #[test]
    fn a_shell_command_may_hold_semicolons() {
        let text = "[A]\nrestart_command=ssh app1 'systemctl stop a; systemctl start a'\n";
        let Scanned {
            sections, errors, ..
        } = scan(text, 100);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(sections[0].entries[0].value.ends_with("start a'"));
    }

    #[test]
    fn value_may_be_empty_and_may_contain_equals() {
        let Scanned {
            sections, errors, ..
        } = scan("[A]\nK=\nL=a=b\n", 100);
        assert!(errors.is_empty());
        assert_eq!(sections[0].entries[0].value, "");
        assert_eq!(sections[0].entries[1].value, "a=b");
    }
}
