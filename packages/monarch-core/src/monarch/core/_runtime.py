"""The per-process runtime: a listener, a writer per peer, ports, and local actors.

Every Monarch process runs exactly one Runtime on one asyncio event loop: in a
worker proc on its main thread, in the controller (the user's script) on a
background thread, so sync code can block on futures while the loop works.
Messages to a peer are queued synchronously (``post``) and written by that
peer's writer task, which keeps FIFO order per (sender process, peer) and turns
bursts into one system call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from monarch.transport import (
    Buffer,
    Connection,
    Listener,
    TransportError,
    open_connection,
    open_listener,
)
from monarch.transport.wire import Envelope, decode_envelope, encode

from ._future import set_loop_thread
from ._messages import (
    TO_ACTOR,
    TO_PORT,
    TO_PROC,
    Body,
    PortRef,
    StopProc,
    decode_body,
    encode_body,
)

log = logging.getLogger("monarch.core")

SECRET_ENV: Final = "MONARCH_JOB_SECRET"
"""Children get the job secret through their environment, never on a command line."""

PortHandler = Callable[[Body, Sequence[Buffer]], None]
ActorSink = Callable[[Body, Sequence[Buffer], str], None]
ControlHandler = Callable[["Runtime", Any, Sequence[Buffer], str], None]
PeerWatcher = Callable[[str, BaseException], None]


class PeerLost(ConnectionError):
    """A peer process stopped answering (exited, was killed, or the link broke)."""


class _PeerWriter:
    """Writes the messages queued for one peer, in order; notices when the peer dies."""

    def __init__(self, runtime: Runtime, address: str) -> None:
        self.runtime = runtime
        self.address = address
        self.pending: deque[Sequence[Buffer]] = deque()
        self.wake = asyncio.Event()
        self.failure: BaseException | None = None
        self.task = runtime.loop.create_task(self.run())

    def post(self, parts: Sequence[Buffer]) -> None:
        self.pending.append(parts)
        self.wake.set()

    async def run(self) -> None:
        conn: Connection | None = None
        try:
            conn = await open_connection(self.address, secret=self.runtime.secret)
            # Peers never send on our outbound connection: a read returns only when it dies.
            watch = self.runtime.loop.create_task(self._watch(conn))
            try:
                while True:
                    await self.wake.wait()
                    self.wake.clear()
                    pending = self.pending
                    while pending:
                        conn.send_nowait(pending.popleft())
                    await conn.flush()
            finally:
                watch.cancel()
        except (TransportError, OSError) as exc:
            self._fail(exc)
        finally:
            if conn is not None:
                await conn.aclose()

    async def _watch(self, conn: Connection) -> None:
        try:
            await conn.receive()
            exc: BaseException = PeerLost(f"{self.address} sent on a one-way connection")
        except TransportError as error:
            exc = PeerLost(f"lost connection to {self.address}: {error}")
        self._fail(exc)
        self.task.cancel()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            self.pending.clear()
            self.runtime._peer_failed(self.address, exc)


class Runtime:
    """The Monarch runtime of this process (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, secret: bytes) -> None:
        self.loop = loop
        self.secret = secret
        self.address = ""
        self.listener: Listener | None = None
        self._writers: dict[str, _PeerWriter] = {}
        self._ports: dict[int, PortHandler] = {}
        self._port_ids = itertools.count(1)
        self.actors: dict[str, ActorSink] = {}
        self._watchers: dict[str, dict[int, PeerWatcher]] = {}
        self._watch_ids = itertools.count(1)
        self.failed_peers: dict[str, BaseException] = {}
        self.control: dict[type, ControlHandler] = {}
        """Handlers of messages to the proc itself, by body type (see ``_services``)."""
        self.stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self, listen: str = "unix://@") -> None:
        self.listener = await open_listener(listen, secret=self.secret)
        self.address = str(self.listener.address)
        self.spawn_task(self.listener.serve(self._serve_connection))

    def spawn_task(self, coro: Any) -> asyncio.Task[Any]:
        """Run a task owned by the runtime (kept referenced until it ends)."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _serve_connection(self, conn: Connection) -> None:
        sender = "?"
        try:
            async for frame in conn:
                sender = self._dispatch(frame)
        except TransportError as exc:
            log.warning("dropped connection from %s: %s", sender, exc)

    # -- sending -------------------------------------------------------------------

    def post(
        self, address: str, kind: int, dest: str, body: Body, payload: Sequence[Buffer] = ()
    ) -> None:
        """Queue a message for ``address`` (loop thread only); never blocks."""
        parts: list[Buffer] = [
            encode(Envelope(kind, dest, self.address)),
            encode_body(body),
            *payload,
        ]
        if address == self.address:
            self.loop.call_soon(self._dispatch, parts)
            return
        writer = self._writers.get(address)
        if writer is None:
            if address in self.failed_peers:
                return  # undeliverable; watchers already learned of the failure
            writer = self._writers[address] = _PeerWriter(self, address)
        writer.post(parts)

    def send_to_port(self, port: PortRef, body: Body, payload: Sequence[Buffer] = ()) -> None:
        self.post(port.proc, TO_PORT, str(port.port), body, payload)

    # -- receiving -----------------------------------------------------------------

    def _dispatch(self, frame: Sequence[Buffer]) -> str:
        envelope = decode_envelope(frame[0])  # type: ignore[arg-type]
        body = decode_body(frame[1])  # type: ignore[arg-type]
        payload = frame[2:]
        kind = envelope.kind
        if kind == TO_PORT:
            handler = self._ports.get(int(envelope.dest))
            if handler is None:
                log.debug("message for closed port %s from %s", envelope.dest, envelope.sender)
            else:
                handler(body, payload)
        elif kind == TO_ACTOR:
            sink = self.actors.get(envelope.dest)
            if sink is None:
                log.warning("message for unknown actor %s from %s", envelope.dest, envelope.sender)
            else:
                sink(body, payload, envelope.sender)
        elif kind == TO_PROC:
            if isinstance(body, StopProc):
                self.stopped.set()
                return envelope.sender
            control = self.control.get(type(body))
            if control is None:
                log.warning("unexpected %s from %s", type(body).__name__, envelope.sender)
            else:
                control(self, body, payload, envelope.sender)
        return envelope.sender

    def open_port(self, handler: PortHandler) -> PortRef:
        port = next(self._port_ids)
        self._ports[port] = handler
        return PortRef(self.address, port)

    def close_port(self, port: PortRef) -> None:
        self._ports.pop(port.port, None)

    # -- failures ---------------------------------------------------------------------

    def watch_peer(self, address: str, watcher: PeerWatcher) -> Callable[[], None]:
        """Call ``watcher(address, exc)`` once if that peer fails; returns an unwatch."""
        failure = self.failed_peers.get(address)
        if failure is not None:
            self.loop.call_soon(watcher, address, failure)
            return lambda: None
        key = next(self._watch_ids)
        self._watchers.setdefault(address, {})[key] = watcher
        if address != self.address and address not in self._writers:
            # Connect now, so that a dead peer is noticed even before we send to it.
            self._writers[address] = _PeerWriter(self, address)
        return lambda: self._watchers.get(address, {}).pop(key, None) and None

    def _peer_failed(self, address: str, exc: BaseException) -> None:
        if address in self.failed_peers:
            return
        self.failed_peers[address] = exc
        for watcher in list(self._watchers.pop(address, {}).values()):
            try:
                watcher(address, exc)
            except Exception:
                log.exception("peer watcher failed")

    def peer_exited(self, address: str, how: str) -> None:
        """A child process we spawned has exited (seen by its parent at once)."""
        self._peer_failed(address, PeerLost(f"process at {address} {how}"))
        writer = self._writers.get(address)
        if writer is not None:
            writer.task.cancel()

    async def aclose(self) -> None:
        for writer in list(self._writers.values()):
            writer.task.cancel()
        if self.listener is not None:
            await self.listener.aclose()
        for task in list(self._tasks):
            task.cancel()


# -- the process's runtime -------------------------------------------------------------

_runtime: Runtime | None = None
_lock = threading.Lock()


def current_runtime() -> Runtime:
    """This process's runtime, starting the controller's on first use."""
    runtime = _runtime
    if runtime is None:
        with _lock:
            if _runtime is None:
                _start_controller_runtime()
            runtime = _runtime
    assert runtime is not None
    return runtime


def install_runtime(runtime: Runtime | None) -> None:
    global _runtime
    _runtime = runtime


def job_secret() -> bytes:
    value = os.environ.get(SECRET_ENV)
    if value:
        return bytes.fromhex(value)
    secret = secrets.token_bytes(32)
    os.environ[SECRET_ENV] = secret.hex()  # inherited by every process we spawn
    return secret


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _listen_address() -> str:
    from ._config import current_config

    transport = current_config().default_transport
    if transport in ("unix", "ipc", "local"):
        return "unix://@"
    if transport in ("tcp", "tls"):
        import socket

        return f"{transport}://{socket.gethostname()}:0"
    return str(transport)


def _start_controller_runtime() -> None:
    loop = new_event_loop()
    ready = threading.Event()
    runtime = Runtime(loop, job_secret())
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            try:
                await runtime.start(_listen_address())
                from ._services import install

                install(runtime)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(exc)
            finally:
                ready.set()

        loop.create_task(boot())
        loop.run_forever()

    thread = threading.Thread(target=run, name="monarch-runtime", daemon=True)
    thread.start()
    ready.wait()
    if failure:
        raise failure[0]
    set_loop_thread(thread)
    install_runtime(runtime)
