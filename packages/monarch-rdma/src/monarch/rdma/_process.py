"""This process's side of RDMA: its data server and its streams (its threads are the
core's one bulk-data executor, ``monarch.core.lowlevel.bulk_executor``).

Made on first use (the first buffer, or the first operation on one). The owner's side of
a buffer (what a peer asks it) is the ``rdma`` service (``_service``).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Final

from monarch.core import (
    WILDCARD_HOSTS,
    Runtime,
    current_config,
    current_runtime,
    ip_host,
    job_secret,
)
from monarch.core.lowlevel import bulk_executor, streams

from ._registry import registry
from ._tcp import DataServer, Streams


def _tcp_host(address: str) -> str:
    """The host our data server listens on: the runtime's own when it is on TCP (or
    ``ibverbs``, TCP underneath), else loopback (a unix-socket runtime has no peer on
    another host anyway)."""
    host = ip_host(address)
    if host is None:
        return "127.0.0.1"
    if host and host not in WILDCARD_HOSTS:
        return host
    return socket.gethostbyname(socket.gethostname())


STREAMS_IDLE: Final = 60.0
"""Seconds a stream to a data server may stay unused before it is closed (a peer gone, or
one this process no longer reads from, holds no socket, nor a thread of its server)."""


class Process:
    """This process's RDMA side (one, made on first use)."""

    def __init__(self) -> None:
        self.secret = job_secret()
        self._server: DataServer | None = None
        self._streams: dict[tuple[str, int], Streams] = {}
        self._lock = threading.Lock()
        self.width = streams()
        """Streams per TCP transfer."""
        self.threads = bulk_executor()
        """Operations, their extra streams and the large pulls we serve."""
        self._sweep_at = time.monotonic() + STREAMS_IDLE

    @property
    def runtime(self) -> Runtime:
        """This process's runtime now (a process may stop one and start another)."""
        return current_runtime()

    # -- the data server and streams ---------------------------------------------------

    def data_server(self) -> DataServer:
        with self._lock:
            if self._server is None:
                self._server = DataServer(
                    _tcp_host(self.runtime.address),
                    self.secret,
                    registry.get,
                    current_config().rdma_tcp_integrity,
                )
            return self._server

    def streams(self, host: str, port: int) -> Streams:
        """The streams to the data server at ``host:port`` (those idle for
        ``STREAMS_IDLE`` closed on the way, at most every half of that)."""
        with self._lock:
            now = time.monotonic()
            if now >= self._sweep_at:
                self._sweep_at = now + STREAMS_IDLE / 2
                self._close_idle(now - STREAMS_IDLE)
            streams = self._streams.get((host, port))
            if streams is None:
                integrity = current_config().rdma_tcp_integrity
                streams = Streams(host, port, self.secret, integrity)
                self._streams[(host, port)] = streams
            return streams

    def _close_idle(self, before: float) -> None:
        for key, kept in list(self._streams.items()):
            if kept.close_idle(before):
                del self._streams[key]

    def close_idle_streams(self, idle: float) -> int:
        """Close the streams unused for ``idle`` seconds now; how many servers this process
        still holds streams to."""
        with self._lock:
            self._close_idle(time.monotonic() - idle)
            return len(self._streams)


_process: Process | None = None
_process_lock = threading.Lock()


def local_process() -> Process:
    """This process's RDMA side, made on first use."""
    made = _process
    if made is not None:
        return made
    return _make()


def _make() -> Process:
    global _process
    with _process_lock:
        if _process is None:
            _process = Process()
        return _process
