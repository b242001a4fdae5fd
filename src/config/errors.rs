//! What is wrong with a configuration, in the operator's words: [`ConfigError`] (and
//! [`Notice`]) names the file, line, section and key; [`LoadError`] is why a file could not be
//! loaded at all, its report bounded by [`MAX_ERRORS_SHOWN`]; [`ValueError`] is a value none of
//! those an enum-valued key takes.

use std::path::PathBuf;

use super::words::plural;

/// A value that is none of those an enum-valued key takes; it says what was expected, in
/// words that complete "`value` ...".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValueError(&'static str);

impl ValueError {
    pub(super) const LANGUAGE: ValueError = ValueError("expected en or pt-BR");
    pub(super) const SORT_METHOD: ValueError =
        ValueError("is not a sort method; expected CONNECTION, ROUND_ROBIN or SESSION");
    pub(super) const MONITORING: ValueError =
        ValueError("is not a monitoring type; expected CONNECTION, SEND_EXPECT, HTTP or DISABLED");
}

/// A configuration error, naming where it is and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// 1-based line, when the error belongs to one.
    pub line: Option<usize>,
    /// The section as written.
    pub section: Option<String>,
    /// The key as written.
    pub key: Option<String>,
    /// What is wrong and what is expected.
    pub message: String,
}

/// Something accepted but worth telling the operator (a TOTVS key appbroker does not use, ...).
pub type Notice = ConfigError;

impl ConfigError {
    pub(super) fn new(
        line: usize,
        section: &str,
        key: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            line: Some(line),
            section: Some(section.to_string()),
            key: key.map(str::to_string),
            message: message.into(),
        }
    }

    /// Formats the error with the file name first, as `file:line: [SECTION] KEY: message`.
    pub fn located(&self, file: &str) -> String {
        let mut out = file.to_string();
        if let Some(line) = self.line {
            out.push_str(&format!(":{line}"));
        }
        out.push_str(": ");
        if let Some(section) = &self.section {
            out.push_str(&format!("[{section}] "));
        }
        if let Some(key) = &self.key {
            out.push_str(&format!("{key}: "));
        }
        out.push_str(&self.message);
        out
    }
}

// The limit sits beside the error that states it; `load` enforces it.

/// The largest configuration file read: a real `appserver.ini` is a few KiB, and a path that
/// names something else (a log, a disk image) must not fill the broker's memory.
pub const MAX_FILE_SIZE: u64 = 16 * 1024 * 1024;

/// Errors printed at most; the rest are counted. A file that is not an ini at all gives an
/// error per line, and a million lines of them help no one.
pub const MAX_ERRORS_SHOWN: usize = 100;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read at all.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The path names something other than a regular file (a FIFO, a device, a directory).
    #[error(
        "cannot read {}: it is {what}, not a regular file; give the path of the appserver.ini \
         itself (a symbolic link to one is fine)",
        path.display()
    )]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is, in words (`a FIFO (named pipe)`).
        what: &'static str,
    },
    /// The file is larger than [`MAX_FILE_SIZE`].
    #[error(
        "cannot read {}: it is {} bytes, more than the {} MiB a configuration file may have; is \
         it the right file?",
        path.display(),
        size,
        MAX_FILE_SIZE / (1024 * 1024)
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size in bytes (at least what was read).
        size: u64,
    },
    /// The file was read and holds errors.
    #[error("{} in {}", plural(*total, "error"), path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The first [`MAX_ERRORS_SHOWN`] errors, in line order.
        errors: Vec<ConfigError>,
        /// How many errors there are in all.
        total: usize,
    },
}

impl LoadError {
    /// Every message, one per line, each starting with the file name: the first
    /// [`MAX_ERRORS_SHOWN`] of a file with errors, then how many more there are.
    pub fn report(&self) -> String {
        match self {
            LoadError::Invalid {
                path,
                errors,
                total,
            } => {
                let file = path.display().to_string();
                let mut out = format!("{self}:");
                for error in errors {
                    out.push_str("\n  ");
                    out.push_str(&error.located(&file));
                }
                let more = total.saturating_sub(errors.len());
                if more > 0 {
                    let noun = if more == 1 { "error" } else { "errors" };
                    out.push_str(&format!(
                        "\n  ... and {more} more {noun} (the first {MAX_ERRORS_SHOWN} are shown; \
                         is it an appserver.ini?)"
                    ));
                }
                out
            }
            _ => self.to_string(),
        }
    }
}
