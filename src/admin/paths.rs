//! Where the control socket and the state file of a broker live: named in `[General]`, or
//! derived from the configuration file's name so that several brokers on one machine never
//! collide, and so that `appbroker ctl --config PATH` finds the socket the broker made.
//! Pure: the environment is passed in.

use std::path::{Path, PathBuf};

use crate::config::{self, General, LoadError};

/// What the default paths depend on besides the configuration.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// Running as root: the system's directories (`/run`, `/var/lib`).
    pub root: bool,
    /// `$RUNTIME_DIRECTORY`: systemd's `RuntimeDirectory=appbroker` (`/run/appbroker`) for a
    /// service that runs as its own user.
    pub service_runtime_dir: Option<PathBuf>,
    /// `$STATE_DIRECTORY`: systemd's `StateDirectory=appbroker` (`/var/lib/appbroker`).
    pub service_state_dir: Option<PathBuf>,
    /// `$XDG_RUNTIME_DIR`, when set.
    pub runtime_dir: Option<PathBuf>,
    /// `$XDG_STATE_HOME`, when set.
    pub state_home: Option<PathBuf>,
    /// `$HOME`, when set.
    pub home: Option<PathBuf>,
}

impl Env {
    /// This process's environment.
    pub fn current() -> Env {
        let var = |name| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        // systemd lists several directories separated by colons when given several.
        let first = |name| {
            var(name).map(|p: PathBuf| {
                let text = p.to_string_lossy().into_owned();
                PathBuf::from(text.split(':').next().unwrap_or_default())
            })
        };
        Env {
            root: is_root(),
            service_runtime_dir: first("RUNTIME_DIRECTORY"),
            service_state_dir: first("STATE_DIRECTORY"),
            runtime_dir: var("XDG_RUNTIME_DIR"),
            state_home: var("XDG_STATE_HOME"),
            home: var("HOME"),
        }
    }
}

#[cfg(unix)]
fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[cfg(not(unix))]
fn is_root() -> bool {
    false
}

/// The name shared by a configuration's socket and state file: the file's name without its
/// extension (`appserver` for `/etc/appserver.ini`).
fn stem(ini: &Path) -> String {
    ini.file_stem()
        .map_or_else(|| "appbroker".into(), |s| s.to_string_lossy().into_owned())
}

/// A configured path: `0` is off, a relative path is taken from the configuration file's
/// directory (so the broker and `ctl` agree whatever their working directories).
fn configured(path: &Path, ini: &Path) -> Option<PathBuf> {
    if path == Path::new("0") {
        return None;
    }
    Some(match ini.parent() {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path.to_path_buf(),
    })
}

/// The directory of `ini` (`.` for a bare file name).
fn dir_of(ini: &Path) -> PathBuf {
    match ini.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The control socket of the broker running `ini`: `CONTROL_SOCKET`, else in systemd's
/// `$RUNTIME_DIRECTORY` (`/run/appbroker` for the unit in contrib/, which may run as its own
/// user), `/run/appbroker/<stem>.sock` as root, `$XDG_RUNTIME_DIR/appbroker/<stem>.sock`, or
/// next to the file. `None` when turned off (`CONTROL_SOCKET=0`).
pub fn control_socket(general: &General, ini: &Path, env: &Env) -> Option<PathBuf> {
    if let Some(path) = &general.control_socket {
        return configured(path, ini);
    }
    let name = format!("{}.sock", stem(ini));
    Some(if let Some(dir) = &env.service_runtime_dir {
        dir.join(name)
    } else if env.root {
        Path::new("/run/appbroker").join(name)
    } else if let Some(dir) = &env.runtime_dir {
        dir.join("appbroker").join(name)
    } else {
        dir_of(ini).join(name)
    })
}

/// The control socket of the broker running the file at `ini`, read from its `[General]`
/// alone: found even while the rest of the file holds errors (as when `ctl reload` is about to
/// report them).
pub fn control_socket_of_file(ini: &Path, env: &Env) -> Result<Option<PathBuf>, LoadError> {
    let mut general = General::defaults();
    if let Some(value) = config::general_value(ini, "CONTROL_SOCKET")? {
        general.control_socket = (!value.is_empty()).then(|| PathBuf::from(value));
    }
    Ok(control_socket(&general, ini, env))
}

/// The state file of the broker running `ini`: `STATE_FILE`, else in systemd's
/// `$STATE_DIRECTORY` (`/var/lib/appbroker` for the unit in contrib/),
/// `/var/lib/appbroker/<stem>.state` as root, `$XDG_STATE_HOME/appbroker/` or
/// `~/.local/state/appbroker/`, or next to the file. Never under `/run`, which systemd
/// empties when the service stops. `None` when turned off (`STATE_FILE=0`).
pub fn state_file(general: &General, ini: &Path, env: &Env) -> Option<PathBuf> {
    if let Some(path) = &general.state_file {
        return configured(path, ini);
    }
    let name = format!("{}.state", stem(ini));
    Some(if let Some(dir) = &env.service_state_dir {
        dir.join(name)
    } else if env.root {
        Path::new("/var/lib/appbroker").join(name)
    } else if let Some(dir) = &env.state_home {
        dir.join("appbroker").join(name)
    } else if let Some(home) = &env.home {
        home.join(".local/state/appbroker").join(name)
    } else {
        dir_of(ini).join(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(root: bool, runtime: Option<&str>, state: Option<&str>, home: Option<&str>) -> Env {
        Env {
            root,
            service_runtime_dir: None,
            service_state_dir: None,
            runtime_dir: runtime.map(PathBuf::from),
            state_home: state.map(PathBuf::from),
            home: home.map(PathBuf::from),
        }
    }

    #[test]
    fn default_paths_follow_the_files_name_and_who_runs() {
        let g = General::defaults();
        let ini = Path::new("/etc/appbroker/desktop.ini");
        let table: &[(Env, &str, &str)] = &[
            (
                env(true, Some("/run/user/0"), None, Some("/root")),
                "/run/appbroker/desktop.sock",
                "/var/lib/appbroker/desktop.state",
            ),
            (
                env(false, Some("/run/user/1000"), Some("/s"), Some("/home/u")),
                "/run/user/1000/appbroker/desktop.sock",
                "/s/appbroker/desktop.state",
            ),
            (
                env(false, None, None, Some("/home/u")),
                "/etc/appbroker/desktop.sock",
                "/home/u/.local/state/appbroker/desktop.state",
            ),
            (
                env(false, None, None, None),
                "/etc/appbroker/desktop.sock",
                "/etc/appbroker/desktop.state",
            ),
        ];
        for (env, socket, state) in table {
            assert_eq!(control_socket(&g, ini, env), Some(PathBuf::from(socket)));
            assert_eq!(state_file(&g, ini, env), Some(PathBuf::from(state)));
        }
        assert_eq!(
            control_socket(
                &g,
                Path::new("appserver.ini"),
                &env(false, None, None, None)
            ),
            Some(PathBuf::from("./appserver.sock"))
        );
        // The unit in contrib/ runs as its own user, with systemd's directories.
        let service = Env {
            service_runtime_dir: Some(PathBuf::from("/run/appbroker")),
            service_state_dir: Some(PathBuf::from("/var/lib/appbroker")),
            ..env(false, None, None, Some("/home/appbroker"))
        };
        assert_eq!(
            control_socket(&g, ini, &service),
            Some(PathBuf::from("/run/appbroker/desktop.sock"))
        );
        assert_eq!(
            state_file(&g, ini, &service),
            Some(PathBuf::from("/var/lib/appbroker/desktop.state"))
        );
    }

    #[test]
    fn configured_paths_win_zero_turns_off_and_relative_is_from_the_file() {
        let mut g = General::defaults();
        let ini = Path::new("/etc/appserver.ini");
        let root = env(true, None, None, None);
        g.control_socket = Some(PathBuf::from("0"));
        g.state_file = Some(PathBuf::from("run/broker.state"));
        assert_eq!(control_socket(&g, ini, &root), None);
        assert_eq!(
            state_file(&g, ini, &root),
            Some(PathBuf::from("/etc/run/broker.state"))
        );
        g.control_socket = Some(PathBuf::from("/tmp/b.sock"));
        assert_eq!(
            control_socket(&g, ini, &root),
            Some(PathBuf::from("/tmp/b.sock"))
        );
    }
}
