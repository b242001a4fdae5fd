#!/usr/bin/env python3
"""Memory per idle connection of a TCP proxy: user space and kernel, measured separately.

The script holds N idle client connections through a proxy to echo servers and measures the
proxy's process (or process tree: nginx's master and its workers) before and while holding
them. The echo servers and the clients run in two other processes (this same file, started
with --role server and --role clients), so nothing of theirs is counted against the proxy.

Each client connects through the proxy, sends one short line, checks that exactly that line
comes back (so the proxy's buffers were used once), then idles. Every connection that fails,
gets a wrong echo, or is closed during the hold is counted and reported.

What is measured, for the proxy's processes:
  user space   VmRSS and RssAnon from /proc/<pid>/status, Pss from /proc/<pid>/smaps_rollup;
               the headline is VmRSS for one process, Pss for several (VmRSS would count the
               pages forked workers share once per worker)
  kernel       socket buffer memory: the sum of skmem r+w+f+o over the proxy's own sockets
               (`ss -tmpn`, filtered by pid); socket structures: the proxy's new sockets times
               the object sizes of one TCP socket's slabs (TCP, sock_inode_cache, filp, dentry,
               eventpoll_epi) from /proc/slabinfo, an estimate, reported apart
  pipes        pipe descriptors in /proc/<pid>/fd, their capacity (F_GETPIPE_SZ) and the bytes
               queued in them (FIONREAD), for proxies that splice through pipes
and prints bytes per connection (the increase while holding, divided by the connections held),
then one JSON line (the last line of output) for scripts.

Any proxy, given its port and pid; the echo servers are started here on the ports its
configuration forwards to:
    python3 benches/memory.py --proxy-port 5000 --proxy-pid 1234 --server-port 6001 \\
        --server-port 6002 --connections 8000
appbroker in one command (release build at target/release/appbroker, generated config, two
echo servers on free ports):
    python3 benches/memory.py --appbroker

Standard library only (Python 3.11). Every phase has a timeout; the whole run is bounded by
--deadline. The clients and the servers raise their open-file limit to the hard limit.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import fcntl
import json
import os
import pathlib
import queue
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import threading
import time

HOST = "127.0.0.1"
F_GETPIPE_SZ = 1032  # linux/fcntl.h; the fcntl module names it only from Python 3.12 on
# The slabs one TCP socket's objects come from: the socket itself, its inode, its file, its
# dentry, and its entry in an epoll set (every event-driven proxy has one per socket).
SOCKET_SLABS = ("TCP", "sock_inode_cache", "filp", "dentry", "eventpoll_epi")


# ---------------------------------------------------------------------------------------------
# Child roles: the echo servers and the clients.


def raise_nofile() -> int:
    """Raises the soft open-file limit to the hard limit; returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def emit(message: dict) -> None:
    """One JSON line to the parent."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(ports: list[int]) -> None:
    """Echo servers on `ports` (0: any free port) until standard input closes."""
    limit = raise_nofile()
    servers = [await asyncio.start_server(echo, HOST, p, backlog=4096) for p in ports]
    bound = [s.sockets[0].getsockname()[1] for s in servers]
    emit({"phase": "listening", "ports": bound, "nofile": limit})
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)  # the parent closes it to stop us
    for s in servers:
        s.close()


async def clients(port: int, count: int, concurrency: int, timeout: float) -> None:
    """Opens `count` connections through the proxy on `port`, one echo each, holds them, and
    answers the parent's commands on standard input: `check` (how many were closed while held)
    and `close`."""
    limit = raise_nofile()
    if count + 64 > limit:
        emit({"phase": "error", "error": f"{count} connections need more than the open-file limit {limit}"})
        return
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    errors: collections.Counter[str] = collections.Counter()
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        line = f"memory-bench connection {i:06d}\n".encode()
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
            except (OSError, asyncio.TimeoutError) as e:
                errors[f"connect: {type(e).__name__} {getattr(e, 'strerror', '') or ''}".strip()] += 1
                return
            try:
                writer.write(line)
                await writer.drain()
                got = await asyncio.wait_for(reader.readexactly(len(line)), timeout)
            except asyncio.IncompleteReadError:
                errors["closed before the echo"] += 1
                writer.close()
                return
            except (OSError, asyncio.TimeoutError) as e:
                errors[f"exchange: {type(e).__name__}"] += 1
                writer.close()
                return
            if got != line:
                errors["wrong echo"] += 1
                writer.close()
                return
            held.append((reader, writer))

    started = time.monotonic()
    tasks = [asyncio.create_task(one(i)) for i in range(count)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout * (1 + count / concurrency))
    except asyncio.TimeoutError:
        unfinished = sum(1 for t in tasks if not t.done())
        for t in tasks:
            t.cancel()
        errors["connect phase timed out"] += unfinished
    emit(
        {
            "phase": "held",
            "ok": len(held),
            "failed": count - len(held),
            "errors": dict(errors),
            "seconds": round(time.monotonic() - started, 2),
            "nofile": limit,
        }
    )
    loop = asyncio.get_running_loop()
    while True:
        command = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if command == "check":
            # A connection the proxy closed (or sent anything on) while idle is a failure.
            dropped = sum(
                1 for r, w in held if r.at_eof() or r.exception() is not None or w.is_closing()
            )
            emit({"phase": "checked", "held": len(held), "dropped": dropped})
        else:  # "close", or the parent went away
            for _, w in held:
                w.close()
            await asyncio.wait(
                [asyncio.create_task(w.wait_closed()) for _, w in held] or [asyncio.sleep(0)],
                timeout=timeout,
            )
            emit({"phase": "closed", "count": len(held)})
            return


# ---------------------------------------------------------------------------------------------
# Measuring a process tree.


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (a proxy's workers)."""
    children = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children[ppid].append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return sorted(tree)


def status_kib(pid: int, field: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def pss_kib(pid: int) -> int:
    try:
        for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


SKMEM = re.compile(r"skmem:\(([^)]*)\)")
PID = re.compile(r"pid=(\d+),")


def socket_memory(pids: set[int]) -> dict:
    """The proxy's TCP sockets and the buffer memory the kernel charges them (skmem)."""
    out = subprocess.run(
        ["ss", "-tanmpH"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    totals = collections.Counter()
    count = 0
    # With -m each socket's skmem follows on the next line (or the same one on a terminal).
    for block in re.split(r"\n(?=\S)", out):
        owners = {int(p) for p in PID.findall(block)}
        if not owners & pids:
            continue
        m = SKMEM.search(block)
        if not m:
            continue
        count += 1
        for item in m.group(1).split(","):
            key = item.rstrip("0123456789")
            totals[key] += int(item[len(key):])
    # r: receive queue, w: send queue, f: reserved ahead (forward alloc), o: options; these are
    # what the kernel charges to TCP memory. rb/tb are limits, t is part of w.
    charged = totals["r"] + totals["w"] + totals["f"] + totals["o"]
    return {"sockets": count, "charged_bytes": charged, "parts": {k: totals[k] for k in "rwfot"}}


def pipes(pids: set[int]) -> dict:
    """Pipes the proxy holds beyond its standard streams: count, capacity and bytes queued."""
    seen: dict[str, tuple[int, int]] = {}
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            if int(fd) <= 2:
                continue
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if not target.startswith("pipe:") or target in seen:
                continue
            capacity = queued = 0
            try:
                # Opening a pipe through /proc gives another end of the same pipe.
                f = os.open(f"{fd_dir}/{fd}", os.O_RDONLY | os.O_NONBLOCK)
                try:
                    capacity = fcntl.fcntl(f, F_GETPIPE_SZ)
                    queued = int.from_bytes(
                        fcntl.ioctl(f, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder
                    )
                finally:
                    os.close(f)
            except OSError:
                pass
            seen[target] = (capacity, queued)
    return {
        "pipes": len(seen),
        "capacity_bytes": sum(c for c, _ in seen.values()),
        "queued_bytes": sum(q for _, q in seen.values()),
    }


def slab_sizes() -> dict[str, int]:
    """Object sizes of the slabs a TCP socket takes (empty when /proc/slabinfo is closed)."""
    sizes = {}
    try:
        for line in pathlib.Path("/proc/slabinfo").read_text().splitlines()[2:]:
            fields = line.split()
            if fields and fields[0] in SOCKET_SLABS:
                sizes[fields[0]] = int(fields[3])
    except OSError:
        pass
    return sizes


def sockstat_tcp_pages() -> int:
    """TCP memory of the whole machine in pages (every process's sockets, for context)."""
    for line in pathlib.Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            fields = line.split()
            return int(fields[fields.index("mem") + 1])
    return 0


def snapshot(root: int) -> dict:
    tree = descendants(root)
    pids = set(tree)
    return {
        "pids": tree,
        "vmrss_kib": sum(status_kib(p, "VmRSS") for p in tree),
        "rssanon_kib": sum(status_kib(p, "RssAnon") for p in tree),
        "pss_kib": sum(pss_kib(p) for p in tree),
        "fds": sum(len(os.listdir(f"/proc/{p}/fd")) for p in tree),
        "sockets": socket_memory(pids),
        "pipes": pipes(pids),
        "sockstat_tcp_pages": sockstat_tcp_pages(),
    }


def settle(root: int, limit: float) -> bool:
    """Waits until the proxy's RSS stops moving (within 64 KiB over 1 s), at most `limit` s."""
    end = time.monotonic() + limit
    last = status_kib(root, "VmRSS")
    while time.monotonic() < end:
        time.sleep(1.0)
        now = status_kib(root, "VmRSS")
        if abs(now - last) < 64:
            return True
        last = now
    return False


# ---------------------------------------------------------------------------------------------
# The run.


class Child:
    """A child process speaking JSON lines on its standard output."""

    def __init__(self, args: list[str], name: str):
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, phase: str, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise SystemExit(f"{self.name}: no `{phase}` within {timeout:.0f} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise SystemExit(f"{self.name} exited (code {self.proc.wait()}) before `{phase}`")
            message = json.loads(line)
            if message.get("phase") == "error":
                raise SystemExit(f"{self.name}: {message['error']}")
            if message.get("phase") == phase:
                return message

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_appbroker(binary: str, server_ports: list[int], connections: int, workdir: str):
    """appbroker with its defaults on, listening on a free port; returns (process, port, log)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    ini = pathlib.Path(workdir, "appserver.ini")
    lines = [
        "[General]",
        "SHUTDOWN_TIMEOUT=2",
        "[BALANCE_SMART_CLIENT_DESKTOP]",
        f"LOCAL_SERVER_ADDRESS={HOST}",
        f"LOCAL_SERVER_PORT={port}",
        f"MAX_CONNECTIONS={connections + 100}",
    ]
    lines += [f"REMOTE_SERVER_{i + 1:02d}={HOST} {p}" for i, p in enumerate(server_ports)]
    ini.write_text("\n".join(lines) + "\n")
    log_path = pathlib.Path(workdir, "appbroker.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [binary, "--config", str(ini)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
    )
    end = time.monotonic() + 20
    while "broker ready" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"appbroker did not start:\n{log_path.read_text()}")
        time.sleep(0.05)
    return proc, port, log_path


def warm_up(port: int, count: int = 20) -> int:
    """A few short connections through the proxy before the baseline, so one-time setup (thread
    caches, first allocations) is not counted per connection. Returns how many echoed."""
    good = 0
    for i in range(count):
        line = f"warm-up {i}\n".encode()
        try:
            with socket.create_connection((HOST, port), timeout=5) as s:
                s.sendall(line)
                got = b""
                while len(got) < len(line):
                    chunk = s.recv(len(line) - len(got))
                    if not chunk:
                        break
                    got += chunk
                good += got == line
        except OSError:
            pass
    return good


def per_conn(before: float, during: float, n: int) -> float:
    return (during - before) / n if n else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(
        description="Memory per idle connection of a TCP proxy (user space and kernel)."
    )
    p.add_argument("--appbroker", action="store_true", help="start and measure target/release/appbroker")
    p.add_argument("--binary", default=None, help="appbroker binary (default: target/release/appbroker)")
    p.add_argument("--proxy-port", type=int, help="the port clients connect to")
    p.add_argument("--proxy-pid", type=int, help="the proxy's pid (its child processes are included)")
    p.add_argument(
        "--server-port", type=int, action="append", default=[],
        help="a port the proxy forwards to; the echo servers listen there (repeat for several)",
    )
    p.add_argument("--connections", type=int, default=8000)
    p.add_argument("--concurrency", type=int, default=200, help="connects in flight at once")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for one connect or echo")
    p.add_argument("--deadline", type=float, default=600.0, help="seconds for the whole run")
    p.add_argument("--role", choices=["server", "clients"], help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.role == "server":
        asyncio.run(serve(args.server_port))
        return
    if args.role == "clients":
        asyncio.run(clients(args.proxy_port, args.connections, args.concurrency, args.timeout))
        return

    if not args.appbroker and not (args.proxy_port and args.proxy_pid and args.server_port):
        p.error("give --appbroker, or --proxy-port, --proxy-pid and --server-port")
    # The whole run is bounded: SIGALRM ends it (children are stopped on the way out).
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(SystemExit("deadline passed")))
    signal.alarm(int(args.deadline))

    children: list[Child] = []
    broker = None
    workdir = tempfile.mkdtemp(prefix="memory-bench-")
    try:
        server_ports = args.server_port or [0, 0]
        server = Child(["--role", "server", *sum((["--server-port", str(x)] for x in server_ports), [])], "echo servers")
        children.append(server)
        server_ports = server.expect("listening", 10)["ports"]

        if args.appbroker:
            root = pathlib.Path(__file__).resolve().parent.parent
            binary = args.binary or str(root / "target" / "release" / "appbroker")
            if not os.access(binary, os.X_OK):
                raise SystemExit(f"{binary} not found: run `cargo build --release` first")
            broker, proxy_port, log_path = start_appbroker(binary, server_ports, args.connections, workdir)
            proxy_pid, proxy_name = broker.pid, "appbroker"
        else:
            proxy_port, proxy_pid = args.proxy_port, args.proxy_pid
            proxy_name = pathlib.Path(f"/proc/{proxy_pid}/comm").read_text().strip()
            log_path = None

        warmed = warm_up(proxy_port)
        if warmed == 0:
            raise SystemExit(f"no echo through 127.0.0.1:{proxy_port}: is the proxy forwarding to {server_ports}?")
        settle(proxy_pid, 10)
        before = snapshot(proxy_pid)

        client = Child(
            ["--role", "clients", "--proxy-port", str(proxy_port), "--connections", str(args.connections),
             "--concurrency", str(args.concurrency), "--timeout", str(args.timeout)],
            "clients",
        )
        children.append(client)
        held = client.expect("held", args.timeout * (2 + args.connections / args.concurrency) + 30)
        settled = settle(proxy_pid, 15)
        during = snapshot(proxy_pid)
        client.send("check")
        checked = client.expect("checked", 30)
        client.send("close")
        client.expect("closed", args.timeout + 30)
        # Wait (bounded) for the proxy to close its side too, then look at what it gave back.
        end = time.monotonic() + 30
        while time.monotonic() < end and len(os.listdir(f"/proc/{proxy_pid}/fd")) > before["fds"] + 2:
            time.sleep(0.2)
        settle(proxy_pid, 10)
        after = snapshot(proxy_pid)
    finally:
        signal.alarm(0)
        for c in reversed(children):
            c.stop()
        if broker is not None:
            broker.send_signal(signal.SIGTERM)
            try:
                broker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                broker.kill()
                broker.wait()

    n = held["ok"]
    slabs = slab_sizes()
    new_sockets = during["sockets"]["sockets"] - before["sockets"]["sockets"]
    struct_bytes = new_sockets * sum(slabs.values()) if len(slabs) == len(SOCKET_SLABS) else None
    result = {
        "proxy": proxy_name,
        "proxy_pids": during["pids"],
        "proxy_port": proxy_port,
        "server_ports": server_ports,
        "connections": args.connections,
        "held": n,
        "failed": held["failed"],
        "errors": held["errors"],
        "dropped_while_held": checked["dropped"],
        "connect_seconds": held["seconds"],
        "settled": settled,
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "user_vmrss_bytes_per_conn": round(per_conn(before["vmrss_kib"], during["vmrss_kib"], n) * 1024),
        "user_rssanon_bytes_per_conn": round(per_conn(before["rssanon_kib"], during["rssanon_kib"], n) * 1024),
        "user_pss_bytes_per_conn": round(per_conn(before["pss_kib"], during["pss_kib"], n) * 1024),
        "kernel_skmem_bytes_per_conn": round(
            per_conn(before["sockets"]["charged_bytes"], during["sockets"]["charged_bytes"], n)
        ),
        "kernel_socket_structs_bytes_per_conn": round(struct_bytes / n) if struct_bytes and n else None,
        "sockets_per_conn": round(new_sockets / n, 3) if n else None,
        "pipes_per_conn": round(per_conn(before["pipes"]["pipes"], during["pipes"]["pipes"], n), 3),
        "pipe_capacity_bytes_per_conn": round(
            per_conn(before["pipes"]["capacity_bytes"], during["pipes"]["capacity_bytes"], n)
        ),
        "pipe_queued_bytes_per_conn": round(
            per_conn(before["pipes"]["queued_bytes"], during["pipes"]["queued_bytes"], n)
        ),
        "slab_object_sizes": slabs,
        "before": before,
        "during": during,
        "after_release": after,
    }
    result["kernel_total_bytes_per_conn"] = result["kernel_skmem_bytes_per_conn"] + (
        result["kernel_socket_structs_bytes_per_conn"] or 0
    )
    # One process: VmRSS. Several (forked workers): VmRSS counts their shared pages once per
    # process, Pss shares them out, so Pss is the figure.
    result["user_measure"] = "VmRSS" if len(during["pids"]) == 1 else "Pss"
    result["user_bytes_per_conn"] = result[f"user_{result['user_measure'].lower()}_bytes_per_conn"]
    result["total_bytes_per_conn"] = result["user_bytes_per_conn"] + result["kernel_total_bytes_per_conn"]

    kib = lambda b: f"{b / 1024:,.1f} KiB"  # noqa: E731
    print(f"proxy: {proxy_name} pid(s) {during['pids']} on {HOST}:{proxy_port} -> echo servers {server_ports}")
    print(f"machine: {os.cpu_count()} cpus, kernel {os.uname().release}")
    print(
        f"connections: {n} of {args.connections} held idle after one echo each "
        f"({held['failed']} failed{' ' + json.dumps(held['errors']) if held['errors'] else ''}, "
        f"{checked['dropped']} closed while held; "
        f"opened in {held['seconds']} s)"
    )
    print(f"{'':32}{'before':>14}{'holding':>14}{'released':>14}")
    rows = [
        ("VmRSS", "vmrss_kib", 1024),
        ("RssAnon", "rssanon_kib", 1024),
        ("Pss", "pss_kib", 1024),
    ]
    for label, key, scale in rows:
        print(f"  {label:30}" + "".join(f"{kib(s[key] * scale):>14}" for s in (before, during, after)))
    print(
        f"  {'sockets (skmem r+w+f+o)':30}"
        + "".join(f"{kib(s['sockets']['charged_bytes']):>14}" for s in (before, during, after))
    )
    print(f"  {'sockets (count)':30}" + "".join(f"{s['sockets']['sockets']:>14}" for s in (before, during, after)))
    print(f"  {'pipes (count)':30}" + "".join(f"{s['pipes']['pipes']:>14}" for s in (before, during, after)))
    print(f"  {'open descriptors':30}" + "".join(f"{s['fds']:>14}" for s in (before, during, after)))
    print("per connection held (increase while holding / connections):")
    print(f"  user space  {result['user_measure']} {result['user_bytes_per_conn']:,} B  "
          f"(VmRSS {result['user_vmrss_bytes_per_conn']:,} B, RssAnon {result['user_rssanon_bytes_per_conn']:,} B, "
          f"Pss {result['user_pss_bytes_per_conn']:,} B)")
    print(f"  kernel      socket buffers (skmem) {result['kernel_skmem_bytes_per_conn']:,} B, "
          f"{result['sockets_per_conn']} sockets")
    if struct_bytes is not None:
        print(f"              socket structures {result['kernel_socket_structs_bytes_per_conn']:,} B "
              f"(estimate: sockets x slab object sizes {slabs})")
    print(f"  pipes       {result['pipes_per_conn']} per connection, capacity "
          f"{result['pipe_capacity_bytes_per_conn']:,} B, queued {result['pipe_queued_bytes_per_conn']:,} B")
    print(f"  total       {result['total_bytes_per_conn']:,} B (user space + kernel)")
    if held["failed"] or checked["dropped"]:
        print(f"FAILURES: {held['failed']} connections not served, {checked['dropped']} dropped while held")
        if log_path:
            print(f"appbroker log: {log_path}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, separators=(",", ":")))
    sys.exit(1 if held["failed"] or checked["dropped"] else 0)


if __name__ == "__main__":
    main()
