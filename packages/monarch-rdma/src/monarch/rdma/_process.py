"""This process's side of RDMA: its service, its data server, its threads.

The owner of a buffer must answer for it while its actor is busy (a sync endpoint
computing, an async one awaiting), and a buffer may be made anywhere: in the client, in
an ``__init__``, in an endpoint of either kind. So the service is a port of the process's
runtime (monarch-core's ``open_port``), opened when the first buffer is made, not an actor
that would have to be spawned (a round trip, and a wait inside a constructor) before the
first buffer could be handed out: its handler runs on the runtime loop, which a busy actor
never holds, and hands the work to this process's RDMA threads. Requests to it (a write
it pulls, a drop, an atomic) come with a reply port; the asker watches the owner's
process and fails at once if it dies.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Final

from monarch.core import (
    WILDCARD_HOSTS,
    PortRef,
    PortValue,
    Runtime,
    current_config,
    current_runtime,
    dumps,
    ip_host,
    job_secret,
    loads,
)

from ._errors import RDMAError, RDMAOwnerDied, RDMATimeoutError
from ._registry import registry
from ._tcp import DataServer, Streams

START_TIMEOUT: Final = 60.0
OPS_THREADS: Final = 16
"""Operations of this process that run at once (an RDMAAction's run side by side)."""


class _Pending:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


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
        self.service: PortRef = runtime.open_port(self._on_request)
        self.replies: PortRef = runtime.open_port(self._on_reply)
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._server: DataServer | None = None
        self._streams: dict[tuple[str, int], Streams] = {}
        self._lock = threading.Lock()
        self.ops = ThreadPoolExecutor(OPS_THREADS, thread_name_prefix="monarch-rdma-op")
        self.serving = ThreadPoolExecutor(OPS_THREADS, thread_name_prefix="monarch-rdma-serve")
        """Requests we answer as an owner: apart from ``ops``, so two processes whose
        operations all wait on each other still answer each other."""
        # Streams per transfer: upstream's worker-thread knob, but no more than one per
        # two CPUs (each stream is a thread here and one at the owner; on a small machine
        # more streams only contend: measured on 2 cores, 1 stream beats 2).
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.width = max(1, min(current_config().rdma_runtime_worker_threads, cpus // 2))
        self.helpers = ThreadPoolExecutor(
            max(1, OPS_THREADS * (self.width - 1)), thread_name_prefix="monarch-rdma-stream"
        )

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

    # -- asking an owner ------------------------------------------------------------------

    def ask(self, proc: str, service: PortRef, request: tuple[Any, ...], deadline: float) -> Any:
        """Send ``request`` to the service of the process at ``proc``, block for its
        answer (this runs on an RDMA thread); the owner's death or the deadline end it."""
        key = next(self._ids)
        pending = self._pending[key] = _Pending()

        def lost(_address: str, why: BaseException) -> None:
            self._settle(key, None, RDMAOwnerDied(f"the buffer's owner at {proc} died: {why}"))

        watch = self.runtime.watch_peer(proc, lost)
        try:
            self.runtime.send_to_port(service, PortValue(0), dumps((key, self.replies, request)))
            if not pending.done.wait(max(0.0, deadline - time.monotonic())):
                raise RDMATimeoutError(f"the buffer's owner at {proc} did not answer in time")
        finally:
            self.runtime.unwatch_peer(proc, watch)
            self._pending.pop(key, None)
        if pending.error is not None:
            raise pending.error
        return pending.value

    def _on_reply(self, body: object, payload: Any) -> None:
        if not isinstance(body, PortValue):
            return
        try:
            key, value = loads(payload)
        except Exception:  # noqa: BLE001 - a reply we cannot read answers nothing
            return
        if body.error:
            self._settle(
                key, None, value if isinstance(value, BaseException) else RDMAError(str(value))
            )
        else:
            self._settle(key, value, None)

    def _settle(self, key: int, value: Any, error: BaseException | None) -> None:
        pending = self._pending.get(key)
        if pending is None or pending.done.is_set():
            return
        pending.value, pending.error = value, error
        pending.done.set()

    # -- answering as an owner -------------------------------------------------------------

    handlers: ClassVar[dict[str, Callable[..., Any]]] = {}
    """What the service does, by request name (filled by ``_transfer``)."""
    quick: ClassVar[list[Callable[[tuple[Any, ...]], bool]]] = []
    """Whether a request is answered on the loop itself (a drop, an atomic, a small pull:
    less than the two thread hops it would otherwise cost); filled by ``_transfer``."""

    def _on_request(self, body: object, payload: Any) -> None:
        if not isinstance(body, PortValue):
            return
        key, reply, request = loads(payload)
        if self.quick and self.quick[0](request):
            self._answer(key, reply, request)
        else:
            self.serving.submit(self._answer, key, reply, request)

    def _answer(self, key: int, reply: PortRef, request: tuple[Any, ...]) -> None:
        name, *args = request
        try:
            value = self.handlers[name](*args)
        except Exception as error:  # noqa: BLE001 - the asker gets it
            self.runtime.send_to_port(reply, PortValue(0, True), dumps((key, error)))
        else:
            self.runtime.send_to_port(reply, PortValue(0), dumps((key, value)))


_process: Process | None = None
_process_lock = threading.Lock()


def local_process() -> Process:
    """This process's RDMA side, made (its ports opened on the runtime loop) on first use."""
    global _process
    made = _process
    if made is not None:
        return made
    runtime = current_runtime()
    if runtime.on_loop():
        made = Process(runtime)
    else:  # the ports are opened on the loop, which owns them
        box: list[Process | BaseException] = []
        ready = threading.Event()

        def make() -> None:
            try:
                box.append(Process(runtime))
            except BaseException as error:  # noqa: BLE001 - raised on the asking thread
                box.append(error)
            ready.set()

        runtime.call_soon(make)
        if not ready.wait(START_TIMEOUT):
            raise RDMAError("the runtime loop did not answer: cannot start RDMA here")
        if isinstance(box[0], BaseException):
            raise box[0]
        made = box[0]
    with _process_lock:  # two first uses at once: one wins, the other's ports stay unused
        if _process is None:
            _process = made
        return _process
