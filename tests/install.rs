//! README's "Running it for real", performed: `contrib/install.sh` into a temporary root (as
//! any user, in every `cargo test`), the systemd unit checked by `systemd-analyze verify`, and
//! on a throwaway machine (CI, as root) the same steps for real, user included.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that cannot go on should panic

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use harness::binary;

const REPOSITORY: &str = env!("CARGO_MANIFEST_DIR");

/// Runs `contrib/install.sh` on the binary under test, into `destdir` when given.
fn install(destdir: Option<&Path>) -> Output {
    let mut command = Command::new("sh");
    command
        .arg(Path::new(REPOSITORY).join("contrib/install.sh"))
        .arg(binary());
    match destdir {
        Some(dir) => command.env("DESTDIR", dir),
        None => command.env_remove("DESTDIR"),
    };
    let output = command.output().expect("run contrib/install.sh");
    assert!(
        output.status.success(),
        "install.sh failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// `<binary> --check --config <config>`, run through `prefix` (e.g. setpriv): the check
/// must pass and say so.
fn assert_check_passes(prefix: &[&str], program: &Path, config: &Path) {
    let mut words = prefix.iter();
    let mut command = match words.next() {
        Some(first) => {
            let mut command = Command::new(first);
            command.args(words).arg(program);
            command
        }
        None => Command::new(program),
    };
    let output = command
        .arg("--check")
        .arg("--config")
        .arg(config)
        .output()
        .expect("run the installed binary");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "--check failed:\n{stderr}");
    assert!(
        stderr.contains(&format!("configuration OK: {}", config.display())),
        "{stderr}"
    );
}

#[test]
fn the_install_steps_find_the_binary_where_cargo_put_it() {
    // A build with CARGO_TARGET_DIR (or a target-dir cargo knows of) is not in target/: the
    // script asks the variable, then cargo. The stand-in is told from any real build.
    let cargo = Path::new(env!("CARGO")).parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(cargo).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    for (set, unset) in [
        ("CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR"),
        ("CARGO_BUILD_TARGET_DIR", "CARGO_TARGET_DIR"),
    ] {
        let target = tempfile::tempdir().unwrap();
        let built = target.path().join("release/appbroker");
        std::fs::create_dir_all(built.parent().unwrap()).unwrap();
        std::fs::write(&built, format!("#!/bin/sh\n# built with {set}\n")).unwrap();
        std::fs::set_permissions(&built, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = tempfile::tempdir().unwrap();
        let output = Command::new("sh")
            .arg(Path::new(REPOSITORY).join("contrib/install.sh"))
            .env("DESTDIR", root.path())
            .env(set, target.path())
            .env_remove(unset)
            .env("PATH", &path)
            .output()
            .expect("run contrib/install.sh");
        assert!(
            output.status.success(),
            "with {set}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            std::fs::read(root.path().join("usr/local/bin/appbroker")).unwrap(),
            std::fs::read(&built).unwrap(),
            "with {set}"
        );
    }
}

/// `systemd-analyze verify` on `unit`; fails with its words when it finds anything.
fn assert_unit_verifies(unit: &Path) {
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit)
        .output()
        .expect("systemd-analyze (apt-get install systemd) to verify the unit");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && said.trim().is_empty(),
        "systemd-analyze verify {} ({}):\n{said}",
        unit.display(),
        output.status
    );
}

#[test]
fn the_install_steps_put_every_file_in_place_under_a_temporary_root() {
    let root = tempfile::tempdir().unwrap();
    let output = install(Some(root.path()));
    let at = |path: &str| root.path().join(path.trim_start_matches('/'));
    let (bin, config, unit) = (
        at("/usr/local/bin/appbroker"),
        at("/etc/appbroker/appserver.ini"),
        at("/etc/systemd/system/appbroker.service"),
    );
    assert_eq!(mode(&bin), 0o755);
    assert_eq!(mode(&at("/etc/appbroker")), 0o755);
    assert_eq!(mode(&config), 0o644);
    assert_eq!(mode(&unit), 0o644);
    assert_eq!(
        std::fs::read(&config).unwrap(),
        std::fs::read(Path::new(REPOSITORY).join("appserver.ini.example")).unwrap()
    );
    assert_eq!(
        std::fs::read(&unit).unwrap(),
        std::fs::read(Path::new(REPOSITORY).join("contrib/appbroker.service")).unwrap()
    );
    // What the next step of README runs: the installed binary checks the installed file.
    assert_check_passes(&[], &bin, &config);
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(said.contains("systemctl enable --now appbroker"), "{said}");
    // The check it prints names the files where they were put: under the root.
    let printed = said
        .lines()
        .find(|line| line.contains("--check"))
        .unwrap_or_else(|| panic!("no check command in:\n{said}"));
    let words: Vec<&str> = printed.split_whitespace().collect();
    assert_eq!(
        words,
        [
            bin.to_str().unwrap(),
            "--check",
            "--config",
            config.to_str().unwrap()
        ],
        "{said}"
    );
    assert_check_passes(&[], Path::new(words[0]), Path::new(words[3]));

    // Installed again (an upgrade): the operator's configuration stays.
    std::fs::write(&config, "; edited by the operator\n").unwrap();
    let output = install(Some(root.path()));
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "; edited by the operator\n"
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("kept the existing"));

    // The unit names the paths the steps installed to, and what it reads exists there.
    let text = std::fs::read_to_string(&unit).unwrap();
    for path in [
        "/usr/local/bin/appbroker --check --config /etc/appbroker/appserver.ini",
        "ExecStart=/usr/local/bin/appbroker --supervise --config /etc/appbroker/appserver.ini",
        "Type=notify",
        "KillMode=mixed",
        "User=appbroker",
        "LogsDirectory=appbroker",
    ] {
        assert!(text.contains(path), "{path:?} not in the unit:\n{text}");
    }
}

#[test]
#[ignore = "needs systemd-analyze (systemd)"]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    // Installed under a temporary root; the unit's paths are pointed there, so the check
    // sees the very files the steps installed (systemd-analyze checks that they exist).
    let root = tempfile::tempdir().unwrap();
    install(Some(root.path()));
    let installed = root.path().join("usr/local/bin/appbroker");
    let text = std::fs::read_to_string(root.path().join("etc/systemd/system/appbroker.service"))
        .unwrap()
        .replace("/usr/local/bin/appbroker", &installed.display().to_string());
    let unit: PathBuf = root.path().join("appbroker.service");
    std::fs::write(&unit, text).unwrap();
    // The socket unit beside it, as installed: it names the service above.
    std::fs::copy(
        root.path().join("etc/systemd/system/appbroker.socket"),
        root.path().join("appbroker.socket"),
    )
    .unwrap();
    assert_unit_verifies(&unit);
    assert_unit_verifies(&root.path().join("appbroker.socket"));
}

#[test]
#[ignore = "needs root on a throwaway machine with CI=1: installs into /usr/local/bin and /etc, adds a user"]
fn the_install_steps_work_for_real() {
    assert!(
        std::env::var_os("CI").is_some(),
        "this installs appbroker into this machine's /usr/local/bin and /etc and adds a \
         system user; it runs only under CI=1 (a throwaway machine)"
    );
    assert!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0,
        "installing for real needs root"
    );
    install(None);
    let user = Command::new("getent")
        .args(["passwd", "appbroker"])
        .output()
        .unwrap();
    assert!(user.status.success(), "no appbroker user");
    let line = String::from_utf8_lossy(&user.stdout);
    assert!(line.trim_end().ends_with(":/usr/sbin/nologin"), "{line}");
    // The service's user can run the check the unit runs before each start.
    assert_check_passes(
        &[
            "setpriv",
            "--reuid=appbroker",
            "--regid=appbroker",
            "--clear-groups",
        ],
        Path::new("/usr/local/bin/appbroker"),
        Path::new("/etc/appbroker/appserver.ini"),
    );
    assert_unit_verifies(Path::new("/etc/systemd/system/appbroker.service"));
}

#[test]
fn the_socket_unit_listens_where_the_examples_balancers_do_and_the_service_says_what_it_is() {
    // appbroker.socket's ListenStream= lines are the example's balancers, every one of them
    // (the supervisor closes a socket no balancer names, and binds a balancer it got none for).
    let example = Path::new(REPOSITORY).join("appserver.ini.example");
    let loaded = appbroker::config::Config::from_path(&example).expect("the example loads");
    let mut balancers: Vec<String> = loaded
        .config
        .balancers
        .iter()
        .map(|b| b.listen.to_string())
        .collect();
    let socket =
        std::fs::read_to_string(Path::new(REPOSITORY).join("contrib/appbroker.socket")).unwrap();
    let mut listening: Vec<String> = socket
        .lines()
        .filter_map(|line| line.trim().strip_prefix("ListenStream="))
        .map(str::to_string)
        .collect();
    balancers.sort();
    listening.sort();
    assert_eq!(
        listening, balancers,
        "appbroker.socket and appserver.ini.example"
    );
    assert!(socket.contains("three balancers"), "{socket}");
    // The service proxies HTTP as well as TCP, and says so.
    let service =
        std::fs::read_to_string(Path::new(REPOSITORY).join("contrib/appbroker.service")).unwrap();
    let description = service
        .lines()
        .find_map(|line| line.strip_prefix("Description="))
        .expect("a Description");
    assert!(
        description.contains("TCP") && description.contains("HTTP"),
        "{description}"
    );
}
