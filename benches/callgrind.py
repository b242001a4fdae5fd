#!/usr/bin/env python3
"""Instructions appbroker executes per proxied TCP connection and per HTTP request, counted
by callgrind on the broker process alone: a figure that does not move with the machine's
load, to compare two builds (before and after a change) on a busy machine.

    python3 benches/callgrind.py [options] APPBROKER [APPBROKER ...]
    python3 benches/callgrind.py target/release/appbroker /tmp/before/target/release/appbroker
    python3 benches/callgrind.py --anchors nginx,haproxy target/release/appbroker

Per binary and run, the broker runs under `valgrind --tool=callgrind` three times, with one TCP
balancer in front of an echo server and one HTTP balancer in front of a static origin (both
servers, and the client, are this script's threads, outside valgrind, on 127.0.0.1):

- base: N TCP connections (each sends B bytes, reads them back and closes), then M requests
  on one kept-alive HTTP connection (the first without a cookie, the rest with the affinity
  cookie it got), then SIGTERM;
- the same with 2N connections, and the same with 2M requests.

Only the serving is counted: once both ports listen and the monitor's first round is logged,
`callgrind_control -z` zeroes the counts (start-up is mostly aws-lc seeding its entropy from
CPU jitter, some 420 million instructions that vary with timing). Per connection = (the 2N
run's count - the base run's) / N, per request = (the 2M run's - the base run's) / M, so
shutdown and the first connection's and request's one-time costs, in every run, cancel; what
is left of the base run (base - N x per connection - M x per request) is shown as "one-time
and stop".

What would make the count move with timing is held still: the broker runs with WORKERS=1 (one
event loop: valgrind runs one thread at a time anyway), each client step waits until the
broker is idle (so each event costs one wake-up of the event loop, however busy the machine),
and glibc's malloc is tuned to do no work that depends on the heap's history
(MALLOC_TUNABLES below). The counts of repeated runs then agree within about 1%. --runs triples
are made per binary, the binaries in turn, and the median and range printed.

The broker's configuration is written into each run's directory (--keep keeps them, with
callgrind's output for callgrind_annotate and the logs). It uses only long-standing keys, so
that builds of different commits take the same file.

--anchors nginx,haproxy counts the same load through nginx (one process: `master_process off`,
one worker; the stream module for TCP, `load_module`d as Debian ships it in
libnginx-mod-stream; an HTTP/1.1 upstream with `keepalive`; no access log) and HAProxy (one
thread, `-db`; `http-reuse always`), each under callgrind beside appbroker, so the ratio is one
command. Neither has a line to wait for before counting: the counts are zeroed once both ports
listen. They set no affinity cookie: their clients send the same Cookie header appbroker's
clients send (a valid TOTVS_BROKER_SH_001 value from the second request on), passed through.

--anchors tokio-floor counts benches/tokio-floor (build it first: `cargo build --release
--manifest-path benches/tokio-floor/Cargo.toml`): the least a proxy on tokio does, as
appbroker's workers run it (one current-thread runtime, a task per client, a connect, a read
then a write each way into a buffer that is not zeroed), both ports relayed as plain TCP (the
HTTP requests pass through as bytes): the runtime's share of appbroker's counts, which no
change of the broker's own code can go below.
"""

import argparse
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Bound on any one connect, read or write of the client: generous, since the broker runs
# some 50 times slower under valgrind, on a machine that may be busy.
IO_TIMEOUT = 60
# Bound on the broker's start (until both ports listen, then until the monitor's first round is
# logged) and on its exit after SIGTERM.
START_TIMEOUT = 120
STOP_TIMEOUT = 120
# glibc's malloc with no work whose amount depends on the heap's history, which varies with the
# timing of a run: no fast bins (whose consolidation costs as many chunks as wait in them), a
# fixed mmap threshold (by default it moves with what was freed), no trimming.
MALLOC_TUNABLES = ":".join(
    [
        "glibc.malloc.mxfast=0",
        "glibc.malloc.mmap_threshold=262144",
        "glibc.malloc.trim_threshold=268435456",
    ]
)
# The origin's answer, fixed: the figure is the broker's cost, not the body's.
BODY = b"appbroker callgrind origin: a fixed, small body of 64 bytes....\n"

CONFIG = """\
; Written by benches/callgrind.py: one TCP and one HTTP balancer on loopback, nothing that
; writes per connection or request (no connection or request log, no state file, no control
; socket); the monitor's next round (one runs at start) and the HTTP pool's idle timeout 10
; minutes away, beyond any run (QUARANTINE_TIME with them, which must not be shorter), so that
; only the clients' work differs between runs. The query sniff waits its longest (5 s): valgrind
; runs the broker some 50 times slower than the clock its timers keep, and a client held up
; past the default 200 ms between its connect and its first bytes (a busy machine) would be
; forwarded by the sniff's timeout instead, a path with more wake-ups, so that the count moved
; with the machine's load.
[General]
WORKERS={workers}
ConsoleLog=0
ConsoleFile={dir}/appbroker.log
CONTROL_SOCKET=0
STATE_FILE=0
SESSION_SECRET=benches/callgrind.py's session secret, 32+ characters

[BALANCE_SMART_CLIENT_DESKTOP]
LOCAL_SERVER_ADDRESS=127.0.0.1
LOCAL_SERVER_PORT={tcp_port}
LOG_CONNECTIONS=0
QUERY_SNIFF_TIMEOUT=5s
MONITOR_INTERVAL=600s
QUARANTINE_TIME=600s
REMOTE_SERVER_01=127.0.0.1 {echo_port}
REMOTE_SERVER_02=127.0.0.1 {echo_port}

[BALANCE_HTTP]
LOCAL_SERVER_ADDRESS=127.0.0.1
LOCAL_SERVER_PORT={http_port}
SORT_METHOD=CONNECTION
HTTP_POOL_MAX_IDLE=32
HTTP_POOL_IDLE_TIMEOUT=600s
HTTP_FORWARDED_HEADERS=1
LOG_REQUESTS=0
MONITOR_INTERVAL=600s
QUARANTINE_TIME=600s
REMOTE_SERVER_01=127.0.0.1 {origin_port}
REMOTE_SERVER_02=127.0.0.1 {origin_port}
"""


# nginx under callgrind, one process: the same two ports in front of the same servers.
NGINX_CONFIG = """\
load_module {module};
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 1024; }}
stream {{
    upstream echo {{ server 127.0.0.1:{echo_port}; }}
    server {{ listen 127.0.0.1:{tcp_port}; proxy_pass echo; }}
}}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    upstream origin {{ server 127.0.0.1:{origin_port}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{http_port};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
    }}
}}
"""

# HAProxy under callgrind, one thread: the same two ports in front of the same servers.
HAPROXY_CONFIG = """\
global
    nbthread 1
defaults
    timeout connect 5s
    timeout client 600s
    timeout server 600s
listen tcp
    mode tcp
    bind 127.0.0.1:{tcp_port}
    server echo 127.0.0.1:{echo_port}
listen http
    mode http
    bind 127.0.0.1:{http_port}
    option forwardfor
    http-reuse always
    server origin 127.0.0.1:{origin_port}
"""

# The cookie anchors' clients send from their second request on: a valid appbroker cookie's
# shape, passed through to the origin.
ANCHOR_COOKIE = "TOTVS_BROKER_SH_001=01.AAAAAAAAAAAAAAAAAAAAAA"


def echo_server():
    """An echo server on a free loopback port, a thread per connection; returns the port."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)

    def echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


class Origin(BaseHTTPRequestHandler):
    """A static origin: HTTP/1.1 with keep-alive, the same 200 for every GET."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


def origin_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """Whether something listens on 127.0.0.1:`port`, read from /proc without connecting (a
    connection would be one more for the broker to count)."""
    want = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        return any(
            fields[1] == want and fields[3] == "0A"
            for fields in (line.split() for line in f.readlines()[1:])
        )


def idle(pid):
    """Waits until every thread of `pid` sleeps: the broker has done all it can with what it
    was sent so far and waits in its event loop (or for a lock of valgrind's, which only a
    running thread holds)."""
    deadline = time.monotonic() + IO_TIMEOUT
    tasks = f"/proc/{pid}/task"
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(tasks):
            try:
                with open(f"{tasks}/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass
        if all(state in "SD" for state in states):
            return
        time.sleep(0.0005)
    raise RuntimeError(f"the broker (pid {pid}) was still busy after {IO_TIMEOUT} s")


def tcp_clients(port, connections, size, broker):
    """`connections` connections one after another: `size` bytes out (the first an `x`, which
    the query sniffing passes at once), the same bytes back, close. Each step waits for the
    broker to be idle, so that each event wakes its event loop once, whatever the machine's
    load: otherwise how many events one wake-up finds varies from run to run, and with it the
    event loop's own instructions (by some 10% of a connection's)."""
    payload = b"x" + bytes(i % 251 for i in range(size - 1))
    for _ in range(connections):
        with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT) as s:
            idle(broker)
            s.sendall(payload)
            got = bytearray()
            while len(got) < size:
                chunk = s.recv(size - len(got))
                if not chunk:
                    break
                got += chunk
            if bytes(got) != payload:
                raise RuntimeError(f"the echo through the broker came back {len(got)} of {size}")
            idle(broker)
        idle(broker)


def http_client(port, requests, broker, sets_cookie=True):
    """`requests` GETs on one kept-alive connection, each once the broker is idle; the first
    brings the affinity cookie the others send (an anchor, which sets none: the others send
    ANCHOR_COOKIE)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=IO_TIMEOUT)
    cookie = None
    try:
        for _ in range(requests):
            idle(broker)
            conn.request("GET", "/", headers={"Cookie": cookie} if cookie else {})
            answer = conn.getresponse()
            body = answer.read()
            if answer.status != 200 or body != BODY:
                raise RuntimeError(f"the broker answered {answer.status} with {len(body)} bytes")
            if cookie is None and not sets_cookie:
                cookie = ANCHOR_COOKIE
            elif cookie is None:
                set_cookie = answer.getheader("Set-Cookie") or ""
                cookie = set_cookie.split(";")[0]
                if not cookie.startswith("TOTVS_BROKER_SH_001="):
                    raise RuntimeError(f"no affinity cookie in the first answer: {set_cookie!r}")
            if answer.getheader("Connection", "").lower() == "close":
                raise RuntimeError("the broker closed the kept-alive connection")
    finally:
        conn.close()


# The anchors --anchors may name, counted beside appbroker.
ANCHORS = ("nginx", "haproxy", "tokio-floor")
# benches/tokio-floor's binary, built by its own `cargo build --release --manifest-path`.
TOKIO_FLOOR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "tokio-floor", "target", "release", "tokio-floor"
)


def command_for(target, run_dir, ports, servers, args):
    """The command that runs `target` (an appbroker binary, or an anchor's name) on `ports` in
    front of `servers`, its configuration written into `run_dir`."""
    values = dict(
        dir=run_dir,
        tcp_port=ports[0],
        http_port=ports[1],
        echo_port=servers["echo"],
        origin_port=servers["origin"],
    )
    if target == "tokio-floor":
        return [TOKIO_FLOOR] + [
            str(port) for port in (ports[0], servers["echo"], ports[1], servers["origin"])
        ]
    if target in ANCHORS:
        text = HAPROXY_CONFIG if target == "haproxy" else NGINX_CONFIG
        conf = os.path.join(run_dir, f"{target}.conf")
        with open(conf, "w") as f:
            f.write(text.format(module=NGINX_STREAM_MODULE, **values))
        program = shutil.which(target) or f"/usr/sbin/{target}"
        if target == "haproxy":
            return [program, "-db", "-f", conf]
        return [program, "-c", conf, "-p", run_dir, "-e", f"{run_dir}/nginx-error.log"]
    ini = os.path.join(run_dir, "appserver.ini")
    with open(ini, "w") as f:
        f.write(CONFIG.format(workers=args.workers, **values))
    return [target, "--config", ini]


# Where Debian's libnginx-mod-stream puts nginx's stream module.
NGINX_STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"


def one_run(binary, servers, connections, requests, args, out):
    """Instructions of one broker process (appbroker's, or an anchor's) serving `connections`
    and `requests`."""
    run_dir = tempfile.mkdtemp(prefix="run-", dir=out)
    tcp_port, http_port = free_port(), free_port()
    counts = os.path.join(run_dir, "callgrind.out")
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counts}"]
    command += command_for(binary, run_dir, (tcp_port, http_port), servers, args)
    with open(os.path.join(run_dir, "valgrind.log"), "w") as log:
        env = dict(os.environ, GLIBC_TUNABLES=MALLOC_TUNABLES)
        broker = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not (listening(tcp_port) and listening(http_port)):
            if broker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start; see {run_dir}/valgrind.log")
            time.sleep(0.1)
        if binary not in ANCHORS:
            first_rounds(os.path.join(run_dir, "appbroker.log"))
        zero = subprocess.run(["callgrind_control", "-z", str(broker.pid)], capture_output=True)
        if zero.returncode != 0:
            raise RuntimeError(f"callgrind_control -z failed: {zero.stderr.decode().strip()}")
        tcp_clients(tcp_port, connections, args.bytes, broker.pid)
        http_client(http_port, requests, broker.pid, sets_cookie=binary not in ANCHORS)
        idle(broker.pid)
        broker.send_signal(signal.SIGTERM)
        # HAProxy exits as a process killed by SIGTERM (-15); the others 0.
        if broker.wait(timeout=STOP_TIMEOUT) not in (0, -signal.SIGTERM):
            raise RuntimeError(f"the broker exited {broker.returncode}; see {run_dir}")
    finally:
        if broker.poll() is None:
            os.killpg(broker.pid, signal.SIGKILL)
            broker.wait()
    return instructions(counts)


def first_rounds(log):
    """Waits until the monitor's round at start is logged for both balancers, so that no run
    counts part of it, nor of the start-up (the ports listen before the start-up is over)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        try:
            with open(log, errors="replace") as f:
                if sum("monitor:" in line for line in f) >= 2:
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{log}: no monitor line for both balancers within {START_TIMEOUT} s")


def instructions(path):
    """The total `Ir` of a callgrind output file (its `totals:` or `summary:` line)."""
    with open(path) as f:
        for line in f:
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise RuntimeError(f"{path}: no totals line")


def triple(binary, servers, args, out):
    """Per connection, per request and what is left of the base run, from one triple."""
    n, m = args.connections, args.requests
    b = one_run(binary, servers, n, m, args, out)
    c = one_run(binary, servers, 2 * n, m, args, out)
    r = one_run(binary, servers, n, 2 * m, args, out)
    per_conn, per_req = (c - b) / n, (r - b) / m
    print(
        f"  {binary}: base {b:,} Ir, 2N {c:,}, 2M {r:,}: per TCP connection {per_conn:,.0f}, "
        f"per HTTP request {per_req:,.0f}",
        file=sys.stderr,
        flush=True,
    )
    return per_conn, per_req, b - n * per_conn - m * per_req


def spread(values):
    median = statistics.median(values)
    return f"{median:,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("binaries", nargs="+", metavar="APPBROKER", help="appbroker binaries to compare")
    add("--anchors", default="", help="also count these beside them: nginx, haproxy, tokio-floor (comma list)")
    add("--connections", type=int, default=500, help="N, TCP connections (default 500)")
    add("--requests", type=int, default=400, help="M, HTTP requests (default 400)")
    add("--bytes", type=int, default=4096, help="B, bytes each way per connection (default 4096)")
    add("--runs", type=int, default=3, help="triples of runs per binary (default 3)")
    add("--workers", type=int, default=1, help="the broker's WORKERS (default 1)")
    add("--keep", metavar="DIR", help="keep every run's callgrind output and logs in DIR")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    for binary in args.binaries:
        if not os.access(binary, os.X_OK):
            sys.exit(f"{binary}: not an executable")
    for anchor in filter(None, args.anchors.split(",")):
        if anchor not in ANCHORS:
            sys.exit(f"--anchors: {anchor} is not one of {', '.join(ANCHORS)}")
        if anchor == "nginx" and not os.path.exists(NGINX_STREAM_MODULE):
            sys.exit(f"nginx's stream module is missing ({NGINX_STREAM_MODULE}): apt-get install libnginx-mod-stream")
        if anchor == "tokio-floor":
            if not os.access(TOKIO_FLOOR, os.X_OK):
                sys.exit(f"{TOKIO_FLOOR} is not built: cargo build --release --manifest-path benches/tokio-floor/Cargo.toml")
        elif shutil.which(anchor) is None and not os.path.exists(f"/usr/sbin/{anchor}"):
            sys.exit(f"{anchor} is not installed (apt-get install {anchor})")
        args.binaries.append(anchor)
    out = args.keep or tempfile.mkdtemp(prefix="appbroker-callgrind-")
    os.makedirs(out, exist_ok=True)
    servers = {"echo": echo_server(), "origin": origin_server()}
    # Round after round, each binary in turn: a change in the machine's load (which moves the
    # event loop's wake-ups and timer work a little) falls on every binary alike.
    figures = {binary: [] for binary in args.binaries}
    try:
        for run in range(args.runs):
            print(f"run {run + 1} of {args.runs}:", file=sys.stderr, flush=True)
            for binary in args.binaries:
                figures[binary].append(triple(binary, servers, args, out))
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    print(
        "\nInstructions (callgrind Ir) of the broker process, median (min-max) of "
        f"{args.runs} run(s); N={args.connections} TCP connections of {args.bytes} bytes each way, "
        f"M={args.requests} HTTP requests, WORKERS={args.workers}\n"
    )
    print("| binary | per TCP connection | per HTTP request | one-time and stop |")
    print("|---|---|---|---|")
    for binary, runs in figures.items():
        per_conn, per_req, fixed = zip(*runs)
        print(f"| {binary} | {spread(per_conn)} | {spread(per_req)} | {spread(fixed)} |")


if __name__ == "__main__":
    main()
