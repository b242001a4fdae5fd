#!/usr/bin/env python3
"""What a wave of idle keep-alive HTTP clients leaves in appbroker's memory.

Starts the release appbroker on an HTTP balancer over an origin of this script's own (one
process, asyncio, a 65-byte answer), then, for each wave: N clients connect, each sends one
GET with server 01's session cookie (so no session is made: the wave is connections only),
reads its answer and stays idle; then all close. The broker's VmRSS (/proc/<pid>/status) is
read before the first wave, while a wave is held, and after it closed (once the broker's
client connections are gone and 5 s more, sampled every 0.5 s, the last sample kept). The
clients and the origin run in processes of their own, so nothing of theirs is counted.

    python3 benches/wave.py                         # target/release/appbroker, 10,000 clients, 3 waves
    python3 benches/wave.py --binary PATH --connections 10000 --waves 3
    python3 benches/wave.py --websocket             # the same with idle WebSocket tunnels

With `--websocket` each client's GET asks for `Upgrade: websocket`, the origin answers 101 and
both ends then stay silent: what is held is an idle upgraded tunnel through the broker (the
relay's two sockets, no HTTP state), to compare with a TCP relay's idle connection
(benches/memory.py).

Prints one line per wave and a JSON line last. Standard library only; every phase bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import resource
import socket
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"
# The benchmark's secret and server 01's cookie signed with it (benches/appbroker-http.ini).
SECRET = "the benchmark's session secret, 32+ characters"
COOKIE = "TOTVS_BROKER_SH_001=01.QmVuY2hGaXjtvSAg5VUO5w"
BODY = b"x" * 65
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 65\r\n\r\n" + BODY
SWITCHING = (
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
)
UPGRADE = (
    "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


async def origin(port: int) -> None:
    """Answers every request head with the same answer, keeping the connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    break
                if b"upgrade: websocket" in head.lower():
                    writer.write(SWITCHING)
                    await writer.drain()
                    await reader.read()  # a silent tunnel, until the broker closes it
                    break
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, HOST, port, backlog=4096)
    async with server:
        await asyncio.sleep(3600)


async def wave(port: int, n: int, websocket: bool, hold: asyncio.Event, release: asyncio.Event) -> int:
    """N clients, one GET each (an upgrade with `websocket`), held until `release`; the failures."""
    upgrade = UPGRADE if websocket else ""
    request = f"GET / HTTP/1.1\r\nHost: {HOST}:{port}\r\nCookie: {COOKIE}\r\n{upgrade}\r\n".encode()
    status = b"HTTP/1.1 101" if websocket else b"HTTP/1.1 200"
    gate = asyncio.Semaphore(200)
    writers: list[asyncio.StreamWriter] = []
    failed = 0

    async def one() -> None:
        nonlocal failed
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 10)
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                if not websocket:
                    await asyncio.wait_for(reader.readexactly(len(BODY)), 10)
                if not head.startswith(status):
                    failed += 1
                writers.append(writer)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                failed += 1

    await asyncio.gather(*(one() for _ in range(n)))
    hold.set()
    await release.wait()
    for writer in writers:
        writer.close()
    return failed


def clients_role(port: int, n: int, websocket: bool) -> None:
    """A wave, driven by lines on standard input: the parent says when to close."""
    raise_nofile()

    async def main() -> None:
        hold, release = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(wave(port, n, websocket, hold, release))
        await hold.wait()
        print("held", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        release.set()
        failed = await task
        print(f"closed {failed}", flush=True)

    asyncio.run(main())


def rss(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def connections(pid: int, port: int) -> int:
    """The broker's established sockets on its listening port (its clients)."""
    out = subprocess.run(
        ["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
        capture_output=True, text=True, timeout=30,
    ).stdout
    return len([line for line in out.splitlines() if line.strip()])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="target/release/appbroker")
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--waves", type=int, default=3)
    p.add_argument("--websocket", action="store_true", help="hold idle WebSocket tunnels, not kept-alive clients")
    p.add_argument("--role", choices=["origin", "clients"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "origin":
        raise_nofile()
        asyncio.run(origin(args.port))
        return
    if args.role == "clients":
        clients_role(args.port, args.connections, args.websocket)
        return
    raise_nofile()
    listen, server = free_port(), free_port()
    work = pathlib.Path(tempfile.mkdtemp(prefix="wave-"))
    ini = work / "appserver.ini"
    ini.write_text(
        f"[General]\nWORKERS=2\nSESSION_SECRET={SECRET}\nConsoleLog=0\nConsoleFile={work}/broker.log\n\n"
        f"[BALANCE_HTTP]\nLOCAL_SERVER_ADDRESS={HOST}\nLOCAL_SERVER_PORT={listen}\n"
        f"MONITORING_TYPE=DISABLED\nHTTP_REQUEST_TIMEOUT=60s\nHTTP_POOL_MAX_IDLE=32\n"
        f"REMOTE_SERVER_01={HOST} {server}\nREMOTE_SERVER_02={HOST} {server}\n"
    )
    me = [sys.executable, __file__]
    origin_proc = subprocess.Popen(me + ["--role", "origin", "--port", str(server)])
    broker = subprocess.Popen([args.binary, "--config", str(ini)], stdout=subprocess.DEVNULL)
    results = []
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection((HOST, listen), 1).close()
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(1)
        # Warm up: a few hundred requests, so the first wave does not count the first use.
        warm = subprocess.run(
            me + ["--role", "clients", "--port", str(listen), "--connections", "200"],
            input="\n", capture_output=True, text=True, timeout=120,
        )
        assert "closed 0" in warm.stdout, warm.stdout + warm.stderr
        time.sleep(2)
        before = rss(broker.pid)
        for n in range(args.waves):
            clients = subprocess.Popen(
                me + ["--role", "clients", "--port", str(listen), "--connections", str(args.connections)]
                + (["--websocket"] if args.websocket else []),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )
            assert clients.stdout.readline().strip() == "held"
            time.sleep(1)
            held = rss(broker.pid)
            open_now = connections(broker.pid, listen)
            clients.stdin.write("\n")
            clients.stdin.flush()
            failed = clients.stdout.readline().strip()
            clients.wait(timeout=120)
            end = time.time() + 60
            while connections(broker.pid, listen) > 0 and time.time() < end:
                time.sleep(0.5)
            samples = []
            for _ in range(10):
                time.sleep(0.5)
                samples.append(rss(broker.pid))
            after = samples[-1]
            row = {
                "wave": n + 1, "held_connections": open_now, "clients": failed,
                "rss_before": before, "rss_held": held, "rss_after": after,
                "per_client_held": (held - before) / max(open_now, 1),
                "after_over_before": after / before,
            }
            results.append(row)
            print(
                f"wave {n + 1}: {open_now} held ({failed}); RSS before {before >> 10} KiB, held "
                f"{held >> 10} KiB ({row['per_client_held']:.0f} B/client), after {after >> 10} KiB "
                f"({row['after_over_before']:.2f}x before)",
                flush=True,
            )
    finally:
        broker.terminate()
        origin_proc.terminate()
        broker.wait(timeout=30)
    print(json.dumps({"binary": args.binary, "websocket": args.websocket, "waves": results}))


if __name__ == "__main__":
    main()
