#!/usr/bin/env python3
"""Hostile HTTP/2 clients for tests/http2_tools.rs, over Python's `h2` package (frames built
with its `hyperframe` where `h2` itself refuses to send them): each attack named on the
command line, against the broker at HOST:PORT over TLS with ALPN h2. It prints one JSON line
saying what the broker did: the GOAWAY's error code, the streams it reset and how, the
answers it gave, whether it closed the connection, how much the attack sent before that.

    http2_hostile.py ATTACK PORT

Attacks: continuation (CONTINUATION frames without end), oversized (a 100 KiB header),
pseudo (invalid pseudo-headers and fields, one stream each), data_after_end (DATA on a stream
the client ended), ping (a PING flood, acks never read), settings (a SETTINGS flood).
"""

import json
import socket
import ssl
import sys
import time

import h2.config
import h2.connection
import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

# Every wait bounded: an attack runs this long at most.
DEADLINE = 10.0


def connect(port):
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    sock = context.wrap_socket(raw, server_hostname="localhost")
    assert sock.selected_alpn_protocol() == "h2", sock.selected_alpn_protocol()
    config = h2.config.H2Configuration(
        client_side=True,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
        validate_inbound_headers=False,
    )
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock, conn


class Seen:
    """What the broker sent back."""

    def __init__(self):
        self.goaway = None
        self.resets = {}
        self.statuses = {}
        self.closed = False
        self.sent = 0
        self.blocked = False
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 65536

    def read(self, sock, until, deadline=DEADLINE):
        """Reads frames until `until(self)` holds, the connection ends, or `deadline` passes.
        Frames are parsed here, not by `h2`'s state machine: the broker answers streams that
        machine never opened (it was bypassed to send them)."""
        end = time.monotonic() + deadline
        buf = b""
        while not until(self) and not self.closed and time.monotonic() < end:
            sock.settimeout(max(0.05, end - time.monotonic()))
            try:
                data = sock.recv(65536)
            except socket.timeout:
                break
            except (ConnectionError, ssl.SSLError, OSError):
                self.closed = True
                break
            if not data:
                self.closed = True
                break
            buf += data
            while len(buf) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
                if len(buf) < 9 + length:
                    break
                frame.parse_body(memoryview(buf[9 : 9 + length]))
                buf = buf[9 + length :]
                self.take(sock, frame)

    def take(self, sock, frame):
        if isinstance(frame, GoAwayFrame):
            self.goaway = frame.error_code
        elif isinstance(frame, RstStreamFrame):
            self.resets[frame.stream_id] = frame.error_code
        elif isinstance(frame, HeadersFrame):
            # Only the broker's answers' first fields matter: a fresh decoder would lose the
            # dynamic table, so one decoder for the connection.
            fields = dict(self.decoder.decode(frame.data))
            status = fields.get(":status") or fields.get(b":status")
            if status is not None and frame.stream_id not in self.statuses:
                self.statuses[frame.stream_id] = int(status)
        elif isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            ack = SettingsFrame(0)
            ack.flags.add("ACK")
            try:
                sock.sendall(ack.serialize())
            except (ConnectionError, ssl.SSLError, OSError):
                self.closed = True

    def report(self, **more):
        out = {
            "goaway": self.goaway,
            "resets": {str(k): v for k, v in self.resets.items()},
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "closed": self.closed,
            "sent": self.sent,
            "blocked": self.blocked,
        }
        out.update(more)
        print(json.dumps(out), flush=True)


def request_headers(path, extra=()):
    return [
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", "localhost"),
        (":path", path),
    ] + list(extra)


def send_flood(sock, seen, frames, most_bytes):
    """Sends `frames` (an iterator of bytes) until the broker closes, the socket stays full
    for two seconds (backpressure: the broker stopped reading), or `most_bytes` went."""
    sock.settimeout(2.0)
    for frame in frames:
        if seen.sent >= most_bytes:
            break
        try:
            sock.sendall(frame)
        except socket.timeout:
            seen.blocked = True
            break
        except (ConnectionError, ssl.SSLError, OSError):
            seen.closed = True
            break
        seen.sent += len(frame)


def continuation(port):
    """HEADERS without END_HEADERS, then CONTINUATION frames forever (the 2024 flood): each
    adds header bytes that are decoded and held, or (as here) a block never ended."""
    sock, conn = connect(port)
    seen = Seen()
    encoder = hpack.Encoder()
    first = HeadersFrame(1)
    first.data = encoder.encode(request_headers("/flood"))
    first.flags.add("END_STREAM")
    # Literal header fields without indexing, each a new name: 16 KiB a frame.
    block = b"".join(
        encoder.encode([("x-flood-%d" % i, "v" * 200)]) for i in range(70)
    )

    def frames():
        yield first.serialize()
        while True:
            frame = ContinuationFrame(1)
            frame.data = block
            yield frame.serialize()

    send_flood(sock, seen, frames(), 64 * 1024 * 1024)
    seen.read(sock, lambda s: s.goaway is not None or 1 in s.resets or 1 in s.statuses)
    seen.report()


def oversized(port):
    """One request whose single header is 100 KiB: more than SETTINGS_MAX_HEADER_LIST_SIZE."""
    sock, conn = connect(port)
    seen = Seen()
    conn.send_headers(1, request_headers("/big", [("x-big", "b" * 100 * 1024)]), end_stream=True)
    sock.sendall(conn.data_to_send())
    # Then an ordinary one on the same connection, when the connection is still there.
    conn.send_headers(3, request_headers("/next"), end_stream=True)
    sock.sendall(conn.data_to_send())
    seen.read(sock, lambda s: (1 in s.resets or 1 in s.statuses) and 3 in s.statuses)
    seen.report()


# Malformed requests (RFC 9113 8.3, 8.2.2): each must be refused as a stream error, never
# reach a server, and leave the connection serving.
MALFORMED = [
    ("no :path", [(":method", "GET"), (":scheme", "https"), (":authority", "localhost")]),
    ("unknown pseudo", request_headers("/p") + [(":evil", "1")]),
    ("pseudo after field", [(":method", "GET"), ("x-a", "1"), (":scheme", "https"),
                            (":authority", "localhost"), (":path", "/p")]),
    ("two :path", request_headers("/p") + [(":path", "/q")]),
    ("uppercase name", request_headers("/p") + [("X-Upper", "1")]),
    ("connection field", request_headers("/p") + [("connection", "keep-alive")]),
    ("transfer-encoding", request_headers("/p") + [("transfer-encoding", "chunked")]),
    ("te not trailers", request_headers("/p") + [("te", "gzip")]),
    ("empty :path", [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"),
                     (":path", "")]),
    ("response pseudo", request_headers("/p") + [(":status", "200")]),
]


def pseudo(port):
    """Each malformed request on a connection of its own, then a good one on that connection:
    what the broker did to each (its reset, its answer, its GOAWAY)."""
    cases = {}
    for name, headers in MALFORMED:
        sock, _ = connect(port)
        seen = Seen()
        encoder = hpack.Encoder()
        for stream, fields in ((1, headers), (3, request_headers("/good"))):
            frame = HeadersFrame(stream)
            frame.data = encoder.encode(fields)
            frame.flags.add("END_HEADERS")
            frame.flags.add("END_STREAM")
            try:
                sock.sendall(frame.serialize())
            except (ConnectionError, ssl.SSLError, OSError):
                seen.closed = True
        seen.read(
            sock,
            lambda s: s.goaway is not None or ((1 in s.resets or 1 in s.statuses) and 3 in s.statuses),
        )
        sock.close()
        cases[name] = {
            "reset": seen.resets.get(1),
            "status": seen.statuses.get(1),
            "goaway": seen.goaway,
            "closed": seen.closed,
            "good": seen.statuses.get(3),
        }
    print(json.dumps({"cases": cases}), flush=True)


def data_after_end(port):
    """A request ended by its HEADERS, then DATA on that stream (half-closed: RFC 9113 5.1,
    STREAM_CLOSED), then an ordinary request on a new stream."""
    sock, conn = connect(port)
    seen = Seen()
    encoder = hpack.Encoder()
    frame = HeadersFrame(1)
    frame.data = encoder.encode(request_headers("/ended"))
    frame.flags.add("END_HEADERS")
    frame.flags.add("END_STREAM")
    data = DataFrame(1)
    data.data = b"x" * 1000
    sock.sendall(frame.serialize() + data.serialize())
    seen.read(sock, lambda s: s.goaway is not None or 1 in s.resets)
    seen.report()


def ping(port):
    """PING frames as fast as the socket takes them, their acks never read."""
    sock, conn = connect(port)
    seen = Seen()

    def frames():
        n = 0
        while True:
            n += 1
            yield PingFrame(0, opaque_data=n.to_bytes(8, "big")).serialize()

    send_flood(sock, seen, frames(), 256 * 1024 * 1024)
    seen.read(sock, lambda s: False, deadline=3.0)
    seen.report()


def settings(port):
    """SETTINGS frames as fast as the socket takes them, their acks never read."""
    sock, conn = connect(port)
    seen = Seen()

    def frames():
        while True:
            yield SettingsFrame(0, settings={0x4: 65535}).serialize()

    send_flood(sock, seen, frames(), 256 * 1024 * 1024)
    seen.read(sock, lambda s: False, deadline=3.0)
    seen.report()


ATTACKS = {
    "continuation": continuation,
    "oversized": oversized,
    "pseudo": pseudo,
    "data_after_end": data_after_end,
    "ping": ping,
    "settings": settings,
}

if __name__ == "__main__":
    ATTACKS[sys.argv[1]](int(sys.argv[2]))
