"""The per-process runtime: a listener, a writer per peer, ports, and local actors.

Every Monarch process runs exactly one Runtime on one asyncio event loop: in a
worker proc on its main thread, in the controller (the user's script) on a
background thread, so sync code can block on futures while the loop works.
Any thread may send (``post``): a message goes straight to the socket when that
peer's connection is idle, else to its writer task, which keeps each thread's order
per peer and turns a burst into one system call (its small messages into one frame).
Other work for the loop goes through one ordered queue (``call_soon``), so what a
thread asks for happens in its order.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

import anyio
import msgspec

from monarch.transport import (
    Buffer,
    Connection,
    ConnectionClosed,
    Frame,
    Listener,
    TransportError,
    open_connection,
    open_listener,
)
from monarch.transport.wire import Envelope, decode_envelope, encode

from ._cast import SendOrder, fan_out
from ._future import set_loop_thread
from ._lending import Lender, PullError, RingKey, borrow, can_read, is_descriptor
from ._lending import available as lending_available
from ._memory import address_of as memory_address
from ._messages import (
    BATCH_BYTES,
    BATCH_MAX,
    HEARTBEAT,
    PACK_MAX,
    TO_ACTOR,
    TO_PORT,
    TO_PROC,
    Batch,
    Body,
    Call,
    Packed,
    PortRef,
    ReturnLoans,
    StopProc,
    decode_body,
    decode_single,
    encode_body,
)
from ._netaddr import advertised, bind_url
from ._ring import Ring, RingReader

log = logging.getLogger("monarch.core")

DRAIN_GRACE: Final = 0.25
"""Seconds a failed peer's open connections are still read, for what it sent before."""
ROOT_ENV: Final = "MONARCH_ROOT_ADDRESS"
"""The root client's address, inherited by every process of the job."""
SECRET_ENV: Final = "MONARCH_JOB_SECRET"
"""Children get the job secret through their environment, never on a command line."""

PortHandler = Callable[[Body, Sequence[Buffer]], None]
ActorSink = Callable[[Body, Sequence[Buffer], str], None]
ControlHandler = Callable[["Runtime", Any, Sequence[Buffer], str], None]
PeerWatcher = Callable[[str, BaseException], None]


BURST: Final = 50e-6
"""Casts from a thread closer together than this (seconds) are written together."""
DEFER: Final[list[Any]] = []
"""A ``batch`` for ``post`` off the loop: the writer task flushes (see ``cast``)."""


class PeerLost(ConnectionError):
    """A peer process stopped answering (exited, was killed, or the link broke)."""


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


class _PeerWriter:
    """Writes the messages queued for one peer, in order; notices when the peer dies.

    Any thread may post: an actor's thread writes its replies straight to the socket
    (so a reply is out before the actor's next message runs, and no loop wake-up is
    paid for it). ``lock`` guards the connection's sending side, ``pending`` and
    ``busy``; while ``busy``, only the writer task touches the connection.
    """

    def __init__(self, runtime: Runtime, address: str) -> None:
        self.runtime = runtime
        self.address = address
        self.lock = threading.Lock()
        self.pending: deque[_Run | Sequence[Buffer]] = deque()
        self.wake = asyncio.Event()
        self.kicked = False
        """A wake-up of the writer task is on its way from another thread."""
        self.failure: BaseException | None = None
        self.heard = runtime.loop.time()
        """When the peer last showed it is alive (connection made, or a heartbeat)."""
        self.conn: Connection | None = None
        """Set once connected; then an idle writer lets ``post`` write directly."""
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
        batch: list[_PeerWriter] | None = None,
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
            conn, pending = self.conn, self.pending
            if conn is None or self.busy or pending or batch is not None:
                full = False
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
                ready = conn is not None and not self.busy
                if ready and full:
                    assert conn is not None
                    try:
                        self._queue_pending(conn)
                        if self._flush_locked(conn):
                            return
                    except TransportError as exc:
                        error = exc
                    ready = False
            else:
                # Straight into the connection, with no task switch; order holds, as
                # nothing is queued before it.
                try:
                    conn.send_nowait([encode(message)] if isinstance(message, Packed) else message)
                    if self._flush_locked(conn):
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
            conn = self.conn
            if conn is None or self.busy:
                return
            try:
                self._queue_pending(conn)
                if self._flush_locked(conn):
                    return
            except TransportError as exc:
                error: TransportError | None = exc
            else:
                error = None
        if error is not None:
            self._fail_from(error, on_loop)
        else:
            self._kick(on_loop)

    def _flush_locked(self, conn: Connection) -> bool:
        """Write what the connection holds (the lock held); when the socket is full,
        the writer task goes on (``busy``) and this returns False."""
        if conn.flush_nowait():
            return True
        self.busy = True
        return False

    def _queue_pending(self, conn: Connection) -> None:
        """Move what waits into the connection's send queue (the lock held), a run of
        small messages as one ``Batch``, encoded here rather than by each sender."""
        pending = self.pending
        while pending:
            message = pending.popleft()
            if type(message) is _Run:
                items = message.items
                conn.send_nowait([encode(Batch(items) if len(items) > 1 else items[0])])
            else:
                conn.send_nowait(message)  # type: ignore[arg-type]

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
        settings = _heartbeat_settings(self.address)
        beat = None if settings is None else loop.create_task(self._heartbeat(*settings))
        try:
            conn = await open_connection(self.address, secret=self.runtime.secret)
            self.heard = loop.time()
            # The hello: who we are (this process's incarnation, which outlives an address
            # change and tells a restarted process from its predecessor), and how often
            # the peer should beat back on this connection ("" = never).
            interval = repr(settings[0]) if settings is not None else ""
            hello = Envelope(HEARTBEAT, interval, self.runtime.address, 0, self.runtime.hello)
            await conn.send([encode(hello)])
            # Peers send nothing but their hello and heartbeats back: see _watch.
            watch = loop.create_task(self._watch(conn))
            with self.lock:
                self.conn = conn
            try:
                while True:
                    with self.lock:
                        self.kicked = False
                        self.busy = True
                        self._queue_pending(conn)
                    await conn.flush()
                    with self.lock:
                        if self.pending:
                            continue
                        self.busy = False
                    await self.wake.wait()
                    self.wake.clear()
            finally:
                with self.lock:
                    self.conn = None
                watch.cancel()
        except (TransportError, OSError) as exc:
            self._fail(exc)
        finally:
            if beat is not None:
                beat.cancel()
            if conn is not None:
                await conn.aclose()

    async def _watch(self, conn: Connection) -> None:
        """Heartbeats are all a peer sends back; a read fails when the connection dies."""
        loop = self.runtime.loop
        try:
            while len(frame := await conn.receive()) == 1:
                self.heard = loop.time()
                headers = decode_envelope(frame[0]).headers
                incarnation = headers.get("i")
                if incarnation is not None:
                    self.runtime.incarnations[self.address] = incarnation
                if headers.get("pull") == "1":
                    self.lend = True  # the peer can read our memory: lend it large buffers
            exc: BaseException = PeerLost(f"{self.address} sent on a one-way connection")
        except TransportError as error:
            exc = PeerLost(f"lost connection to {self.address}: {error}")
        self._fail(exc)
        self.stop()

    async def _heartbeat(self, interval: float, limit: float) -> None:
        """Declare the peer lost once it has been silent for ``limit`` s (frozen, cut off)."""
        loop = self.runtime.loop
        while True:
            await asyncio.sleep(min(interval, limit / 2))
            silent = loop.time() - self.heard
            if silent > limit:
                self._fail(
                    PeerLost(
                        f"{self.address} sent no heartbeat for {silent:.1f}s "
                        f"(heartbeat_timeout is {limit:g}s)"
                    )
                )
                self.stop()
                return

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            with self.lock:
                self.pending.clear()
            self.runtime._peer_failed(self.address, exc)


def _heartbeat_settings(address: str) -> tuple[float, float] | None:
    """``(interval, timeout)`` for a connection to ``address``: network peers only.

    A peer on this host is seen to die by its connection closing; one on another host may
    go silent instead (frozen, partitioned), which only a heartbeat deadline notices.
    """
    if address.startswith("unix:"):
        return None
    from ._config import current_config

    config = current_config()
    if config.heartbeat_interval <= 0 or config.heartbeat_timeout <= 0:
        return None
    return config.heartbeat_interval, config.heartbeat_timeout


class _Inbound:
    """A connection a peer opened to us: its hello, then its messages, batch by batch."""

    def __init__(self, runtime: Runtime, conn: Connection) -> None:
        self.runtime = runtime
        self.conn = conn
        self.sender = "?"
        self.ended: asyncio.Future[None] = runtime.loop.create_future()
        """Done when the connection is refused or fails (with the failure)."""
        self._beats: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()
        self.rings: dict[RingKey, RingReader | None] = {}
        """The sender's rings we have opened (see ``_ring``)."""

    def take_pushed(self) -> None:
        """Frames are ready (push mode): take them; a failure ends the connection."""
        if self.ended.done():
            return
        try:
            self.take(None)
        except Exception as exc:  # noqa: BLE001 - raised again by _serve_connection
            self.ended.set_exception(exc)

    def take(self, frame: Frame | None) -> None:
        """Deliver ``frame`` and every frame already read, as one batch: what they
        send in return goes out together when it ends."""
        runtime, conn = self.runtime, self.conn
        runtime._batching += 1
        try:
            if frame is None:
                frame = conn.receive_nowait()
            while True:
                if len(frame) > 1:
                    self.sender = runtime._dispatch(frame, self.rings)
                else:
                    single = decode_single(frame[0])
                    if isinstance(single, Packed):
                        self.sender = runtime._deliver(single.envelope, single.body, single.payload)
                    elif isinstance(single, Batch):
                        deliver = runtime._deliver
                        for packed in single.items:
                            self.sender = deliver(packed.envelope, packed.body, packed.payload)
                    elif not self._hello(single):
                        self.ended.set_result(None)
                        return
                frame = conn.receive_nowait()
        except anyio.WouldBlock:
            pass
        finally:
            runtime._end_batch()

    def _hello(self, hello: Envelope) -> bool:
        """A peer's hello (see _PeerWriter.run): whether it is admitted."""
        runtime = self.runtime
        self.sender = hello.sender
        if not runtime._admit(hello.sender, hello.headers.get("i")):
            return False
        runtime._inbound.setdefault(hello.sender, {})[self.conn] = self._drained
        if self._beats is None:
            pulls = runtime._can_pull_from(hello)
            self._beats = runtime.spawn_task(runtime._send_heartbeats(self.conn, hello, pulls))
        return True

    def close(self) -> None:
        if self._beats is not None:
            self._beats.cancel()
        self.runtime._inbound.get(self.sender, {}).pop(self.conn, None)
        self.rings.clear()  # unmapped once no frame of this connection is being read
        self._drained.set()
        if not self.ended.done():
            self.ended.cancel()


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
        self.send_order = SendOrder()
        self.incarnation = secrets.token_hex(8)
        """This process's identity: stable when its address changes, new in a new process."""
        self.hello = {"i": self.incarnation}
        self.lender = Lender()
        """Our large buffers read by peers of this machine (see ``_lending``)."""
        self._token = self.incarnation.encode()
        if lending_available():
            # What a peer of this machine reads to find out it may read our memory.
            self.hello = {
                **self.hello,
                "pid": str(os.getpid()),
                "probe": str(memory_address(self._token)),
            }
        self.incarnations: dict[str, str] = {}
        """The incarnation last seen at each peer address."""
        self.posted = 0
        """Messages this process has sent: what casting through a tree keeps small."""
        self._early: dict[str, list[tuple[Body, Sequence[Buffer], str]]] = {}
        self._inbound: dict[str, dict[Connection, asyncio.Event]] = {}
        """Connections peers opened to us, by peer: closed if the peer is declared failed."""
        self._watchers: dict[str, dict[int, PeerWatcher]] = {}
        self._watch_ids = itertools.count(1)
        self.failed_peers: dict[str, BaseException] = {}
        self.undeliverable: Callable[[Runtime, Body, str], None] | None = None
        """Answers a message for a missing actor, so its sender does not wait forever."""
        self.control: dict[type, ControlHandler] = {}
        """Handlers of messages to the proc itself, by body type (see ``_services``)."""
        self.stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.loop_thread_id: int | None = None
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._inbox_scheduled = False
        self._draining = False
        self._last_cast = 0.0
        self._awake = False
        self._awake_until = 0.0
        self._awake_for = 0.0
        self._batching = 0
        """Depth of batches running: their writes are flushed together at the end."""
        self._dirty: list[_PeerWriter] = []

    # -- the loop's work, from any thread -------------------------------------------

    def call_soon(self, *request: Any) -> None:
        """Run ``fn(*args)`` on the loop, from any thread, in call order.

        Every thread's requests go through this one queue, so what a thread asks for
        happens in the order it asked (a cast, then a stop, say). A burst costs one
        loop wake-up, and the messages its work sends go out in one system call.
        """
        self._inbox.append(request)  # (fn, *args): one tuple, however many are queued
        if not self._inbox_scheduled:
            self._inbox_scheduled = True
            self.loop.call_soon_threadsafe(self._drain_inbox)

    def _drain_inbox(self) -> None:
        self._inbox_scheduled = False  # first: a request appended from now on schedules anew
        inbox = self._inbox
        self._batching += 1
        self._draining = True
        try:
            while inbox:
                fn, *args = inbox.popleft()
                try:
                    fn(*args)
                except Exception:
                    log.exception("runtime request %r failed", fn)
        finally:
            self._draining = False
            self._end_batch()

    def idle(self) -> bool:
        """No request made through ``call_soon`` is waiting or running: a thread may then
        send a message itself without overtaking one it asked the loop for earlier."""
        return not self._inbox and not self._draining

    def _end_batch(self) -> None:
        self._batching -= 1
        if self._batching == 0:
            if self._dirty:
                dirty, self._dirty = self._dirty, []
                for writer in dirty:
                    writer.flush()
            self._stay_awake()

    def _stay_awake(self) -> None:
        """Keep the loop from sleeping for ``wait_spin`` after it handled messages.

        A reply or the next call usually follows soon; a loop asleep in the poller
        would be woken for it, and on a VM a halted CPU's wake-up costs more than the
        whole message (round trip 70-90 -> 50 us). The loop yields the CPU between
        polls, so a thread with work to do gets it.
        """
        if self._awake:
            self._awake_until = time.perf_counter() + self._awake_for
            return
        from ._config import current_config

        spin = current_config().wait_spin
        if spin > 0:
            self._awake, self._awake_for = True, spin
            self._awake_until = time.perf_counter() + spin
            self.loop.call_soon(self._keep_awake)

    def _keep_awake(self) -> None:
        if time.perf_counter() < self._awake_until:
            os.sched_yield()
            self.loop.call_soon(self._keep_awake)  # the next poll does not wait
        else:
            self._awake = False

    def awake(self) -> bool:
        """Whether the loop is staying awake after messages (see ``_stay_awake``)."""
        return self._awake

    def flush_writes(self, batch: list[Any]) -> None:
        """Write what posts with ``batch`` (from a thread other than the loop's) held."""
        while batch:
            batch.pop().flush(on_loop=False)

    def on_loop(self) -> bool:
        """Whether the caller runs on this runtime's loop thread."""
        return threading.get_ident() == self.loop_thread_id

    async def start(self, listen: str = "unix://@", advertise: str | None = None) -> None:
        """Listen at ``listen``; this runtime is then known as ``advertise`` if given.

        A wildcard host (``tcp://0.0.0.0:0``, ``tcp://*:0``) is advertised as one of this
        machine's reachable addresses (see ``_netaddr``).
        """
        self.loop_thread_id = threading.get_ident()
        self.listener = await open_listener(bind_url(listen), secret=self.secret)
        self.address = str(advertised(self.listener.address, advertise))
        self.spawn_task(self.listener.serve(self._serve_connection))

    def spawn_task(self, coro: Any) -> asyncio.Task[Any]:
        """Run a task owned by the runtime (kept referenced until it ends)."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _serve_connection(self, conn: Connection) -> None:
        inbound = _Inbound(self, conn)
        try:
            if conn.start_receiving(inbound.take_pushed):  # asyncio: read in callbacks
                await inbound.ended
            else:
                while not inbound.ended.done():
                    inbound.take(await conn.receive())
                inbound.ended.result()
        except ConnectionClosed:
            pass  # the peer went away; a failure, if it is one, is noticed by its watchers
        except TransportError as exc:
            log.warning("dropped connection from %s: %s", inbound.sender, exc)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("dropped connection from %s: malformed message: %s", inbound.sender, exc)
        finally:
            inbound.close()

    def _admit(self, sender: str, incarnation: str | None) -> bool:
        """Whether a peer saying hello may talk to us.

        A peer declared failed stays failed: a process that comes back (SIGCONT, a
        healed partition) is not silently re-admitted. A new process that happens to
        get a failed one's address (a restarted worker, a recycled port) has another
        incarnation, and is a new peer.
        """
        if incarnation is not None:
            known = self.incarnations.setdefault(sender, incarnation)
            if known != incarnation:
                self.incarnations[sender] = incarnation
                self.forget(sender)
        if sender in self.failed_peers:
            log.warning(
                "refusing %s: it was declared failed (%s)", sender, self.failed_peers[sender]
            )
            return False
        return True

    def forget(self, address: str) -> None:
        """Treat ``address`` as a new peer: its old failure no longer applies."""
        if self.failed_peers.pop(address, None) is not None:
            writer = self._writers.pop(address, None)
            if writer is not None:
                writer.stop()

    def _can_pull_from(self, hello: Envelope) -> bool:
        """Whether we can read the memory of the peer saying ``hello`` (same machine)."""
        headers = hello.headers
        if not hello.sender.startswith("unix:") or "probe" not in headers:
            return False
        from ._config import current_config

        if not current_config().read_peer_buffers:
            return False
        try:
            pid, probe = int(headers["pid"]), int(headers["probe"])
        except (KeyError, ValueError):
            return False
        return can_read(pid, probe, headers.get("i", "").encode())

    async def _send_heartbeats(self, conn: Connection, hello: Envelope, pulls: bool) -> None:
        """Answer a hello with ours, then beat at the interval the peer asked for."""
        answer = {"i": self.incarnation, "pull": "1"} if pulls else {"i": self.incarnation}
        await conn.send([encode(Envelope(HEARTBEAT, "", self.address, 0, answer))])
        if not hello.dest:
            return  # no heartbeats wanted (a peer on this machine)
        try:
            interval = float(hello.dest)
        except ValueError:
            interval = math.nan
        if hello.kind != HEARTBEAT or not math.isfinite(interval):
            log.warning("bad heartbeat request from %s", hello.sender)
            return
        beat = [encode(Envelope(HEARTBEAT, "", self.address))]
        try:
            while True:
                await conn.send(beat)
                await asyncio.sleep(max(interval, 0.01))
        except TransportError:
            pass  # the connection is gone; its reader reports that

    # -- sending -------------------------------------------------------------------

    def post(
        self,
        address: str,
        kind: int,
        dest: str,
        body: Body,
        payload: Sequence[Buffer] = (),
        batch: list[Any] | None = None,
        on_loop: bool | None = None,
    ) -> None:
        """Send a message to ``address``, from any thread; never blocks.

        One thread's messages to one peer keep their order: they all go through that
        peer's writer, which the first of them creates. A thread other than the loop's
        may pass a ``batch`` (a list it keeps): the write then waits for
        ``flush_writes(batch)``, so replies to a burst go out in one system call.
        ``on_loop``: whether the caller runs on the loop, if it knows.
        """
        if on_loop is None:
            on_loop = self.on_loop()
        self.posted += 1
        envelope = Envelope(kind, dest, self.address)
        if address == self.address:  # to itself: the objects as they are, no encoding
            if on_loop:
                self.loop.call_soon(self._deliver, envelope, body, payload)
            else:
                self.call_soon(self._deliver, envelope, body, payload)
            return
        writer = self._writers.get(address)
        if writer is None:
            if address in self.failed_peers:
                return  # undeliverable; watchers already learned of the failure
            writer = self._writer(address, on_loop)
        message: Packed | Sequence[Buffer]
        if not payload or (
            len(payload) == 1 and type(payload[0]) is bytes and len(payload[0]) <= PACK_MAX
        ):
            message = Packed(envelope, body, tuple(payload))  # type: ignore[arg-type]
        else:
            message = [encode(envelope), encode_body(body), *payload]
            if writer.lend and len(message) > 3:
                message = self.lender.lend_parts(message, address, writer.ring)
        if on_loop:
            writer.post(message, True, self._dirty if self._batching else None)
        else:
            writer.post(message, False, batch)

    def _writer(self, address: str, on_loop: bool = True) -> _PeerWriter:
        """The writer to ``address``, made (and, on the loop or soon, started) if new."""
        writer = self._writers.get(address)
        if writer is None:
            writer = self._writers.setdefault(address, _PeerWriter(self, address))
            if on_loop:
                writer.start()
            else:
                self.call_soon(writer.start)
        return writer

    def cast(
        self, targets: Sequence[str], dest: str, call: Call, payload: Sequence[Buffer]
    ) -> None:
        """Send ``call`` to every target through the cast tree (see ``_cast``), from any
        thread. Off the loop, a lone cast is written at once by the calling thread (no
        wake-up anywhere); casts closer together than BURST are left to the writer tasks,
        so a burst becomes one system call per peer."""
        batch: list[Any] | None = None
        burst = False
        on_loop = self.on_loop()
        if not on_loop:
            now = time.monotonic()
            burst = now - self._last_cast < BURST
            self._last_cast = now
            batch = DEFER if burst else []
        if len(targets) == 1 and not call.forward:
            self.post(targets[0], TO_ACTOR, dest, call, payload, batch, on_loop)
        else:
            from ._config import current_config

            post = functools.partial(self.post, batch=batch, on_loop=on_loop)
            fan_out(post, targets, dest, call, payload, current_config().max_cast_fanout)
        if batch and not burst:
            self.flush_writes(batch)

    def send_to_port(
        self,
        port: PortRef,
        body: Body,
        payload: Sequence[Buffer] = (),
        batch: list[Any] | None = None,
    ) -> None:
        self.post(port.proc, TO_PORT, str(port.port), body, payload, batch)

    # -- receiving -----------------------------------------------------------------

    def _dispatch(self, frame: Sequence[Buffer], rings: dict[RingKey, RingReader | None]) -> str:
        """Deliver a message of several parts read from a peer (whose rings we have
        opened are ``rings``); returns its sender."""
        envelope = decode_envelope(frame[0])  # type: ignore[arg-type]
        body = decode_body(frame[1])
        if len(frame) > 3 and any(map(is_descriptor, frame[3:])):
            try:
                frame, keys = borrow(frame, rings)
            except PullError as exc:
                log.error("dropped a message from %s: %s", envelope.sender, exc)
                if self.undeliverable is not None:
                    self.undeliverable(self, body, envelope.dest)
                return envelope.sender
            self.post(envelope.sender, TO_PROC, "", ReturnLoans(tuple(keys)))
        return self._deliver(envelope, body, frame[2:])

    def _deliver(self, envelope: Envelope, body: Body, payload: Sequence[Buffer]) -> str:
        """Hand a message (read from a peer, or sent to ourselves) to its port, actor or
        this proc; returns its sender."""
        kind = envelope.kind
        if kind == TO_PORT:
            handler = self._ports.get(int(envelope.dest))
            if handler is None:
                log.debug("message for closed port %s from %s", envelope.dest, envelope.sender)
            else:
                handler(body, payload)
        elif kind == TO_ACTOR:
            if isinstance(body, Call) and body.forward:  # relay first
                below = msgspec.structs.replace(body, seqs=body.seqs[1:]) if body.seqs else body
                self.cast(body.forward, envelope.dest, below, payload)
            sink = self.actors.get(envelope.dest)
            if sink is None:
                self._hold(envelope.dest, body, payload, envelope.sender)
            else:
                sink(body, payload, envelope.sender)
        elif kind == TO_PROC:
            if isinstance(body, StopProc):
                self.stopped.set()
                return envelope.sender
            if isinstance(body, ReturnLoans):
                self.lender.give_back(body.keys)
                return envelope.sender
            control = self.control.get(type(body))
            if control is None:
                log.warning("unexpected %s from %s", type(body).__name__, envelope.sender)
            else:
                control(self, body, payload, envelope.sender)
        return envelope.sender

    def _hold(self, dest: str, body: Body, payload: Sequence[Buffer], sender: str) -> None:
        """Keep a message for an actor not spawned here yet.

        A mesh passed in a message can be called by its receiver before the spawn
        (sent by another process) arrives; such calls wait here, in order, for up to
        ``message_delivery_timeout``, then are refused as undeliverable.
        """
        early = self._early.get(dest)
        if early is None:
            from ._config import current_config

            early = self._early[dest] = []
            self.loop.call_later(current_config().message_delivery_timeout, self._expire, dest)
        early.append((body, payload, sender))

    def _expire(self, dest: str) -> None:
        for body, _, sender in self._early.pop(dest, ()):
            log.warning("message for unknown actor %s from %s", dest, sender)
            if self.undeliverable is not None:
                self.undeliverable(self, body, dest)

    def add_actor(self, dest: str, sink: ActorSink) -> None:
        """Route messages for ``dest`` to ``sink``, starting with any that came early."""
        self.actors[dest] = sink
        for body, payload, sender in self._early.pop(dest, ()):
            sink(body, payload, sender)

    def open_port(self, handler: PortHandler) -> PortRef:
        port = next(self._port_ids)
        self._ports[port] = handler
        return PortRef(self.address, port)

    def close_port(self, port: PortRef) -> None:
        self._ports.pop(port.port, None)

    # -- failures ---------------------------------------------------------------------

    def watch_peer(self, address: str, watcher: PeerWatcher) -> int:
        """Call ``watcher(address, exc)`` (on the loop) if that peer fails; returns a key
        for ``unwatch_peer``. From any thread; a watcher must tolerate a second call."""
        key = next(self._watch_ids)
        on_loop = self.on_loop()
        if address not in self.failed_peers:
            self._watchers.setdefault(address, {})[key] = watcher
            if address != self.address:
                self._writer(address, on_loop)  # connect now: a death is noticed at once
        # Checked after registering: a failure declared meanwhile is not missed.
        failure = self.failed_peers.get(address)
        if failure is not None:
            if on_loop:
                self.loop.call_soon(watcher, address, failure)
            else:
                self.call_soon(watcher, address, failure)
        return key

    def unwatch_peer(self, address: str, key: int) -> None:
        watchers = self._watchers.get(address)
        if watchers is not None:
            watchers.pop(key, None)

    def _peer_failed(self, address: str, exc: BaseException) -> None:
        """Declare a peer failed, for good: cut every connection with it, tell watchers."""
        if address in self.failed_peers:
            return
        self.failed_peers[address] = exc
        writer = self._writers.get(address)
        if writer is not None:
            writer.failure = writer.failure or exc
            writer.stop()
        inbound = self._inbound.pop(address, {})
        if inbound:
            self.spawn_task(self._drain_then_notify(address, exc, inbound))
        else:
            self._notify_failed(address, exc)

    async def _drain_then_notify(
        self, address: str, exc: BaseException, inbound: dict[Connection, asyncio.Event]
    ) -> None:
        """Read what a dead peer sent before it died, then fail what waits on it.

        A reply the peer sent just before dying is still in our receive buffer; calls
        must get it, not a SupervisionError. A dead process's connections end at once;
        a frozen one's are cut after a short grace.
        """
        try:
            await asyncio.wait_for(
                asyncio.gather(*(drained.wait() for drained in inbound.values())), DRAIN_GRACE
            )
        except TimeoutError:
            pass
        for conn in inbound:
            self.spawn_task(conn.aclose())
        self._notify_failed(address, exc)

    def _notify_failed(self, address: str, exc: BaseException) -> None:
        self.lender.forget(address)
        for watcher in list(self._watchers.pop(address, {}).values()):
            try:
                watcher(address, exc)
            except Exception:
                log.exception("peer watcher failed")

    def peer_exited(self, address: str, how: str) -> None:
        """A child process we spawned has exited (seen by its parent at once)."""
        self._peer_failed(address, PeerLost(f"process at {address} {how}"))

    async def aclose(self) -> None:
        for writer in list(self._writers.values()):
            writer.stop()
        if self.listener is not None:
            await self.listener.aclose()
        for task in list(self._tasks):
            task.cancel()


# -- the process's runtime -------------------------------------------------------------

_runtime: Runtime | None = None
_lock = threading.Lock()


def current_runtime(listen: str | None = None) -> Runtime:
    """This process's runtime, starting the controller's on first use.

    ``listen`` is where a runtime this call starts listens (default: per the configured
    ``default_transport``); it does not move a runtime already running.
    """
    runtime = _runtime
    if runtime is None:
        with _lock:
            if _runtime is None:
                _start_controller_runtime(listen)
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
    if transport.startswith("tls"):
        raise NotImplementedError(
            "the tls transport needs certificates, which monarch-core cannot configure yet; "
            "use 'tcp' (every connection is still authenticated with the job secret)"
        )
    if transport == "tcp":
        # Every interface, known by an address other machines can reach (Runtime.start).
        return "tcp://0.0.0.0:0"
    return str(transport)


def _start_controller_runtime(listen: str | None = None) -> None:
    loop = new_event_loop()
    ready = threading.Event()
    runtime = Runtime(loop, job_secret())
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            try:
                await runtime.start(listen or _listen_address())
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
    os.environ.setdefault(ROOT_ENV, runtime.address)  # this client is the job's root
    install_runtime(runtime)
