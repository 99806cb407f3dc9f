"""Throughput of monarch.transport against raw asyncio streams, per transport and backend.

Run with ``hatch run bench:transport [--quick] [--out PATH]`` (or plain ``python
benchmarks/transport_bench.py``). Every configuration runs its server in one process
and its client in another (multiprocessing, spawn); all configurations stay up for
the whole run and their repetitions are interleaved, so slow drifts of a shared
machine hit every configuration alike. Figures are medians of the repetitions.

Workloads (the client times from its first data frame to the server's last reply):

* ``small_pipelined``: N single-part 64-byte frames, queued in batches with
  ``send_nowait`` and ``flush`` (raw: ``writer.write`` per message, ``drain`` per batch);
  the server receives them all and replies once. Messages per second.
* ``small_each``: the same, but ``await conn.send`` per frame (raw: ``write`` +
  ``drain`` per message). Messages per second.
* ``large``: K single-part 64 MiB frames (``--large-size``), one way; the server acks each
  frame (the client sends them all, then collects the acks). MiB per second.
* ``roundtrip``: N 64-byte frames, each echoed by the server before the next is sent.
  Microseconds per round trip (lower is better).

Implementations: ``monarch`` on anyio's asyncio backend, asyncio with uvloop (when
importable) and trio; ``base`` (with ``--baseline-src DIR``): the same, with
``monarch.transport`` imported from another checkout's sources, to measure a change
before and after in one interleaved run; ``raw``: asyncio streams with a 4-byte length prefix per
message (``asyncio.start_server`` / ``start_unix_server``, ``readexactly``). References,
not targets: ``sock``, blocking ``sendall``/``recv_into`` into one reused buffer (large
frames only: what the kernel can do), and an in-process memcpy of 64 MiB. Nothing here
asserts on speed; the
``ratios`` section of the JSON compares monarch/asyncio with raw asyncio against the
targets (small frames >= 0.5x, 64 MiB frames >= 0.8x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import socket
import ssl
import struct
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import (
    RESULTS_DIR,
    fmt_num,
    machine_info,
    markdown_table,
    memcpy_bandwidth,
    package_versions,
    ratio_entry,
    summarize,
    write_json,
)

SECRET = b"transport-bench-secret"
SMALL_SIZE = 64
LARGE_SIZE = 64 * 1024 * 1024
MIB = 1024 * 1024
_LEN = struct.Struct("!I")

WORKLOADS = ("small_pipelined", "small_each", "large", "roundtrip")
TARGETS = {"small_pipelined": 0.5, "small_each": 0.5, "large": 0.8, "roundtrip": 1.0}
UNITS = {"small_pipelined": "msg/s", "small_each": "msg/s", "large": "MiB/s", "roundtrip": "us"}
LOWER_IS_BETTER = {"roundtrip"}


@dataclass(frozen=True)
class Spec:
    """One configuration: an implementation on a transport under an event loop."""

    impl: str  # "monarch" | "base" | "raw" | "sock"
    transport: str  # "unix" | "tcp" | "tls"
    backend: str  # "asyncio" | "uvloop" | "trio" | "blocking"
    certs: tuple[str, str] | None = None  # (ca.pem, server.pem) for tls
    src: str | None = None  # base: the directory monarch.transport is imported from

    @property
    def key(self) -> str:
        return f"{self.impl}/{self.backend}/{self.transport}"

    def runs(self, workload: str) -> bool:
        return self.impl != "sock" or workload == "large"


@dataclass(frozen=True)
class Sizes:
    small_pipelined: int
    small_each: int
    batch: int
    large_frames: int
    reps: int
    warmup: int
    roundtrips: int = 2000
    large_size: int = LARGE_SIZE


DEFAULT = Sizes(
    small_pipelined=100_000, small_each=30_000, batch=1000, large_frames=3, reps=5, warmup=1
)
QUICK = Sizes(
    small_pipelined=30_000,
    small_each=10_000,
    batch=1000,
    large_frames=1,
    reps=3,
    warmup=0,
    roundtrips=1000,
)


# -- shared helpers (run in the child processes) ----------------------------------------


def _ensure_transports() -> None:
    """Register the socket transports when their entry points are not installed."""
    from monarch import transport as mt

    have = mt.available_transports()
    if "unix" not in have:
        from monarch.transport.lowlevel import UnixTransport

        mt.register_transport(UnixTransport())
    if "tcp" not in have:
        from monarch.transport.lowlevel import TcpTransport

        mt.register_transport(TcpTransport())
    if "tls" not in have:
        from monarch.transport.lowlevel import TlsTransport

        mt.register_transport(TlsTransport())


def _server_ssl(spec: Spec) -> ssl.SSLContext:
    assert spec.certs is not None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(spec.certs[1])
    return ctx


def _client_ssl(spec: Spec) -> ssl.SSLContext:
    assert spec.certs is not None
    return ssl.create_default_context(cafile=spec.certs[0])


def _run_backend(backend: str, fn: Any, *args: Any) -> Any:
    import anyio

    if backend == "asyncio":
        return anyio.run(fn, *args, backend="asyncio")
    if backend == "uvloop":
        return anyio.run(fn, *args, backend="asyncio", backend_options={"use_uvloop": True})
    if backend == "trio":
        return anyio.run(fn, *args, backend="trio")
    raise ValueError(backend)


def _large_payload(size: int) -> bytearray:
    payload = bytearray(size)  # zero-filled: every page is touched before timing
    payload[0] = 1
    payload[-1] = 2
    return payload


def _check(kind: str, data: Any, size: int) -> str | None:
    """Cheap integrity check of one received message; returns a complaint or None."""
    if len(data) != size:
        return f"{kind}: got {len(data)} bytes, expected {size}"
    if kind == "large" and (data[0] != 1 or data[-1] != 2):
        return "large: payload bytes corrupted"
    return None


# -- monarch implementation -----------------------------------------------------------


async def _monarch_handler(conn: Any) -> None:
    from monarch.transport import ConnectionClosed

    while True:
        try:
            ctrl = await conn.receive()
        except ConnectionClosed:
            return
        cmd = json.loads(bytes(ctrl[0]))
        await conn.send([b"ready"])
        error = None
        if cmd["workload"] == "roundtrip":
            for _ in range(cmd["count"]):
                await conn.send(await conn.receive())
        elif cmd["workload"] in ("small_pipelined", "small_each"):
            for _ in range(cmd["count"]):
                frame = await conn.receive()
                if error is None and (len(frame) != 1 or len(frame[0]) != cmd["size"]):
                    error = f"bad small frame: {[len(p) for p in frame]}"
            await conn.send([(error or "ok").encode()])
        else:
            for _ in range(cmd["count"]):
                frame = await conn.receive()
                error = error or (
                    _check("large", frame[0], cmd["size"]) if len(frame) == 1 else "parts"
                )
                del frame
                await conn.send([(error or "ok").encode()])


async def _monarch_server(spec: Spec, pipe: Any) -> None:
    from monarch.transport import open_listener

    url = {"unix": "unix://@", "tcp": "tcp://127.0.0.1:0", "tls": "tls://127.0.0.1:0"}[
        spec.transport
    ]
    opts: dict[str, Any] = {}
    if spec.transport == "tls":
        opts["ssl_context"] = _server_ssl(spec)
    listener = await open_listener(url, secret=SECRET, **opts)
    async with listener:
        pipe.send(("ready", str(listener.address)))
        await listener.serve(_monarch_handler)


async def _monarch_client(spec: Spec, url: str, cmd: dict[str, Any]) -> dict[str, Any]:
    from monarch.transport import ConnectionAttribute, open_connection

    opts: dict[str, Any] = {}
    if spec.transport == "tls":
        opts["ssl_context"] = _client_ssl(spec)
    workload, count, size = cmd["workload"], cmd["count"], cmd["size"]
    payload = _large_payload(size) if workload == "large" else b"x" * size
    parts = [payload]
    conn = await open_connection(url, secret=SECRET, **opts)
    async with conn:
        await conn.send([json.dumps(cmd).encode()])
        assert bytes((await conn.receive())[0]) == b"ready"
        replies: list[Any] = []
        t0 = time.perf_counter()
        if workload == "roundtrip":
            send, receive = conn.send, conn.receive
            for _ in range(count):
                await send(parts)
                echo = await receive()
            replies.append([b"ok" if bytes(echo[0]) == payload else b"bad echo"])
        elif workload == "small_pipelined":
            batch = cmd["batch"]
            # The fast path (``--base``: a checkout from before it was a capability has
            # it on the connection itself).
            frame_queue = getattr(ConnectionAttribute, "frame_queue", None)
            queue: Any = conn if frame_queue is None else conn.extra(frame_queue)
            send_nowait, flush = queue.send_nowait, queue.flush
            for start in range(0, count, batch):
                for _ in range(min(batch, count - start)):
                    send_nowait(parts)
                await flush()
            replies.append(await conn.receive())
        elif workload == "small_each":
            send = conn.send
            for _ in range(count):
                await send(parts)
            replies.append(await conn.receive())
        else:
            for _ in range(count):
                await conn.send(parts)
            for _ in range(count):
                replies.append(await conn.receive())
        elapsed = time.perf_counter() - t0
    return {"elapsed": elapsed, "replies": [bytes(r[0]).decode() for r in replies]}


# -- raw asyncio streams baseline -------------------------------------------------------


async def _raw_read(reader: asyncio.StreamReader) -> bytes:
    (n,) = _LEN.unpack(await reader.readexactly(4))
    return await reader.readexactly(n)


async def _raw_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                ctrl = await _raw_read(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            cmd = json.loads(ctrl)
            writer.write(_LEN.pack(5) + b"ready")
            await writer.drain()
            error = None
            if cmd["workload"] == "roundtrip":
                for _ in range(cmd["count"]):
                    data = await _raw_read(reader)
                    writer.write(_LEN.pack(len(data)) + data)
                    await writer.drain()
            elif cmd["workload"] in ("small_pipelined", "small_each"):
                for _ in range(cmd["count"]):
                    (n,) = _LEN.unpack(await reader.readexactly(4))
                    data = await reader.readexactly(n)
                    if error is None and len(data) != cmd["size"]:
                        error = f"bad small message of {len(data)} bytes"
                reply = (error or "ok").encode()
                writer.write(_LEN.pack(len(reply)) + reply)
                await writer.drain()
            else:
                for _ in range(cmd["count"]):
                    (n,) = _LEN.unpack(await reader.readexactly(4))
                    data = await reader.readexactly(n)
                    error = error or _check("large", data, cmd["size"])
                    del data
                    reply = (error or "ok").encode()
                    writer.write(_LEN.pack(len(reply)) + reply)
                    await writer.drain()
    finally:
        writer.close()


async def _raw_server(spec: Spec, pipe: Any) -> None:
    if spec.transport == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind("")  # Linux autobind: a free abstract name
        name = sock.getsockname()
        server = await asyncio.start_unix_server(_raw_handler, sock=sock)
        address = "unix://@" + name[1:].decode()
    else:
        ctx = _server_ssl(spec) if spec.transport == "tls" else None
        server = await asyncio.start_server(_raw_handler, "127.0.0.1", 0, ssl=ctx)
        port = server.sockets[0].getsockname()[1]
        address = f"{spec.transport}://127.0.0.1:{port}"
    async with server:
        pipe.send(("ready", address))
        await server.serve_forever()


async def _raw_client(spec: Spec, url: str, cmd: dict[str, Any]) -> dict[str, Any]:
    if spec.transport == "unix":
        reader, writer = await asyncio.open_unix_connection("\0" + url[len("unix://@") :])
    else:
        port = int(url.rsplit(":", 1)[1])
        kwargs: dict[str, Any] = {}
        if spec.transport == "tls":
            kwargs = {"ssl": _client_ssl(spec), "server_hostname": "127.0.0.1"}
        reader, writer = await asyncio.open_connection("127.0.0.1", port, **kwargs)
    workload, count, size = cmd["workload"], cmd["count"], cmd["size"]
    payload = _large_payload(size) if workload == "large" else b"x" * size
    pack = _LEN.pack
    try:
        ctrl = json.dumps(cmd).encode()
        writer.write(pack(len(ctrl)) + ctrl)
        await writer.drain()
        assert await _raw_read(reader) == b"ready"
        replies = []
        t0 = time.perf_counter()
        if workload == "roundtrip":
            write, drain = writer.write, writer.drain
            for _ in range(count):
                write(pack(len(payload)) + payload)
                await drain()
                echo = await _raw_read(reader)
            replies.append(b"ok" if echo == payload else b"bad echo")
        elif workload == "small_pipelined":
            batch = cmd["batch"]
            write, drain = writer.write, writer.drain
            for start in range(0, count, batch):
                for _ in range(min(batch, count - start)):
                    write(pack(len(payload)) + payload)
                await drain()
            replies.append(await _raw_read(reader))
        elif workload == "small_each":
            write, drain = writer.write, writer.drain
            for _ in range(count):
                write(pack(len(payload)) + payload)
                await drain()
            replies.append(await _raw_read(reader))
        else:
            for _ in range(count):
                # two writes rather than len+payload: concatenating would copy 64 MiB
                writer.write(pack(len(payload)))
                writer.write(payload)
                await writer.drain()
            for _ in range(count):
                replies.append(await _raw_read(reader))
        elapsed = time.perf_counter() - t0
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass
    return {"elapsed": elapsed, "replies": [r.decode() for r in replies]}


# -- blocking sockets reference (large frames only) --------------------------------------


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("peer closed")
        view = view[n:]


def _sock_read(sock: socket.socket, buf: bytearray | None = None) -> memoryview:
    head = bytearray(4)
    _recv_exactly(sock, memoryview(head))
    (n,) = _LEN.unpack(head)
    if buf is None or len(buf) < n:
        buf = bytearray(n)
    view = memoryview(buf)[:n]
    _recv_exactly(sock, view)
    return view


def _sock_server(spec: Spec, pipe: Any) -> None:
    if spec.transport == "unix":
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind("")
        address = "unix://@" + lsock.getsockname()[1:].decode()
    else:
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{lsock.getsockname()[1]}"
    lsock.listen(16)
    pipe.send(("ready", address))
    buf = bytearray(LARGE_SIZE)  # reused for every frame (grown once): the kernel's ceiling
    while True:
        sock, _ = lsock.accept()
        if spec.transport == "tcp":
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with sock:
            try:
                cmd = json.loads(bytes(_sock_read(sock)))
                sock.sendall(_LEN.pack(5) + b"ready")
                for _ in range(cmd["count"]):
                    view = _sock_read(sock, buf)
                    buf = view.obj  # type: ignore[assignment]
                    reply = (_check("large", view, cmd["size"]) or "ok").encode()
                    view.release()
                    sock.sendall(_LEN.pack(len(reply)) + reply)
            except ConnectionError:
                pass


def _sock_client(spec: Spec, url: str, cmd: dict[str, Any]) -> dict[str, Any]:
    if spec.transport == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect("\0" + url[len("unix://@") :])
    else:
        sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = _large_payload(cmd["size"])
    with sock:
        ctrl = json.dumps(cmd).encode()
        sock.sendall(_LEN.pack(len(ctrl)) + ctrl)
        assert bytes(_sock_read(sock)) == b"ready"
        replies = []
        t0 = time.perf_counter()
        for _ in range(cmd["count"]):
            sock.sendall(_LEN.pack(len(payload)))
            sock.sendall(payload)
        for _ in range(cmd["count"]):
            replies.append(bytes(_sock_read(sock)).decode())
        elapsed = time.perf_counter() - t0
    return {"elapsed": elapsed, "replies": replies}


# -- processes -------------------------------------------------------------------------


def _use_src(spec: Spec) -> None:
    """``base``: import monarch.transport from the other checkout (before any import)."""
    if spec.src is not None:
        sys.path.insert(0, spec.src)


def server_main(spec: Spec, pipe: Any) -> None:
    try:
        if spec.impl in ("monarch", "base"):
            _use_src(spec)
            _ensure_transports()
            _run_backend(spec.backend, _monarch_server, spec, pipe)
        elif spec.impl == "sock":
            _sock_server(spec, pipe)
        else:
            asyncio.run(_raw_server(spec, pipe))
    except KeyboardInterrupt:
        pass
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
        raise


def client_main(spec: Spec, url: str, pipe: Any) -> None:
    if spec.impl in ("monarch", "base"):
        _use_src(spec)
        _ensure_transports()
    while True:
        cmd = pipe.recv()
        if cmd is None:
            return
        try:
            if spec.impl in ("monarch", "base"):
                result = _run_backend(spec.backend, _monarch_client, spec, url, cmd)
            elif spec.impl == "sock":
                result = _sock_client(spec, url, cmd)
            else:
                result = asyncio.run(_raw_client(spec, url, cmd))
            pipe.send(("ok", result))
        except Exception:  # noqa: BLE001 - reported to the orchestrator
            pipe.send(("error", traceback.format_exc()))


class Pair:
    """A configuration's server and client processes."""

    def __init__(self, ctx: Any, spec: Spec) -> None:
        self.spec = spec
        self.error: str | None = None
        self._server_pipe, child = ctx.Pipe()
        self.server = ctx.Process(target=server_main, args=(spec, child), daemon=True)
        self.server.start()
        child.close()
        self.client: Any = None
        self._client_pipe: Any = None
        self._ctx = ctx

    def start_client(self, timeout: float) -> None:
        if not self._server_pipe.poll(timeout):
            self.error = f"server did not start within {timeout}s"
            return
        status, value = self._server_pipe.recv()
        if status != "ready":
            self.error = f"server failed:\n{value}"
            return
        self.url = value
        self._client_pipe, child = self._ctx.Pipe()
        self.client = self._ctx.Process(
            target=client_main, args=(self.spec, value, child), daemon=True
        )
        self.client.start()
        child.close()

    def run(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._client_pipe.send(cmd)
        if not self._client_pipe.poll(timeout):
            self.error = f"{cmd['workload']} did not finish within {timeout}s"
            raise TimeoutError(self.error)
        status, value = self._client_pipe.recv()
        if status != "ok":
            raise RuntimeError(value)
        return cast("dict[str, Any]", value)

    def stop(self) -> None:
        if self.client is not None and self.client.is_alive():
            try:
                self._client_pipe.send(None)
            except OSError:
                pass
            self.client.join(5)
        for proc in (self.client, self.server):
            if proc is not None and proc.is_alive():
                proc.terminate()
                proc.join(5)
                if proc.is_alive():
                    proc.kill()


# -- orchestration ---------------------------------------------------------------------


def make_certs(tmp: Path) -> tuple[str, str] | None:
    try:
        import trustme
    except ImportError:
        return None
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_path, cert_path = tmp / "ca.pem", tmp / "server.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    return str(ca_path), str(cert_path)


def command(workload: str, sizes: Sizes) -> dict[str, Any]:
    if workload == "large":
        return {"workload": workload, "count": sizes.large_frames, "size": sizes.large_size}
    if workload == "roundtrip":
        return {"workload": workload, "count": sizes.roundtrips, "size": SMALL_SIZE}
    count = sizes.small_pipelined if workload == "small_pipelined" else sizes.small_each
    return {"workload": workload, "count": count, "size": SMALL_SIZE, "batch": sizes.batch}


def figure(workload: str, cmd: dict[str, Any], elapsed: float) -> float:
    if workload == "roundtrip":
        return float(elapsed / cmd["count"] * 1e6)
    if workload == "large":
        return float(cmd["count"] * cmd["size"] / MIB / elapsed)
    return float(cmd["count"] / elapsed)


def _progress(started: float, text: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~30 s smoke run (fewer, smaller reps)")
    p.add_argument("--reps", type=int, help="timed repetitions per figure (after a warm-up)")
    p.add_argument("--out", default=str(RESULTS_DIR / "transport.json"), help="JSON output path")
    p.add_argument("--transports", default="unix,tcp,tls", help="comma-separated subset")
    p.add_argument("--backends", default="asyncio,uvloop,trio", help="backends for monarch")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    p.add_argument("--no-raw", action="store_true", help="skip the raw asyncio baselines")
    p.add_argument("--no-sock", action="store_true", help="skip the blocking-socket reference")
    p.add_argument("--small-count", type=int, help="frames per small_pipelined repetition")
    p.add_argument("--large-frames", type=int, help="large frames per large repetition")
    p.add_argument("--large-size", type=int, help="MiB per large frame (default 64)")
    p.add_argument("--roundtrips", type=int, help="round trips per roundtrip repetition")
    p.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="also run 'base': monarch.transport from DIR (a src/ holding monarch/transport)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per repetition")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else DEFAULT
    if args.reps:
        sizes = Sizes(**{**asdict(sizes), "reps": args.reps})
    if args.small_count:
        sizes = Sizes(
            **{
                **asdict(sizes),
                "small_pipelined": args.small_count,
                "small_each": max(1, args.small_count * 3 // 10),
            }
        )
    if args.large_frames:
        sizes = Sizes(**{**asdict(sizes), "large_frames": args.large_frames})
    if args.large_size:
        sizes = Sizes(**{**asdict(sizes), "large_size": args.large_size * MIB})
    if args.roundtrips:
        sizes = Sizes(**{**asdict(sizes), "roundtrips": args.roundtrips})
    base_src = str(Path(args.baseline_src).resolve()) if args.baseline_src else None
    if base_src is not None and not (Path(base_src) / "monarch" / "transport").is_dir():
        sys.exit(f"--baseline-src {base_src} holds no monarch/transport")
    transports = [t for t in args.transports.split(",") if t]
    backends = [b for b in args.backends.split(",") if b]
    workloads = [w for w in args.workloads.split(",") if w]
    notes: list[str] = []
    for given, known in (
        (transports, ("unix", "tcp", "tls")),
        (backends, ("asyncio", "uvloop", "trio")),
        (workloads, WORKLOADS),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            sys.exit(f"unknown {', '.join(unknown)}; choose from {', '.join(known)}")

    if "uvloop" in backends:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            backends.remove("uvloop")
            notes.append("uvloop is not importable: its backend was skipped")
    if "trio" in backends:
        try:
            import trio  # noqa: F401
        except ImportError:
            backends.remove("trio")
            notes.append("trio is not importable: its backend was skipped")

    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="transport-bench-"))
    certs = None
    if "tls" in transports:
        certs = make_certs(tmp)
        if certs is None:
            transports.remove("tls")
            notes.append("trustme is not installed: tls was skipped (pip install trustme)")

    memcpy = memcpy_bandwidth(sizes.large_size, max(sizes.reps, 5))

    specs: list[Spec] = []
    for transport in transports:
        tls_certs = certs if transport == "tls" else None
        for backend in backends:
            specs.append(Spec("monarch", transport, backend, tls_certs))
            if base_src is not None:
                specs.append(Spec("base", transport, backend, tls_certs, base_src))
        if not args.no_raw:
            specs.append(Spec("raw", transport, "asyncio", tls_certs))
        if not args.no_sock and transport != "tls" and "large" in workloads:
            specs.append(Spec("sock", transport, "blocking"))

    ctx = mp.get_context("spawn")
    pairs = [Pair(ctx, spec) for spec in specs]
    results: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for pair in pairs:
            pair.start_client(60)
        _progress(started, f"{len(pairs)} server/client pairs started")
        # prime every pair (imports, first connection) outside the timed repetitions
        for pair in pairs:
            for workload in workloads:
                if pair.error is None and pair.spec.runs(workload):
                    prime = {**command(workload, sizes), "count": 10}
                    if workload == "large":
                        prime.update(count=1, size=MIB)
                    try:
                        pair.run(prime, args.timeout)
                    except Exception as exc:  # noqa: BLE001 - recorded below
                        pair.error = f"priming failed: {str(exc)[-2000:]}"
        _progress(started, "primed")
        total = sizes.warmup + sizes.reps
        for rep in range(total):
            warm = " (warm-up)" if rep < sizes.warmup else ""
            _progress(started, f"repetition {rep + 1}/{total}{warm}")
            for workload in workloads:
                cmd = command(workload, sizes)
                # rotate the order so no configuration always runs right after another
                shift = rep % len(pairs)
                for pair in pairs[shift:] + pairs[:shift]:
                    if pair.error is not None or not pair.spec.runs(workload):
                        continue
                    entry = results.setdefault(
                        (pair.spec.key, workload),
                        {
                            "impl": pair.spec.impl,
                            "backend": pair.spec.backend,
                            "transport": pair.spec.transport,
                            "workload": workload,
                            "unit": UNITS[workload],
                            **{k: v for k, v in cmd.items() if k != "workload"},
                            "elapsed": [],
                            "values": [],
                            "errors": [],
                        },
                    )
                    try:
                        out = pair.run(cmd, args.timeout)
                    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                        entry["errors"].append(str(exc)[-2000:])
                        continue
                    bad = [r for r in out["replies"] if r != "ok"]
                    if bad:
                        entry["errors"].append(f"server reported: {bad[0]}")
                    if rep >= sizes.warmup:
                        entry["elapsed"].append(out["elapsed"])
                        entry["values"].append(figure(workload, cmd, out["elapsed"]))
    finally:
        for pair in pairs:
            pair.stop()
        failures = {pair.spec.key: pair.error for pair in pairs if pair.error is not None}
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()

    figures = []
    for entry in results.values():
        values = entry.pop("values")
        figures.append({**entry, **summarize(values)})

    medians = {
        (f["impl"], f["backend"], f["transport"], f["workload"]): f["median"] for f in figures
    }

    def median(impl: str, backend: str, transport: str, workload: str) -> float | None:
        return medians.get((impl, backend, transport, workload))

    ratios = []
    if not args.no_raw and "asyncio" in backends:
        for transport in transports:
            for workload in workloads:
                ratios.append(
                    ratio_entry(
                        f"{workload}/{transport}",
                        TARGETS[workload],
                        median("monarch", "asyncio", transport, workload),
                        median("raw", "asyncio", transport, workload),
                        higher_is_better=workload not in LOWER_IS_BETTER,
                        transport=transport,
                        workload=workload,
                        unit=UNITS[workload],
                    )
                )
    against_base = []
    if base_src is not None:
        for backend in backends:
            for transport in transports:
                for workload in workloads:
                    against_base.append(
                        ratio_entry(
                            f"{workload}/{transport}/{backend}",
                            1.0,
                            median("monarch", backend, transport, workload),
                            median("base", backend, transport, workload),
                            higher_is_better=workload not in LOWER_IS_BETTER,
                            transport=transport,
                            backend=backend,
                            workload=workload,
                            unit=UNITS[workload],
                        )
                    )

    info = machine_info()
    info["load_average_end"] = info.pop("load_average", None)
    doc = {
        "benchmark": "transport",
        "machine": info,
        "packages": package_versions(["monarch-transport", "anyio", "trio", "uvloop", "trustme"]),
        "settings": {
            **asdict(sizes),
            "small_size": SMALL_SIZE,
            "baseline_src": base_src,
            "transports": transports,
            "backends": backends,
            "workloads": workloads,
            "quick": args.quick,
        },
        "duration_s": round(time.perf_counter() - started, 1),
        "memcpy": memcpy,
        "figures": figures,
        "ratios": ratios,
        "against_base": against_base,
        "failures": failures,
        "notes": notes,
    }
    out_path = write_json(args.out, doc)
    print(render_markdown(doc))
    print(f"\nJSON written to {out_path}", file=sys.stderr)
    return 0


def render_markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"## Transport throughput ({m.get('cpu_count')} CPUs, {m.get('cpu_model', '?')}, "
        f"Python {m.get('python')}, load {m.get('load_average_end')}, {doc['duration_s']} s)",
        "",
        "Median of {reps} repetitions (± half the min-max range, relative). "
        "small: 64-byte frames; large: {mib} MiB frames.".format(
            mib=doc["settings"]["large_size"] // MIB, **doc["settings"]
        ),
        "",
    ]
    by_key: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for f in doc["figures"]:
        by_key.setdefault((f["transport"], f["impl"], f["backend"]), {})[f["workload"]] = f

    def cell(f: dict[str, Any] | None) -> str:
        if f is None:
            return "-"
        if f["median"] is None:
            return "error" if f["errors"] else "-"
        text = fmt_num(f["median"])
        if f["spread"] is not None:
            text += f" ±{f['spread'] * 100:.0f}%"
        return text + (" (!)" if f["errors"] else "")

    workloads = doc["settings"]["workloads"]
    headers = ["transport", "impl", "backend"] + [
        {
            "small_pipelined": "small pipelined msg/s",
            "small_each": "small send-each msg/s",
            "large": f"{doc['settings']['large_size'] // MIB} MiB MiB/s",
            "roundtrip": "round trip us",
        }[w]
        for w in workloads
    ]
    order = {"monarch": 0, "base": 1, "raw": 2, "sock": 3}
    border = {"asyncio": 0, "uvloop": 1, "trio": 2, "blocking": 3}
    rows = []
    for (transport, impl, backend), figs in sorted(
        by_key.items(),
        key=lambda kv: (
            doc["settings"]["transports"].index(kv[0][0]),
            order[kv[0][1]],
            border[kv[0][2]],
        ),
    ):
        rows.append([transport, impl, backend] + [cell(figs.get(w)) for w in workloads])
    lines.append(markdown_table(headers, rows))
    lines.append("")
    memcpy = fmt_num(doc["memcpy"]["median"])
    mib = doc["settings"]["large_size"] // MIB
    lines.append(f"memcpy (in-process bytearray copy, {mib} MiB): {memcpy} MiB/s")
    if any(f["impl"] == "sock" for f in doc["figures"]):
        lines.append(
            "sock: blocking sendall/recv_into into one reused buffer (a kernel ceiling, "
            "not a target baseline)"
        )
    if doc["ratios"]:
        lines += ["", "monarch (anyio asyncio backend) vs raw asyncio streams:", ""]
        rrows = [
            [
                r["transport"],
                r["workload"],
                f"{r['op']} {r['target']}",
                fmt_num(r["ours"]),
                fmt_num(r["baseline"]),
                fmt_num(r["ratio"]),
                {True: "pass", False: "FAIL", None: "-"}[r["pass"]],
            ]
            for r in doc["ratios"]
        ]
        lines.append(
            markdown_table(
                ["transport", "workload", "target", "monarch", "raw", "ratio", "result"], rrows
            )
        )
    if doc.get("against_base"):
        lines += ["", f"monarch vs base ({doc['settings']['baseline_src']}):", ""]
        brows = [
            [
                r["transport"],
                r["backend"],
                r["workload"],
                fmt_num(r["ours"]),
                fmt_num(r["baseline"]),
                fmt_num(r["ratio"]),
            ]
            for r in doc["against_base"]
        ]
        lines.append(
            markdown_table(["transport", "backend", "workload", "monarch", "base", "ratio"], brows)
        )
    errors = [f for f in doc["figures"] if f["errors"]]
    if errors or doc["notes"] or doc["failures"]:
        lines.append("")
    for key, error in doc["failures"].items():
        lines.append(f"- {key} failed: {error.strip().splitlines()[-1] if error.strip() else '?'}")
    for note in doc["notes"]:
        lines.append(f"- note: {note}")
    for f in errors:
        lines.append(
            f"- errors in {f['impl']}/{f['backend']}/{f['transport']}/{f['workload']}: "
            f"{f['errors'][0].strip().splitlines()[-1]}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
