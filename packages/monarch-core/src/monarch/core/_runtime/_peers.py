"""The writing side of a connection to one peer: ordered, batched, and watching the peer.

Any thread may post to a peer (see the package docstring): a message goes straight to the
socket when that peer's connection is idle, else to the peer's writer task, which keeps
each thread's order and turns a burst into one system call, its small messages into one
``Batch`` frame. The writer also notices when the peer dies: the connection closes (a
peer on this machine) or its heartbeats stop (one elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, Final, Protocol

import msgspec

from monarch.core._bulk._lending import Lender
from monarch.core._bulk._ring import Ring
from monarch.core._config import current_config
from monarch.core._errors import PeerLost
from monarch.core._runtime._messages import (
    BATCH_BYTES,
    BATCH_MAX,
    Batch,
    Hello,
    Packed,
    decode_beat,
    encode,
)
from monarch.core._runtime._tls import tls_options
from monarch.transport import (
    Buffer,
    Connection,
    ConnectionClosed,
    FrameQueue,
    TransportError,
    open_connection,
)

from ._flow import MESSAGE_COST, PATIENCE, SEND_HIGH, SEND_LOW, STALL, Room, owe, owed
from ._sendqueue import frame_queue

log = logging.getLogger("monarch.core")

LANE_TRIES: Final = 3
"""Attempts at a lane's connection while the main one is up (see ``PeerWriter._connect``)."""
DEFER: Final[list[Any]] = []
"""A ``batch`` for ``post`` off the loop: the writer task flushes (see ``Runtime.cast``)."""


NETWORK_SCHEMES: Final = ("tcp://", "tls://")
"""The peers a runtime attached through a gateway reaches through it (not ``unix://``)."""


class WriterOwner(Protocol):
    """What a writer needs of its runtime."""

    loop: asyncio.AbstractEventLoop
    secret: bytes
    address: str
    via: str | None
    hello: Hello
    incarnations: dict[str, str]
    vouched: dict[str, str]
    lender: Lender
    dialed: Counter[str]

    def call_soon(self, *request: Any) -> None: ...

    def _peer_failed(self, address: str, exc: BaseException) -> None: ...


class _Run:
    """Small messages queued one after another for one peer: one ``Batch`` frame, of at
    most ``BATCH_MAX`` messages and about ``BATCH_BYTES`` of payload."""

    __slots__ = ("full", "items", "size")

    def __init__(self, first: Packed) -> None:
        self.items: list[Packed] = []
        self.size = 0
        self.add(first)

    def add(self, message: Packed) -> None:
        self.items.append(message)
        for part in message.payload:
            self.size += len(part)
        self.full = len(self.items) >= BATCH_MAX or self.size >= BATCH_BYTES


class PeerWriter:
    """Writes the messages queued for one peer, in order; notices when the peer dies.

    Any thread may post: an actor's thread writes its replies straight to the socket
    (so a reply is out before the actor's next message runs, and no loop wake-up is
    paid for it). ``lock`` guards the connection's sending side, ``pending`` and
    ``busy``; while ``busy``, only the writer task touches the connection's queue.
    """

    def __init__(
        self, runtime: WriterOwner, address: str, lane: bool = False, main: PeerWriter | None = None
    ) -> None:
        self.runtime = runtime
        self.address = address
        self.lane = lane
        """The peer's lane (values for its inboxes, see ``_flow``), not its main connection:
        its senders slow down when it does not keep up (``throttle``)."""
        self.main = main
        """A lane's main writer: connected first (see ``_connect``)."""
        self.connected = asyncio.Event()
        self.queued = 0
        """Bytes of a lane's messages in ``pending`` (not yet handed to the connection)."""
        self.room = Room()
        """Set by the writer task when a lane's backlog is low (see ``throttle``)."""
        self.progress = time.monotonic()
        """When the peer last took something from a lane, or said its inboxes consume."""
        self.lock = threading.Lock()
        self.pending: deque[_Run | Sequence[Buffer]] = deque()
        self.wake = asyncio.Event()
        self.kicked = False
        """A wake-up of the writer task is on its way from another thread."""
        self.failure: BaseException | None = None
        self.heard = runtime.loop.time()
        """When the peer last showed it is alive (connection made, or a heartbeat)."""
        self.queue: FrameQueue | None = None
        """The connection's fast send path (``_sendqueue``), set once connected; then an
        idle writer lets ``post`` write straight into it."""
        self.busy = False
        self.task: asyncio.Task[None] | None = None
        self.stopped = False
        self.lend = False
        """The peer reads our large buffers itself (see ``_lending``)."""
        self._ring: Ring | None = None
        self._ring_tried = False

    def ring(self) -> Ring | None:
        """Our ring to this peer (see ``_ring``), opened when first lent through; None
        where there is none to be had. Any thread."""
        with self.lock:
            if not self._ring_tried and not self.stopped:
                self._ring = Ring.open()
                self._ring_tried = True
            return self._ring

    def start(self) -> None:
        """Connect and serve (loop thread)."""
        if self.task is None and not self.stopped:
            self.task = self.runtime.loop.create_task(self.run())

    def stop(self) -> None:
        self.stopped = True
        if self.task is not None:
            self.task.cancel()
        with self.lock:
            ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()

    def post(
        self,
        message: Packed | Sequence[Buffer],
        on_loop: bool = True,
        batch: list[PeerWriter] | None = None,
    ) -> None:
        """Queue a message (a small one still a ``Packed``, else its frame's parts) from
        any thread (``on_loop`` says which). A lone message to an idle connection is
        written at once; in a ``batch`` it waits for the batch's flush, with ``DEFER``
        for the writer task: what waits together goes out in one system call, and
        consecutive ``Packed`` as one ``Batch`` frame (a ``_Run``). A run that fills up
        is written at once by the thread that filled it: the peer starts on it while
        the rest of the burst is made."""
        if self.failure is not None:
            return  # undeliverable: whoever waits on this peer has been told
        error: TransportError | None = None
        with self.lock:
            queue, pending = self.queue, self.pending
            if queue is None or self.busy or pending or batch is not None:
                full = False
                if self.lane:
                    self.queued += _size(message)
                if type(message) is Packed:
                    run = pending[-1] if pending else None
                    if type(run) is _Run and not run.full:
                        run.add(message)
                    else:
                        run = _Run(message)
                        pending.append(run)
                    full = run.full
                else:
                    pending.append(message)  # type: ignore[arg-type]
                ready = queue is not None and not self.busy
                if ready and full:
                    assert queue is not None
                    try:
                        self._queue_pending(queue)
                        if self._flush_locked(queue):
                            return
                    except TransportError as exc:
                        error = exc
                    ready = False
            else:
                # Straight into the connection, with no task switch; order holds, as
                # nothing is queued before it.
                try:
                    queue.send_nowait([encode(message)] if isinstance(message, Packed) else message)
                    if self._flush_locked(queue):
                        return
                except TransportError as exc:
                    error = exc
                ready = False
        if error is not None:
            self._fail_from(error, on_loop)
        elif ready and batch is not None and batch is not DEFER:
            if self not in batch:
                batch.append(self)
        else:
            self._kick(on_loop)

    def flush(self, on_loop: bool = True) -> None:
        """Write what a batch queued; the writer task finishes if the socket is full."""
        with self.lock:
            queue = self.queue
            if queue is None or self.busy:
                return
            try:
                self._queue_pending(queue)
                if self._flush_locked(queue):
                    return
            except TransportError as exc:
                error: TransportError | None = exc
            else:
                error = None
        if error is not None:
            self._fail_from(error, on_loop)
        else:
            self._kick(on_loop)

    def _flush_locked(self, queue: FrameQueue) -> bool:
        """Write what the connection holds (the lock held); when the socket is full,
        the writer task goes on (``busy``) and this returns False."""
        if queue.flush_nowait():
            return True
        self.busy = True
        return False

    def _queue_pending(self, queue: FrameQueue) -> None:
        """Move what waits into the connection's send queue (the lock held), a run of
        small messages as one ``Batch``, encoded here rather than by each sender."""
        pending = self.pending
        self.queued = 0
        while pending:
            message = pending.popleft()
            if type(message) is _Run:
                items = message.items
                queue.send_nowait([encode(Batch(items) if len(items) > 1 else items[0])])
            else:
                queue.send_nowait(message)  # type: ignore[arg-type]

    def backlog(self) -> int:
        """Bytes sent to the peer that it has not taken yet: queued here, unwritten, or
        lent (its buffers, which we keep alive until it reads them)."""
        queue = self.queue
        unsent = queue.unsent if queue is not None else 0
        return self.queued + unsent + self.runtime.lender.lent_to(self.address)

    def throttle(self, on_loop: bool) -> None:
        """Slow the calling thread down while the peer does not keep up (see ``_flow``):
        wait until the backlog is below ``SEND_LOW``, ``STALL`` seconds at most.

        Another thread waits for the writer task to make room (a task on an async actor's
        loop waits at its next ``await``, see ``_flow``). On the loop, which the
        writer task needs, this thread writes instead: it moves what is queued into the
        connection and writes it, ``busy`` keeping other threads off the connection.
        """
        if self.backlog() <= SEND_HIGH or time.monotonic() - self.progress > PATIENCE:
            return
        if not on_loop:
            self.room.clear()
            if self.backlog() > SEND_LOW and self.failure is None:
                if owed.suspends:  # an async actor's loop: its task waits, not the thread
                    owe(self.room)
                else:
                    self.room.wait(STALL)
            return
        with self.lock:
            queue = self.queue
            if queue is None or self.failure is not None:
                return
            busy, self.busy = self.busy, True
        keep = max(SEND_LOW - self.runtime.lender.lent_to(self.address), 0)
        error: TransportError | None = None
        try:
            with self.lock:
                self._queue_pending(queue)
            unsent = queue.unsent
            queue.flush_for(STALL, keep)
            if queue.unsent < unsent:
                self.progress = time.monotonic()
        except TransportError as exc:
            error = exc
        finally:
            with self.lock:
                self.busy = busy
            self.wake.set()  # the writer task writes what is left
        if error is not None:
            self._fail(error)

    def made_room(self) -> None:
        """Some of the backlog is gone (written, or loans given back): wake a waiting
        sender if it is low enough."""
        self.progress = time.monotonic()
        if not self.room.is_set() and self.backlog() <= SEND_LOW:
            self.room.set()

    def _kick(self, on_loop: bool) -> None:
        if on_loop:
            self.wake.set()
        elif not self.kicked:
            self.kicked = True
            self.runtime.loop.call_soon_threadsafe(self.wake.set)

    def _fail_from(self, error: BaseException, on_loop: bool) -> None:
        if on_loop:
            self._fail(error)
        else:
            self.runtime.call_soon(self._fail, error)

    async def run(self) -> None:
        conn: Connection | None = None
        loop = self.runtime.loop
        # A lane's peer is watched by the main connection's heartbeats; a vouched one by
        # its host agent, whose heartbeats stand for it.
        watched = self.lane or self.address in self.runtime.vouched
        settings = None if watched else heartbeat_settings(self.address)
        beat = None if settings is None else loop.create_task(self._heartbeat(*settings))
        try:
            conn = await self._connect()
            queue = frame_queue(conn, loop)
            self.heard = loop.time()
            # The hello: who we are (this process's incarnation, which outlives an address
            # change and tells a restarted process from its predecessor), and how often
            # the peer should beat back on this connection (0 = never).
            hello = msgspec.structs.replace(
                self.runtime.hello,
                sender=self.runtime.address,
                heartbeat_interval=settings[0] if settings is not None else 0.0,
                lane=self.lane,
            )
            await conn.send([encode(hello)])
            # Peers send nothing but their Beat frames back: see _watch.
            watch = loop.create_task(self._watch(conn))
            with self.lock:
                self.queue = queue
            self.connected.set()
            try:
                while True:
                    with self.lock:
                        self.kicked = False
                        self.busy = True
                        self._queue_pending(queue)
                    await queue.flush()
                    if self.lane:
                        self.made_room()
                    with self.lock:
                        if self.pending:
                            continue
                        self.busy = False
                    await self.wake.wait()
                    self.wake.clear()
            finally:
                with self.lock:
                    self.queue = None
                watch.cancel()
        except (TransportError, OSError) as exc:
            self._fail(exc)
        finally:
            if beat is not None:
                beat.cancel()
            if conn is not None:
                await conn.aclose()

    async def _connect(self) -> Connection:
        """Open the connection. A lane waits for the main one, and tries again while that
        one is up: the peer may be busy (importing torch for what the first connection
        brought, say) past a handshake's deadline without being gone, and two handshakes
        at once would leave whatever the first brings in the way of the second."""
        main = self.main
        if main is not None:
            await main.connected.wait()
        tries = 0
        while True:
            try:
                return await dial(self.runtime, self.address)
            except (TransportError, OSError) as exc:
                tries += 1
                if main is None or main.queue is None or main.failure is not None:
                    raise
                if tries >= LANE_TRIES:
                    raise
                log.warning("lane to %s: %s; trying again", self.address, exc)

    async def _watch(self, conn: Connection) -> None:
        """``Beat`` frames are all a peer sends back; a read fails when the connection dies."""
        loop = self.runtime.loop
        try:
            while len(frame := await conn.receive()) == 1:
                self.heard = loop.time()
                beat = decode_beat(frame[0])
                if beat.incarnation:
                    self.runtime.incarnations[self.address] = beat.incarnation
                if beat.consumed:
                    self.progress = time.monotonic()  # a held lane's inboxes consume
                if beat.pull:
                    self.lend = True  # the peer can read our memory: lend it large buffers
            exc: BaseException = PeerLost(f"{self.address} sent on a one-way connection")
        except TransportError as error:
            exc = PeerLost(f"lost connection to {self.address}: {error}")
        self._fail(exc)
        self.stop()

    async def _heartbeat(self, interval: float, limit: float) -> None:
        """Declare the peer lost once it has been silent for ``limit`` s (frozen, cut off).

        A connection still being made has the handshake's deadline if that is longer: a
        peer busy with hundreds of handshakes at once (a controller whose procs and
        workers all dial it as they start) is slow, not gone; one whose packets are
        dropped is noticed then (the dial itself would wait ``connect_timeout``)."""
        loop = self.runtime.loop
        dialing = max(limit, current_config().transport_handshake_timeout)
        step = min(interval, limit / 2)
        while True:
            planned = loop.time() + step
            await asyncio.sleep(step)
            now = loop.time()
            if now - planned > step:
                # Our own loop was held up (a long callback): what the peer sent meanwhile
                # waits unread; it is not the peer's silence. It has a deadline from now.
                self.heard = max(self.heard, now)
            silent = now - self.heard
            connected = self.connected.is_set()
            if silent > (limit if connected else dialing):
                if connected:
                    said = f"{self.address} sent no heartbeat for {silent:.1f}s"
                    said += f" (heartbeat_timeout is {limit:g}s)"
                else:  # never connected: its packets go nowhere (dropped, a dead route)
                    said = f"could not connect to {self.address}: no answer in {silent:.1f}s"
                    said += f" (the deadline is {dialing:g}s: the longer of heartbeat_timeout"
                    said += " and transport_handshake_timeout)"
                self._fail(PeerLost(said))
                self.stop()
                return

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            # A failed write is the connection lost, as a failed read is: which of the two
            # sees a dead peer first is chance, and watchers wait on the host agent's word
            # on how a proc ended only for a lost connection.
            written = isinstance(exc, (ConnectionClosed, OSError)) and not isinstance(exc, PeerLost)
            if written and self.connected.is_set():
                exc = PeerLost(f"lost connection to {self.address}: {exc}")
            self.failure = exc
            self.room.set()  # a waiting sender has nothing left to wait for
            with self.lock:
                self.pending.clear()
                self.queued = 0
            self.runtime._peer_failed(self.address, exc)


def peer_options(url: str, *, server: bool) -> dict[str, Any]:
    """The transport options of the job's connections at ``url`` (listening at it with
    ``server``): TLS where the address says so, and the handshake's deadline
    (``transport_handshake_timeout``)."""
    timeout = current_config().transport_handshake_timeout
    return {**tls_options(url, server=server), "handshake_timeout": timeout}


async def dial(runtime: WriterOwner, address: str) -> Connection:
    """Open an authenticated connection from ``runtime`` to ``address``: TLS where the
    address says so, through the runtime's gateway for a network address (see ``_attach``)."""
    runtime.dialed[address] += 1
    options = peer_options(address, server=False)
    via = runtime.via
    if via is not None and address.startswith(NETWORK_SCHEMES):
        options["via"] = via
    return await open_connection(address, secret=runtime.secret, **options)


def _size(message: Packed | Sequence[Buffer]) -> int:
    """The bytes a message holds, as lanes count them."""
    parts: Sequence[Buffer] = message.payload if isinstance(message, Packed) else message
    return MESSAGE_COST + sum(memoryview(part).nbytes for part in parts)


def heartbeat_settings(address: str) -> tuple[float, float] | None:
    """``(interval, timeout)`` for a connection to ``address``: network peers only.

    A peer on this host is seen to die by its connection closing; one on another host may
    go silent instead (frozen, partitioned), which only a heartbeat deadline notices.
    """
    if address.startswith("unix:"):
        return None
    config = current_config()
    if config.heartbeat_interval <= 0 or config.heartbeat_timeout <= 0:
        return None
    return config.heartbeat_interval, config.heartbeat_timeout


def agent_watches(spawner: str, agent: str) -> bool:
    """Whether the procs that the host agent at ``agent`` started for ``spawner`` are
    watched by that agent for it (``_host._watching``), with no heartbeats between them
    and ``spawner``: when both are other processes that beat each other (network peers)."""
    if spawner == agent:
        return False
    return heartbeat_settings(agent) is not None and heartbeat_settings(spawner) is not None
