#!/bin/sh
# Installs appbroker as a systemd service: the steps of README.md's "Running it for real".
#   - the binary into /usr/local/bin/appbroker;
#   - /etc/appbroker/appserver.ini from appserver.ini.example (an existing one is kept);
#   - the unit into /etc/systemd/system/appbroker.service, and appbroker.socket beside it
#     (not enabled: the alternative where systemd holds the ports);
#   - a system user `appbroker`, which the unit runs as; systemd creates /var/log/appbroker for
#     it (LogsDirectory=), where ConsoleFile may point; without ConsoleFile the journal has the log.
# It starts nothing: list your AppServers in the configuration first, then
# `systemctl enable --now appbroker`.
#
# Usage: sudo contrib/install.sh [BINARY]              BINARY defaults to release/appbroker in
#                                                       cargo's target directory
#        DESTDIR=/some/dir contrib/install.sh [BINARY]  the files only, under /some/dir, as any user
#                                                       (no user created, systemd not told)
set -eu
cd "$(dirname "$0")/.."

# Where `cargo build --release` put the binary: $CARGO_TARGET_DIR, else what cargo says
# (build.target-dir in a .cargo/config.toml, CARGO_BUILD_TARGET_DIR), else target/.
target_dir() {
    if [ -n "${CARGO_TARGET_DIR:-}" ]; then
        echo "$CARGO_TARGET_DIR"
        return
    fi
    if command -v cargo >/dev/null 2>&1; then
        dir=$(cargo metadata --format-version 1 --no-deps --offline 2>/dev/null |
            sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
        if [ -n "$dir" ]; then
            echo "$dir"
            return
        fi
    fi
    echo target
}

binary=${1:-$(target_dir)/release/appbroker}
root=${DESTDIR:-}

if [ ! -x "$binary" ]; then
    echo "install.sh: no binary at $binary; build it first (cargo build --release), or name it:" >&2
    # sudo drops CARGO_TARGET_DIR, and root may have no cargo to ask.
    echo "  sudo $0 PATH/TO/release/appbroker" >&2
    exit 1
fi
if [ -z "$root" ] && [ "$(id -u)" != 0 ]; then
    echo "install.sh: installing into the system needs root: sudo $0 $*" >&2
    exit 1
fi

install -D -m 0755 "$binary" "$root/usr/local/bin/appbroker"
install -d -m 0755 "$root/etc/appbroker"
if [ -e "$root/etc/appbroker/appserver.ini" ]; then
    echo "kept the existing $root/etc/appbroker/appserver.ini"
else
    install -m 0644 appserver.ini.example "$root/etc/appbroker/appserver.ini"
fi
install -D -m 0644 contrib/appbroker.service "$root/etc/systemd/system/appbroker.service"
install -D -m 0644 contrib/appbroker.socket "$root/etc/systemd/system/appbroker.socket"

if [ -z "$root" ]; then
    if ! getent passwd appbroker >/dev/null; then
        useradd --system --no-create-home --home-dir / --shell /usr/sbin/nologin appbroker
    fi
    # Only where systemd runs (not in a container's build step, say).
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload
    fi
fi

echo "installed. Next: list your AppServers in $root/etc/appbroker/appserver.ini, check it with"
if [ -z "$root" ]; then
    echo "  appbroker --check --config /etc/appbroker/appserver.ini"
else
    # The files are under DESTDIR, not where the check would look for them.
    echo "  $root/usr/local/bin/appbroker --check --config $root/etc/appbroker/appserver.ini"
fi
echo "then start it: systemctl enable --now appbroker (log: journalctl -u appbroker)"
