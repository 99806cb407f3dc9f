"""The raw baseline of ``core_bench.py``: pickled requests over a Unix socket, nothing else.

A message is an 8-byte big-endian length and a pickle (protocol 5, in band). A request
is ``(method, args, want_reply)``; the reply, when wanted, is the pickled return value.
The server is a blocking socket per connection, each on its own thread, reading through
a 64 KiB ``BufferedReader`` and answering with ``sendall``. It imports only the standard
library, so its RSS is that of a bare Python process that can pickle and talk on a socket.

Run as a script:

* ``python _raw_peer.py serve NAME``: listen on the abstract Unix socket ``NAME``, print
  ``ready`` on stdout, serve until killed.
* ``python _raw_peer.py cold``: the raw cold start. Start a server process, connect, do
  one round trip, then print one JSON line of timings (``time.monotonic`` clock) and RSS.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

HEAD = struct.Struct("!Q")
SMALL = 64 * 1024
"""Below this a message's header and pickle are joined and sent with one ``sendall``."""


# -- the server ---------------------------------------------------------------------------


class _Handler:
    """The methods of the raw server, one instance per connection."""

    def __init__(self) -> None:
        self.ticks = 0

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        if method == "ping":
            return None
        if method == "echo":
            return args[0]
        if method == "sink":
            return None
        if method == "tick":
            self.ticks += 1
            return None
        if method == "ticks":
            return self.ticks
        if method == "pid":
            return os.getpid()
        raise ValueError(f"unknown method {method!r}")


def send_msg(sock: socket.socket, obj: object) -> None:
    data = pickle.dumps(obj, protocol=5)
    if len(data) < SMALL:
        sock.sendall(HEAD.pack(len(data)) + data)
    else:
        # two sends rather than one concatenation, which would copy the payload once more
        sock.sendall(HEAD.pack(len(data)))
        sock.sendall(data)


def _reader(sock: socket.socket) -> io.BufferedReader:
    return io.BufferedReader(sock.makefile("rb", buffering=0), SMALL)


def recv_msg(rfile: io.BufferedReader) -> Any:
    head = rfile.read(HEAD.size)
    if len(head) < HEAD.size:
        raise EOFError("peer closed the connection")
    (n,) = HEAD.unpack(head)
    if n < SMALL:
        data: bytes | bytearray = rfile.read(n)
    else:
        data = bytearray(n)
        rfile.readinto(data)
    if len(data) != n:
        raise EOFError("peer closed the connection mid-message")
    return pickle.loads(data)


def _serve_connection(conn: socket.socket) -> None:
    handler = _Handler()
    with conn, _reader(conn) as rfile:
        try:
            while True:
                method, args, want_reply = recv_msg(rfile)
                result = handler.call(method, args)
                if want_reply:
                    send_msg(conn, result)
        except (EOFError, ConnectionError):
            return


def _die_with_parent() -> None:
    """Have the kernel kill this process when its parent dies (Linux), as monarch procs do."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(name: str) -> None:
    _die_with_parent()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_connection, args=(conn,), daemon=True).start()


# -- clients --------------------------------------------------------------------------


class RawClient:
    """A blocking client: one request, then its reply."""

    def __init__(self, name: str, timeout: float | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect("\0" + name)
        self.rfile = _reader(self.sock)

    def call(self, method: str, *args: Any) -> Any:
        send_msg(self.sock, (method, args, True))
        return recv_msg(self.rfile)

    def request(self, method: str, *args: Any) -> None:
        """Send a request that wants a reply; ``recv`` reads the reply."""
        send_msg(self.sock, (method, args, True))

    def recv(self) -> Any:
        return recv_msg(self.rfile)

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


class AsyncRawClient:
    """The same over asyncio streams: for ``await``-style round trips and pipelining."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, name: str) -> AsyncRawClient:
        reader, writer = await asyncio.open_unix_connection("\0" + name, limit=SMALL)
        return cls(reader, writer)

    def write(self, method: str, args: tuple[Any, ...], want_reply: bool) -> None:
        data = pickle.dumps((method, args, want_reply), protocol=5)
        self.writer.write(HEAD.pack(len(data)) + data)

    async def read(self) -> Any:
        (n,) = HEAD.unpack(await self.reader.readexactly(HEAD.size))
        return pickle.loads(await self.reader.readexactly(n))

    async def call(self, method: str, *args: Any) -> Any:
        self.write(method, args, True)
        await self.writer.drain()
        return await self.read()

    async def aclose(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


def start_server(name: str, timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """Start ``serve(name)`` in a fresh Python process; returns once it listens."""
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "serve", name],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until "ready" (or EOF if it died)
    if line.strip() != b"ready":
        proc.kill()
        raise RuntimeError(f"raw server did not start (exit code {proc.wait(timeout)})")
    return proc


def cpu_ticks(pids: Sequence[int]) -> int:
    """utime + stime of ``pids``, in clock ticks, all threads (``/proc/PID/stat``)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)
    return total


def rss_kib(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB (empty where /proc is unavailable)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def pss_kib(pid: int | str = "self") -> int | None:
    """A process's proportional set size in KiB: pages shared with other processes (a
    forked proc's with its zygote and siblings) counted by share (None where unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "Pss":
                    return int(value.split()[0])
    except OSError:
        pass
    return None


# -- the raw cold start -------------------------------------------------------------------


def cold() -> None:
    started = time.monotonic()
    name = f"core-bench-raw-cold-{os.getpid()}"
    server = start_server(name)
    try:
        client = RawClient(name, timeout=30.0)
        pid = client.call("pid")
        replied = time.monotonic()
        for _ in range(3):
            client.call("ping")
        doc = {
            "t_main": started,
            "t_spawn": started,
            "t_reply": replied,
            "controller_rss": rss_kib(),
            "worker_rss": rss_kib(pid),
        }
        client.close()
    finally:
        server.kill()
        server.wait()
    print(json.dumps(doc), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        try:
            serve(sys.argv[2])
        except KeyboardInterrupt:
            pass
    elif sys.argv[1:] == ["cold"]:
        cold()
    else:
        sys.exit("usage: _raw_peer.py serve NAME | _raw_peer.py cold")
