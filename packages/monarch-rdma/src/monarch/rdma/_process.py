"""This process's side of RDMA: its data server, its streams, its threads.

Made on first use (the first buffer, or the first operation on one). The owner's side of
a buffer (what a peer asks it) is the ``rdma`` service (``_service``).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Final

from monarch.core import (
    WILDCARD_HOSTS,
    Runtime,
    current_config,
    current_runtime,
    ip_host,
    job_secret,
)

from . import _threads as threads
from ._registry import registry
from ._tcp import DataServer, Streams

OPS_THREADS: Final = 16
"""Operations of this process that run at once, each with its streams (an RDMAAction's
run side by side): the executor holds ``OPS_THREADS`` x streams per transfer threads."""


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
        # Streams per transfer: upstream's worker-thread knob, but no more than one per
        # two CPUs (each stream is a thread here and one at the owner; on a small machine
        # more streams only contend: measured on 2 cores, 1 stream beats 2).
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.width = max(1, min(current_config().rdma_runtime_worker_threads, cpus // 2))
        self.threads = threads.make(OPS_THREADS * self.width)
        """Operations, their extra streams and the large pulls we serve (``_threads``)."""

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
