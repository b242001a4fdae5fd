//! Loading a configuration file: read it (a regular file of at most [`MAX_FILE_SIZE`], never a
//! FIFO that would block for ever), decode it (UTF-8 or Windows-1252), validate it into a
//! [`Config`]; and one `[General]` value read from a file whatever errors it holds.

use std::path::Path;

use super::errors::{LoadError, MAX_FILE_SIZE};
use super::model::{Config, Loaded};
use super::{ini, validate};

impl Config {
    /// Reads and validates a file (UTF-8, or Windows-1252 when it is not valid UTF-8): a
    /// regular file (or a symbolic link to one) of at most [`MAX_FILE_SIZE`]. The read
    /// blocks (a file on a hung network share would block it for long), so a running
    /// broker calls this off its control thread.
    pub fn from_path(path: &Path) -> Result<Loaded, LoadError> {
        Config::from_text(&decode(&read_file(path)?), path)
    }

    /// Validates configuration text; `path` is only used to name the file in messages.
    pub fn from_text(text: &str, path: &Path) -> Result<Loaded, LoadError> {
        validate::validate(text, path)
    }
}

/// The value of `key` (upper case) in the `[General]` section of the file at `path`, whatever
/// errors the rest of the file holds: how `appbroker ctl` finds the control socket of a
/// running broker whose file is being edited (a `ctl reload` must reach it to report them).
pub fn general_value(path: &Path, key: &str) -> Result<Option<String>, LoadError> {
    let text = decode(&read_file(path)?);
    let scanned = ini::scan(&text, 0);
    Ok(scanned
        .sections
        .iter()
        .filter(|s| s.name == "GENERAL")
        .flat_map(|s| &s.entries)
        .rfind(|e| e.key == key)
        .map(|e| e.value.clone()))
}

/// The bytes of the configuration file, refusing what is not a regular file or too large.
fn read_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    use std::io::Read;
    let failed = |source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Opening a FIFO waits for a writer, for ever: open it without waiting, then look at
    // what it is. (Regular files ignore the flag.)
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(
        &mut options,
        nix::fcntl::OFlag::O_NONBLOCK.bits(),
    );
    let file = options.open(path).map_err(failed)?;
    let metadata = file.metadata().map_err(failed)?;
    if !metadata.is_file() {
        return Err(LoadError::NotAFile {
            path: path.to_path_buf(),
            what: file_kind(&metadata.file_type()),
        });
    }
    let too_large = |size| LoadError::TooLarge {
        path: path.to_path_buf(),
        size,
    };
    if metadata.len() > MAX_FILE_SIZE {
        return Err(too_large(metadata.len()));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(MAX_FILE_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.len() as u64 > MAX_FILE_SIZE {
        return Err(too_large(bytes.len() as u64)); // it grew while being read
    }
    Ok(bytes)
}

/// What a path that is no regular file is, in words.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

/// UTF-8 when it is valid, else Windows-1252 (Brazilian files carry Portuguese comments in it).
pub(super) fn decode(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_string(),
        Err(_) => encoding_rs::WINDOWS_1252.decode(bytes).0.into_owned(),
    }
}
