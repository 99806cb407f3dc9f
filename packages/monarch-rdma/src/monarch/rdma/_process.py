"""This process's side of RDMA: its data server and its streams (its threads are the
core's one bulk-data executor, ``monarch.core.lowlevel.bulk_executor``).

Made on first use (the first buffer, or the first operation on one). The owner's side of
a buffer (what a peer asks it) is the ``rdma`` service (``_service``).
"""

from __future__ import annotations

import socket
import threading

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


class Process:
    """This process's RDMA side (one, made on first use)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.secret = job_secret()
        self._server: DataServer | None = None
        self._streams: dict[tuple[str, int], Streams] = {}
        self._lock = threading.Lock()
        self.width = streams()
        """Streams per TCP transfer."""
        self.threads = bulk_executor()
        """Operations, their extra streams and the large pulls we serve."""

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
        with self._lock:
            streams = self._streams.get((host, port))
            if streams is None:
                integrity = current_config().rdma_tcp_integrity
                streams = Streams(host, port, self.secret, integrity)
                self._streams[(host, port)] = streams
            return streams


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
            _process = Process(current_runtime())
        return _process
