#!/usr/bin/env python3
"""System calls per proxied TCP connection, for appbroker, nginx and HAProxy, by strace.

Each proxy is started under `strace -f -c` with its side-by-side configuration (benches/
appbroker.ini, benches/nginx.conf, benches/haproxy.cfg: two workers, the same echo server
twice), serves N short connections (connect, one byte each way, the client closes first), and
is stopped after a fixed time. The same is done with no connection at all; the difference,
divided by N, is the system calls one connection costs (start-up, the monitor's rounds and the
timers of an idle proxy cancel out). The echo server and the clients run in this process,
which strace does not trace.

    python3 benches/syscalls.py                        # all three, 2000 connections each
    python3 benches/syscalls.py --only appbroker --connections 5000 --parallel 4
    python3 benches/syscalls.py --only appbroker --trace 3   # the calls of 3 connections, in order

`--parallel P` runs P client loops at once (then a worker may find several connections
queued, as under load); the default, 1, one connection at a time, shows each connection's
fixed cost. `--trace K` writes `strace -f -tt` of K connections, a quarter of a second apart,
to target/syscalls/<proxy>.trace and prints it.

Needs strace, and nginx (libnginx-mod-stream) and haproxy for their columns (a proxy that is
not installed is skipped). appbroker is target/release/appbroker (`cargo build --release`).
Standard library only; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "target" / "syscalls"
# How long each traced proxy lives after it listens, with or without connections (the same
# for both, so its timers' wake-ups cancel out), unless --window says otherwise.
WINDOW = 30.0
TRACE_SET = "trace=network,read,write,readv,writev,epoll_ctl,epoll_wait,close,shutdown,setsockopt"
# The system calls `--tool perf` counts one by one (the rest are counted together as "other").
PERF_CALLS = ["accept4", "epoll_ctl", "epoll_wait", "recvfrom", "sendto", "read", "write",
              "readv", "writev", "setsockopt", "getsockopt", "socket", "connect", "close",
              "shutdown", "ioctl", "fcntl", "clock_gettime", "splice", "futex"]


def perf_counter(out: Path) -> list[str]:
    """perf stat counting every system call, those of PERF_CALLS one by one, with their
    failures (a tracepoint filtered on a negative return)."""
    events = ["-e", "raw_syscalls:sys_enter"]
    for name in PERF_CALLS:
        events += ["-e", f"syscalls:sys_enter_{name}",
                   "-e", f"syscalls:sys_exit_{name}", "--filter", "ret < 0"]
    return ["perf", "stat", "-x,"] + events + ["-o", str(out)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def echo_server() -> int:
    """An echo server on a free loopback port, in threads of this process; returns the port."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)

    def serve(conn: socket.socket) -> None:
        conn.settimeout(10)
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
            except OSError:
                pass

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def fill(template: str, listen: int, backend: int, run: Path) -> Path:
    text = (ROOT / "benches" / template).read_text()
    module = next(
        (f"load_module {p};" for p in [Path("/usr/lib/nginx/modules/ngx_stream_module.so")]
         if p.is_file()),
        "",
    )
    for key, value in {
        "@LISTEN_PORT@": str(listen),
        "@BACKEND_PORT@": str(backend),
        "@LOG_DIR@": str(run),
        "@RUN_DIR@": str(run),
        "@LOAD_MODULE@": module,
    }.items():
        text = text.replace(key, value)
    path = run / template
    path.write_text(text)
    return path


APPBROKER = ROOT / "target" / "release" / "appbroker"


def command(proxy: str, conf: Path, run: Path) -> list[str]:
    if proxy == "appbroker":
        return [str(APPBROKER), "--config", str(conf)]
    if proxy == "nginx":
        return ["nginx", "-c", str(conf), "-p", f"{run}/", "-e", str(run / "nginx-error.log")]
    return ["haproxy", "-db", "-f", str(conf)]


def listening(port: int) -> bool:
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True,
                         timeout=5).stdout
    return bool(out.strip())


def connections(port: int, count: int, parallel: int, pause: float = 0.0) -> int:
    """`count` connections through the proxy, `parallel` at a time; returns the failures."""
    failures = [0]
    lock = threading.Lock()

    def loop(n: int) -> None:
        for _ in range(n):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(b"x")
                    if s.recv(1) != b"x":
                        raise OSError("no echo")
            except OSError:
                with lock:
                    failures[0] += 1
            if pause:
                time.sleep(pause)

    threads = [threading.Thread(target=loop, args=(count // parallel + (i < count % parallel),))
               for i in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return failures[0]


def traced(proxy: str, backend: int, strace: list[str], load,
           window: float) -> tuple[Path, int]:
    """Runs `proxy` under `strace` (its output file last), calls `load(port)` once it listens,
    and stops it `window` seconds after it listened. Returns strace's output and the failures."""
    run = OUT / proxy
    run.mkdir(parents=True, exist_ok=True)
    port = free_port()
    template = {"appbroker": "appbroker.ini", "nginx": "nginx.conf", "haproxy": "haproxy.cfg"}
    conf = fill(template[proxy], port, backend, run)
    out = Path(strace[strace.index("-o") + 1])
    child = subprocess.Popen(strace + ["--"] + command(proxy, conf, run),
                             stdout=subprocess.DEVNULL, stderr=open(run / "stderr", "w"),
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while not listening(port):
            if time.monotonic() > deadline or child.poll() is not None:
                raise SystemExit(f"{proxy} did not listen on {port}: see {run}/stderr")
            time.sleep(0.05)
        ready = time.monotonic()
        time.sleep(1)  # start-up work: the first monitor round, nginx's workers
        failures = load(port)
        left = ready + window - time.monotonic()
        if left < 0:
            raise SystemExit(f"the connections took longer than the window ({window} s): --window")
        time.sleep(left)
    finally:
        # strace's child: the proxy (nginx's master, HAProxy's master or single process).
        kids = subprocess.run(["pgrep", "-P", str(child.pid)], capture_output=True,
                              text=True).stdout.split()
        for pid in kids:
            os.kill(int(pid), signal.SIGTERM)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
    return out, failures


def summary(path: Path) -> dict[str, tuple[int, int]]:
    """strace -c's table, or perf stat's counts: system call -> (calls, errors)."""
    calls: dict[str, tuple[int, int]] = {}
    text = path.read_text()
    if "raw_syscalls:sys_enter" in text:  # perf stat -x,
        counts = {}
        for line in text.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[0].isdigit():
                counts[fields[2]] = int(fields[0])
        total = counts.pop("raw_syscalls:sys_enter", 0)
        for name in PERF_CALLS:
            n = counts.get(f"syscalls:sys_enter_{name}", 0)
            calls[name] = (n, counts.get(f"syscalls:sys_exit_{name}", 0))
            total -= n
        calls["other"] = (total, 0)
        return calls
    for line in text.splitlines():
        fields = line.split()
        if len(fields) not in (5, 6) or not fields[-1].isidentifier():
            continue
        try:
            calls[fields[-1]] = (int(fields[3]), int(fields[4]) if len(fields) == 6 else 0)
        except ValueError:
            continue
    calls.pop("total", None)
    return calls


def per_connection(proxy: str, backend: int, count: int, parallel: int, window: float,
                   tool: str) -> dict:
    run = OUT / proxy
    def counter(out: Path) -> list[str]:
        return ["strace", "-f", "-c", "-o", str(out)] if tool == "strace" else perf_counter(out)

    base, _ = traced(proxy, backend, counter(run / "idle.txt"), lambda port: 0, window)
    busy, failures = traced(proxy, backend, counter(run / "busy.txt"),
                            lambda port: connections(port, count, parallel), window)
    base, busy = summary(base), summary(busy)
    rows = {}
    for name in sorted(set(base) | set(busy)):
        calls = (busy.get(name, (0, 0))[0] - base.get(name, (0, 0))[0]) / count
        errors = (busy.get(name, (0, 0))[1] - base.get(name, (0, 0))[1]) / count
        if abs(calls) >= 0.005:
            rows[name] = (calls, errors)
    return {"rows": rows, "failures": failures}


def trace(proxy: str, backend: int, count: int, window: float) -> None:
    path = OUT / proxy / f"{proxy}.trace"
    traced(proxy, backend, ["strace", "-f", "-tt", "-e", TRACE_SET, "-o", str(path)],
           lambda port: connections(port, count, 1, pause=0.25), window)
    print(f"== {proxy}: {path}")
    print(path.read_text())


def main() -> None:
    global APPBROKER
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="appbroker,nginx,haproxy")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--trace", type=int, default=0, metavar="K")
    parser.add_argument("--window", type=float, default=WINDOW, metavar="SECONDS")
    parser.add_argument("--tool", choices=["strace", "perf"], default="strace")
    parser.add_argument("--appbroker", type=Path, default=APPBROKER, metavar="BINARY",
                        help="the appbroker binary (default: target/release/appbroker)")
    args = parser.parse_args()
    APPBROKER = args.appbroker
    tool = "strace" if args.trace else args.tool
    if not shutil.which(tool):
        raise SystemExit(f"{tool} is not installed (apt-get install {tool})")
    backend = echo_server()
    proxies = []
    for proxy in args.only.split(","):
        found = APPBROKER.is_file() if proxy == "appbroker" \
            else shutil.which(proxy)
        if found:
            proxies.append(proxy)
        else:
            print(f"{proxy}: not installed, skipped", file=sys.stderr)
    if args.trace:
        for proxy in proxies:
            trace(proxy, backend, args.trace, args.window)
        return
    results = {p: per_connection(p, backend, args.connections, args.parallel, args.window,
                                 args.tool) for p in proxies}
    names = sorted({n for r in results.values() for n in r["rows"]},
                   key=lambda n: -max(r["rows"].get(n, (0, 0))[0] for r in results.values()))
    print(f"System calls per connection ({args.connections} connections, "
          f"{args.parallel} at a time, counted by {args.tool}; errors, mostly EAGAIN, in "
          "brackets)\n")
    print("| system call | " + " | ".join(proxies) + " |")
    print("|---|" + "---|" * len(proxies))
    for name in names:
        cells = []
        for p in proxies:
            calls, errors = results[p]["rows"].get(name, (0.0, 0.0))
            cells.append(f"{calls:.2f}" + (f" ({errors:.2f})" if errors >= 0.005 else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")
    totals = [sum(c for c, _ in results[p]["rows"].values()) for p in proxies]
    print("| **all** | " + " | ".join(f"**{t:.1f}**" for t in totals) + " |")
    for p in proxies:
        if results[p]["failures"]:
            print(f"\n{p}: {results[p]['failures']} connections failed")


if __name__ == "__main__":
    main()
