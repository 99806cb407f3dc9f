"""``PortForwarder`` (upstream's ``monarch.job.PortForwarder``): TCP ports of one proc
mesh forwarded, point by point, to loopback ports of another.

The out-of-cluster path: a client that cannot dial a service on a mesh's hosts (it listens
on their loopback, or the hosts sit behind a firewall) asks each host's proc to dial it
and carries the bytes over Monarch's own connections, which already reach those hosts.
Each forward is a pair of actors: a listener on every source proc and a dialer on the
destination proc at the same point. Each TCP connection becomes two ports, one a
direction; the bytes travel as ordered chunks, then an end-of-file (a half-close) or a
reset (an abrupt end: the other side's socket is aborted too, so its peer sees a reset,
not a clean end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias

from monarch.actor import (
    Actor,
    ActorMesh,
    Channel,
    Point,
    Port,
    PortReceiver,
    ProcMesh,
    current_rank,
    endpoint,
)

LOOPBACK = "127.0.0.1"
CHUNK = 64 * 1024
DIAL_DEADLINE = 10.0
"""Seconds a destination keeps dialing a refused port: a service that is still starting
gets its connection rather than a closed one (upstream closes it at once)."""
_CLOSE_DEADLINE = 1.0

_log = logging.getLogger(__name__)

PortSpec: TypeAlias = int | Callable[[Point], int]
AddressSpec: TypeAlias = str | Callable[[Point], str]


class _Chunk(NamedTuple):
    data: bytes


class _Eof(NamedTuple):
    pass


class _Reset(NamedTuple):
    pass


_Frame: TypeAlias = _Chunk | _Eof | _Reset


class _PeerReset(ConnectionError):
    """The other end of the forward ended abruptly."""


def _open_channel() -> tuple[Port[_Frame], PortReceiver[_Frame]]:
    port, inbox = Channel[_Frame].open()
    port.return_undeliverable = False  # a frame to a closed connection is dropped
    return port, inbox


async def _socket_to_peer(reader: asyncio.StreamReader, peer: Port[_Frame]) -> None:
    while data := await reader.read(CHUNK):
        peer.send(_Chunk(data))
    peer.send(_Eof())


async def _peer_to_socket(inbox: PortReceiver[_Frame], writer: asyncio.StreamWriter) -> None:
    while True:
        frame = await inbox.recv()
        if isinstance(frame, _Chunk):
            writer.write(frame.data)
            await writer.drain()
        elif isinstance(frame, _Eof):
            if writer.can_write_eof():
                writer.write_eof()
            return
        else:
            raise _PeerReset("the other end of the forward was reset")


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    peer: Port[_Frame],
    inbox: PortReceiver[_Frame],
) -> None:
    """Carry one connection both ways until both directions ended; on any failure (or
    cancellation) reset both this socket and the other end."""
    tasks = [
        asyncio.ensure_future(_socket_to_peer(reader, peer)),
        asyncio.ensure_future(_peer_to_socket(inbox, writer)),
    ]
    failed = True
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        failed = False
    except _PeerReset:
        pass  # the other end knows
    except (OSError, RuntimeError, asyncio.CancelledError) as exc:
        with contextlib.suppress(Exception):
            peer.send(_Reset())
        if isinstance(exc, asyncio.CancelledError):
            raise
    except Exception:  # noqa: BLE001 - e.g. an ActorError from the inbox: reset, log it
        _log.exception("a forwarded connection failed")
        with contextlib.suppress(Exception):
            peer.send(_Reset())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if failed:
            _reset(writer)
        else:
            await _close(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    """End the connection with a reset (RST), as its other end was: not an end of file."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), _CLOSE_DEADLINE)
    except (TimeoutError, OSError):
        writer.transport.abort()


class _Relays:
    """The connections an actor carries, ended together when it stops."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: Port[_Frame],
        inbox: PortReceiver[_Frame],
    ) -> None:
        task = asyncio.ensure_future(_relay(reader, writer, peer, inbox))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Dialer(Actor):
    """The destination end: dials ``127.0.0.1:port`` for each forwarded connection."""

    def __init__(self) -> None:
        self._port: int | None = None
        self._relays = _Relays()

    @endpoint
    async def target(self, port: PortSpec) -> None:
        self._port = _port_at("dst_port", port, current_rank())

    @endpoint
    async def open(self, peer: Port[_Frame]) -> Port[_Frame]:
        if self._port is None:
            raise RuntimeError("this port forward has no destination port yet")
        reader, writer = await _dial(self._port)
        mine, inbox = _open_channel()
        self._relays.start(reader, writer, peer, inbox)
        return mine

    async def __cleanup__(self, exc: Exception | None) -> None:
        await self._relays.close()


async def _dial(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the loopback ``port``, retrying a refusal until ``DIAL_DEADLINE``."""
    deadline = time.monotonic() + DIAL_DEADLINE
    pause = 0.01
    while True:
        try:
            return await asyncio.open_connection(LOOPBACK, port)
        except ConnectionRefusedError:
            if time.monotonic() + pause > deadline:
                raise
            await asyncio.sleep(pause)  # a backoff between dials, not a wait for a state
            pause = min(pause * 2, 0.5)


class _Listener(Actor):
    """The source end: listens at its point's address and forwards what it accepts to the
    dialer at the same point."""

    def __init__(self) -> None:
        self._dialer: Any = None
        self._server: asyncio.Server | None = None
        self._relays = _Relays()

    @endpoint
    async def listen(self, dialers: ActorMesh[_Dialer], address: AddressSpec) -> None:
        point = current_rank()
        self._dialer = dialers.slice(**dict(point))
        host, port = _address_at(address, point)
        self._server = await asyncio.start_server(self._accepted, host, port)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            mine, inbox = _open_channel()
            peer = await self._dialer.open.call_one(mine)
        except Exception as exc:  # noqa: BLE001 - the client sees its connection closed
            _log.warning("port forward: the destination could not be reached: %s", exc)
            await _close(writer)
            return
        self._relays.start(reader, writer, peer, inbox)

    async def __cleanup__(self, exc: Exception | None) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._relays.close()


class PortForwarder(Actor):
    """Owns point-to-point TCP port forwards: spawn one (``this_proc().spawn("fwd",
    PortForwarder)``), call ``forward`` once per forward, and stop it to close them all."""

    def __init__(self) -> None:
        self._forwards: list[tuple[ActorMesh[_Listener], ActorMesh[_Dialer]]] = []

    @endpoint
    async def forward(
        self,
        dst_proc_mesh: ProcMesh,
        dst_port: PortSpec,
        src_proc_mesh: ProcMesh,
        src_address: AddressSpec,
    ) -> None:
        """Every proc of ``src_proc_mesh`` listens at ``src_address`` (``"host:port"``)
        and forwards each connection to ``127.0.0.1:dst_port`` on the proc of
        ``dst_proc_mesh`` at the same point; both may be functions of the point. The
        meshes must have the same shape (a ``ValueError``). A forward that fails to start
        stops what it had started before the error is raised."""
        if dst_proc_mesh.extent != src_proc_mesh.extent:
            raise ValueError(
                "the destination and source proc meshes must have the same shape: "
                f"{dst_proc_mesh.extent} != {src_proc_mesh.extent}"
            )
        if not callable(dst_port):
            _check_port("dst_port", dst_port)
        if not callable(src_address):
            _parse_address(src_address)
        name = uuid.uuid4().hex[:12]
        listeners: ActorMesh[_Listener] | None = None
        dialers: ActorMesh[_Dialer] | None = None
        try:
            dialers = dst_proc_mesh.spawn(f"port_forward_dst_{name}", _Dialer)
            listeners = src_proc_mesh.spawn(f"port_forward_src_{name}", _Listener)
            await dialers.target.call(dst_port)
            await listeners.listen.call(dialers, src_address)
        except Exception as exc:
            failures = await _stop(listeners, dialers)
            if failures:
                exc.add_note(
                    "stopping what the forward had started failed too: "
                    + "; ".join(f"{type(f).__name__}: {f}" for f in failures)
                )
            raise
        self._forwards.append((listeners, dialers))

    async def __cleanup__(self, exc: Exception | None) -> None:
        forwards, self._forwards = self._forwards, []
        for listeners, dialers in forwards:
            await _stop(listeners, dialers)


async def _stop(*meshes: ActorMesh[Any] | None) -> list[BaseException]:
    stops = [mesh.stop() for mesh in meshes if mesh is not None]
    results = await asyncio.gather(*(_await(stop) for stop in stops), return_exceptions=True)
    return [result for result in results if isinstance(result, BaseException)]


async def _await(future: Any) -> Any:
    return await future


def _check_port(name: str, port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be an integer from 1 to 65535, not {port!r}")
    return port


def _port_at(name: str, port: PortSpec, point: Point) -> int:
    return _check_port(name, port(point) if callable(port) else port)


def _parse_address(address: object) -> tuple[str, int]:
    if not isinstance(address, str):
        raise ValueError(f"src_address must be an 'address:port' string, not {address!r}")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"src_address must be 'address:port', not {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit():
        raise ValueError(f"src_address's port must be a number, not {port!r}")
    return host, _check_port("src_address's port", int(port))


def _address_at(address: AddressSpec, point: Point) -> tuple[str, int]:
    return _parse_address(address(point) if callable(address) else address)


__all__ = ["PortForwarder"]
