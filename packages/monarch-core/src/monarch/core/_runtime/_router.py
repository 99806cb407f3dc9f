"""``Runtime``: where every message of this process comes in and goes out.

It owns the listener, a ``PeerWriter`` per peer, the ports, the local actors' sinks and
the control handlers, and it tells watchers when a peer fails; what a peer's connection
brings in is read by ``_inbound``. See the package docstring for which thread may call what.
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
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import msgspec

from monarch.core._bulk._lending import Lender, RingKey, borrow, can_read, is_descriptor
from monarch.core._bulk._lending import available as lending_available
from monarch.core._bulk._ring import RingReader
from monarch.core._config import current_config
from monarch.core._errors import PeerLost, PullError
from monarch.core._payload._filling import fill_parts
from monarch.core._payload._memory import address_of as memory_address
from monarch.core._placement import follow
from monarch.core._runtime._messages import (
    PACK_MAX,
    TO_ACTOR,
    TO_PORT,
    TO_PROC,
    Beat,
    Body,
    Call,
    Envelope,
    Hello,
    Packed,
    PortRef,
    ReturnLoans,
    StopProc,
    decode_body,
    decode_envelope,
    decode_single,
    encode,
    encode_body,
)
from monarch.core._runtime._netaddr import advertised, bind_url
from monarch.core._runtime._open_files import raise_open_files_limit
from monarch.transport import (
    Buffer,
    Connection,
    ConnectionClosed,
    Frame,
    FrameQueue,
    Listener,
    TransportError,
    open_listener,
)

from ._beats import Beats
from ._cast import SendOrder, fan_out, split
from ._combine import Combine
from ._flow import Flow
from ._inbound import Inbound, send_back
from ._instrument import begin_operation, instrumented
from ._peers import DEFER, PeerWriter, peer_options
from ._spin import spin_seconds, yield_cpu

log = logging.getLogger("monarch.core")

DRAIN_GRACE: Final = 0.25
"""Seconds a failed peer's open connections are still read, for what it sent before."""
BEAT: Final = encode(Beat())
"""A heartbeat: a ``Beat`` that says nothing more."""
BURST: Final = 50e-6
"""Casts from a thread closer together than this (seconds) are written together."""


class _Held(threading.local):
    batch: list[Any] | None = None
    """The writes this thread holds (``sends_together``), if it holds them."""


_held = _Held()


@contextmanager
def sends_together() -> Iterator[None]:
    """Hold the casts and calls this thread makes (off a runtime's loop) and write them as
    the block ends: what goes to one peer leaves in one system call and is read there at
    once (a batch of commands and the fetch behind it), with no hand-off to the loop's
    writer that casts in a burst would get. Nested blocks write at the outermost's end."""
    if _held.batch is not None:
        yield
        return
    batch: list[Any] = []
    _held.batch = batch
    try:
        yield
    finally:
        _held.batch = None
        while batch:
            batch.pop().flush(on_loop=False)


PortHandler = Callable[[Body, Sequence[Buffer]], None]
ActorSink = Callable[[Body, Sequence[Buffer], str], None]
ControlHandler = Callable[["Runtime", Any, Sequence[Buffer], str], None]
PeerWatcher = Callable[[str, BaseException], None]
Service = Callable[[Connection], Awaitable[None]]
"""Serves a connection handed to it (see ``Runtime.services``); it ends when this returns."""


class Runtime:
    """The Monarch runtime of this process (see the module docstring)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, secret: bytes, *, own_thread: bool = False
    ) -> None:
        self.loop = loop
        self.secret = secret
        self.own_thread = own_thread
        """Its loop runs on a thread of its own (a client's runtime thread, a proc's or a
        worker's): only such a loop follows its waiters' CPU (``_placement``), never one
        on a thread that runs other code too (the zygote's rehearsals, a test's loop)."""
        self.address = ""
        self.root = ""
        """The address of the job's root client (set by ``_bootstrap``): where
        ``get_or_spawn_controller`` asks, and what procs spawned from here inherit."""
        self.listener: Listener | None = None
        self.services: dict[str, Service] = {}
        """Services of this runtime's listener by name: a connection whose hello asks for
        one (``SERVICE``) is handed to it (the debugger's sessions, see ``_debugger``)."""
        self.via: str | None = None
        """A gateway (``gateway://host:port``) through which network peers are reached:
        set by ``attach`` for a client outside its workers' network."""
        self._writers: dict[str, PeerWriter] = {}
        self._lanes: dict[str, PeerWriter] = {}
        """Writers of the peers' lanes: values for their inboxes (see ``_flow``)."""
        self._ports: dict[int, PortHandler] = {}
        self._port_ids = itertools.count(1)
        self.actors: dict[str, ActorSink] = {}
        self.send_order = SendOrder()
        self.incarnation = secrets.token_hex(8)
        """This process's identity: stable when its address changes, new in a new process."""
        self.hello = Hello("", self.incarnation)
        """What our writers' hellos say (each adds our address and what it asks)."""
        self.lender = Lender()
        """Our large buffers read by peers of this machine (see ``_lending``)."""
        self._token = self.incarnation.encode()
        if lending_available():
            # What a peer of this machine reads to find out it may read our memory.
            self.hello = Hello(
                "", self.incarnation, pid=os.getpid(), probe=memory_address(self._token)
            )
        self.incarnations: dict[str, str] = {}
        """The incarnation last seen at each peer address."""
        self.posted = 0
        """Messages this process has sent: what casting through a tree keeps small."""
        self.received = 0
        """Messages peers' connections brought in (each of a ``Batch`` counted)."""
        self.dialed: Counter[str] = Counter()
        """Connections this runtime opened, by peer (``dial``): a handshake each, most of
        what a proc spends starting after its fork, so tests hold it to one per peer."""
        self._early: dict[str, list[tuple[Body, Sequence[Buffer], str]]] = {}
        self._spawning: set[str] = set()
        """Actors whose spawn came here and is still being read (see ``spawn_arrived``)."""
        self._inbound: dict[str, dict[Connection, asyncio.Event]] = {}
        """Connections peers opened to us, by peer: closed if the peer is declared failed."""
        self._watchers: dict[str, dict[int, PeerWatcher]] = {}
        self._watch_ids = itertools.count(1)
        self.failed_peers: dict[str, BaseException] = {}
        self.vouched: dict[str, str] = {}
        """Peers a host agent watches for us (peer -> the agent, see ``_host._watching``): no
        heartbeats either way on our connections with them; the agent says if one is lost."""
        self.undeliverable: Callable[[Runtime, Body, str], None] | None = None
        """Answers a message for a missing actor, so its sender does not wait forever."""
        self.control: dict[type, ControlHandler] = {}
        """Handlers of messages to the proc itself, by body type (see ``_services``)."""
        self.stopped = asyncio.Event()
        self.beats = Beats()
        """Heartbeats to the peers that asked for them, sent off the loop."""
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
        self._dirty: list[PeerWriter] = []
        self.delivering: Flow | None = None
        """The lane whose messages are being delivered, if any: an inbox that queues
        one of them holds it (``Flow.hold``) until it is consumed."""
        self._held: set[Inbound] = set()
        """Lanes not read because their inboxes are full (see ``_flow``)."""
        self._waiting_anywhere = 0
        """Receivers waiting on an empty inbox that has never received from a lane."""

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
            spin = spin_seconds()
            # On its waiter's CPU, which spins (``_placement``), else it spins itself.
            if not (self.own_thread and follow(spin)):
                self._stay_awake(spin)

    def _stay_awake(self, spin: float) -> None:
        """Keep the loop from sleeping for ``wait_spin`` after it handled messages (the
        waiters' rule, see ``_spin``): round trip 70-90 -> 50 us on a VM. It cannot block
        in ``spin``, so it re-schedules itself, yielding between polls that do not wait.
        """
        if self._awake:
            self._awake_until = time.perf_counter() + self._awake_for
            return
        if spin > 0:
            self._awake, self._awake_for = True, spin
            self._awake_until = time.perf_counter() + spin
            self.loop.call_soon(self._keep_awake)

    def _keep_awake(self) -> None:
        if time.perf_counter() < self._awake_until and yield_cpu():
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
        raise_open_files_limit()  # a connection per proc: more than a desktop's default
        self.listener = await open_listener(
            bind_url(listen), secret=self.secret, **peer_options(listen, server=True)
        )
        self.address = str(advertised(self.listener.address, advertise))
        self.spawn_task(self.listener.serve(self._serve_connection))

    def spawn_task(self, coro: Any) -> asyncio.Task[Any]:
        """Run a task owned by the runtime (kept referenced until it ends)."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _serve_connection(self, conn: Connection) -> None:
        inbound = Inbound(self, conn)
        try:
            hello = await conn.receive()
            service = self._service_of(hello)
            if service is not None:
                await service(conn)
                return
            inbound.take(hello)
            push = inbound.push
            if push is not None and push.start_receiving(inbound.take_pushed):  # on asyncio
                inbound.pushed = True
                await inbound.ended
            else:
                while not inbound.ended.done():
                    await inbound.wait_turn()
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

    def _service_of(self, hello: Frame) -> Service | None:
        """The service a connection's first frame asks for (``Hello.service``), if any."""
        if len(hello) != 1 or not self.services:
            return None
        try:
            head = decode_single(hello[0])
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # the peer's reader says why
        if not isinstance(head, Hello) or not head.service:
            return None
        service = self.services.get(head.service)
        if service is None:
            log.warning("%s asked for service %r, not offered here", head.sender, head.service)
        return service

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

    def reached(self, address: str) -> bool:
        """Whether this runtime's connection to ``address`` was ever made (its hello sent)."""
        writer = self._writers.get(address)
        return writer is not None and writer.connected.is_set()

    def forget(self, address: str) -> None:
        """Treat ``address`` as a new peer: its old failure no longer applies."""
        if self.failed_peers.pop(address, None) is not None:
            for writers in (self._writers, self._lanes):
                writer = writers.pop(address, None)
                if writer is not None:
                    writer.stop()

    def _can_pull_from(self, hello: Hello) -> bool:
        """Whether we can read the memory of the peer saying ``hello`` (same machine)."""
        if not hello.sender.startswith("unix:") or not hello.probe:
            return False
        if not current_config().read_peer_buffers:
            return False
        return can_read(hello.pid, hello.probe, hello.incarnation.encode())

    async def _send_heartbeats(self, queue: FrameQueue, hello: Hello, pulls: bool) -> None:
        """Answer a hello with ours, then beat at the interval the peer asked for."""
        await send_back(queue, encode(Beat(self.incarnation, pull=pulls)))
        interval = hello.heartbeat_interval
        if interval == 0:
            return  # no heartbeats wanted (a peer on this machine)
        if not math.isfinite(interval) or interval < 0:
            log.warning("bad heartbeat interval %r from %s", interval, hello.sender)
            return
        self.beats.add(queue, max(interval, 0.01), [BEAT])

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
        lane: bool = False,
    ) -> None:
        """Send a message to ``address``, from any thread; never blocks for long.

        One thread's messages to one peer keep their order: they all go through that
        peer's writer, which the first of them creates. A thread other than the loop's
        may pass a ``batch`` (a list it keeps): the write then waits for
        ``flush_writes(batch)``, so replies to a burst go out in one system call.
        ``on_loop``: whether the caller runs on the loop, if it knows. ``lane``: a value
        for one of the peer's inboxes, sent on its lane; a sender that goes faster than
        the peer consumes waits a little (see ``_flow``).
        """
        if on_loop is None:
            on_loop = self.on_loop()
        self.posted += 1
        envelope = Envelope(kind, dest, self.address)
        if address == self.address:  # to itself: the objects as they are, no encoding
            fill_parts(payload)  # delivered as it is at the call
            if on_loop:
                self.loop.call_soon(self._deliver, envelope, body, payload)
            else:
                self.call_soon(self._deliver, envelope, body, payload)
            return
        writer = (self._lanes if lane else self._writers).get(address)
        if writer is None:
            if address in self.failed_peers:
                return  # undeliverable; watchers already learned of the failure
            writer = self._writer(address, on_loop, lane)
        message: Packed | Sequence[Buffer]
        if not payload or (
            len(payload) == 1 and type(payload[0]) is bytes and len(payload[0]) <= PACK_MAX
        ):
            message = Packed(envelope, body, tuple(payload))  # type: ignore[arg-type]
        else:
            message = [encode(envelope), encode_body(body), *payload]
            if writer.lend and len(message) > 3:
                message = self.lender.lend_parts(message, address, writer.ring)
            else:
                fill_parts(payload)  # written later (or elsewhere): as it is at the call
        if on_loop:
            writer.post(message, True, self._dirty if self._batching else None)
        else:
            writer.post(message, False, batch)
        if lane:
            writer.throttle(on_loop)

    def _writer(self, address: str, on_loop: bool = True, lane: bool = False) -> PeerWriter:
        """The writer to ``address`` (its lane's if ``lane``), made (and, on the loop or
        soon, started) if new. A lane comes after the main connection, which watches the
        peer's health."""
        writers = self._lanes if lane else self._writers
        writer = writers.get(address)
        if writer is None:
            main = self._writer(address, on_loop) if lane else None
            writer = writers.setdefault(address, PeerWriter(self, address, lane, main))
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
        held = None if on_loop else _held.batch
        if held is not None:
            batch, burst = held, True  # written as ``sends_together`` ends
        elif not on_loop:
            now = time.monotonic()
            burst = now - self._last_cast < BURST
            self._last_cast = now
            batch = DEFER if burst else []
        if len(targets) == 1 and not call.forward:
            self.post(targets[0], TO_ACTOR, dest, call, payload, batch, on_loop)
        else:
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
        self.post(port.proc, TO_PORT, str(port.port), body, payload, batch, lane=port.inbox)

    # -- receiving -----------------------------------------------------------------

    def _dispatch(self, frame: Sequence[Buffer], rings: dict[RingKey, RingReader | None]) -> str:
        """Deliver a message of several parts read from a peer (whose rings we have
        opened are ``rings``); returns its sender."""
        envelope = decode_envelope(frame[0])
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
                if body.tree and body.reply is not None:
                    body = self._gather_below(body)
                scope = None
                if instrumented():  # telemetry's span of the relay; its name only then
                    relay = f"relay {body.mesh}.{body.method} to {len(body.forward)} procs"
                    scope = begin_operation("relay", relay, body.trace, envelope.dest)
                below = msgspec.structs.replace(body, seqs=body.seqs[1:]) if body.seqs else body
                self.cast(body.forward, envelope.dest, below, payload)
                if scope is not None:  # telemetry's span of the relay
                    scope.close(None)
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
                lane = self._lanes.get(envelope.sender)
                if lane is not None:
                    lane.made_room()
                return envelope.sender
            control = self.control.get(type(body))
            if control is None:
                log.warning("unexpected %s from %s", type(body).__name__, envelope.sender)
            else:
                control(self, body, payload, envelope.sender)
        return envelope.sender

    def _gather_below(self, call: Call) -> Call:
        """This relay gathers the replies of its subtree (its own actors', and one batch per
        subtree below it) and sends them up as one message (see ``_combine``): ``call``
        with the reply port that does."""
        assert call.reply is not None
        heads = [chunk[0] for chunk in split(call.forward, current_config().max_cast_fanout)]
        combine = Combine(self, call.reply, 1 + len(heads), fail_fast=True, watch=heads)
        return msgspec.structs.replace(call, reply=combine.port)

    def _hold(self, dest: str, body: Body, payload: Sequence[Buffer], sender: str) -> None:
        """Keep a message for an actor not spawned here yet.

        A mesh passed in a message can be called by its receiver before the spawn
        (sent by another process) arrives; such calls wait here, in order, for up to
        ``message_delivery_timeout``, then are refused as undeliverable. Once the spawn
        has arrived they wait for the actor however long reading it takes.
        """
        early = self._early.get(dest)
        if early is None:
            early = self._early[dest] = []
            self._expire_later(dest, early)
        early.append((body, payload, sender))

    def _expire_later(self, dest: str, early: list[tuple[Body, Sequence[Buffer], str]]) -> None:
        delay = current_config().message_delivery_timeout
        self.loop.call_later(delay, self._expire, dest, early)

    def _expire(self, dest: str, early: list[tuple[Body, Sequence[Buffer], str]]) -> None:
        if self._early.get(dest) is not early:
            return  # delivered meanwhile (a later hold for ``dest`` has its own timer)
        if dest in self._spawning:
            self._expire_later(dest, early)  # until the spawn is read or abandoned
            return
        del self._early[dest]
        for body, _, sender in early:
            log.warning("message for unknown actor %s from %s", dest, sender)
            if self.undeliverable is not None:
                self.undeliverable(self, body, dest)

    def spawn_arrived(self, dest: str) -> None:
        """The spawn of ``dest`` came and is being read (its module imported: seconds,
        tens of them on a loaded machine): messages for it wait for ``add_actor``, not
        just ``message_delivery_timeout``, so a call sent after a spawn is never
        refused as one for an actor that does not exist."""
        self._spawning.add(dest)

    def spawn_abandoned(self, dest: str) -> None:
        """The spawn of ``dest`` will not add it: its messages are refused when due."""
        self._spawning.discard(dest)

    def add_actor(self, dest: str, sink: ActorSink) -> None:
        """Route messages for ``dest`` to ``sink``, starting with any that came early."""
        self._spawning.discard(dest)
        self.actors[dest] = sink
        for body, payload, sender in self._early.pop(dest, ()):
            sink(body, payload, sender)

    def open_port(self, handler: PortHandler, inbox: bool = False) -> PortRef:
        """A port whose values go to ``handler`` (on the loop). An ``inbox`` queues them
        for a consumer that may be slower than its senders: they come on lanes, and it
        holds each until consumed (see ``_flow``)."""
        port = next(self._port_ids)
        self._ports[port] = handler
        return PortRef(self.address, port, inbox)

    def wanted(self, flow: Flow) -> bool:
        """Whether a receiver waits on an empty inbox that ``flow`` may feed."""
        return flow.wanted > 0 or self._waiting_anywhere > 0

    def receiver_waiting(self, sources: Collection[Flow], waiting: bool) -> None:
        """A ``recv()`` starts (``waiting``) or stops waiting on an empty inbox that
        ``sources`` have fed before (the same ones both times). Its value may be behind
        a lane held for another inbox, so while it waits those lanes (any lane if it
        knows none) are read on, up to ``HARD_LIMIT``."""
        step = 1 if waiting else -1
        if sources:
            for flow in sources:
                flow.wanted += step
        else:
            self._waiting_anywhere += step
        if waiting:
            for inbound in list(self._held):
                held = inbound.flow
                if held is not None and (not sources or held in sources) and not held.over(True):
                    inbound.read_on()

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
            # Connect now, so a death is noticed at once; unless a host agent watches the
            # peer for us (``vouched``): its word on the peer comes over our connection
            # with the agent, and a connection to each such peer is what a job's
            # controller must not hold (issue 34).
            if address != self.address and address not in self.vouched:
                self._writer(address, on_loop)
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
        for writers in (self._writers, self._lanes):
            writer = writers.get(address)
            if writer is not None:
                writer.failure = writer.failure or exc
                writer.room.set()
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

    def peer_lost(self, address: str, exc: BaseException) -> None:
        """Declare a peer failed on another's word: its host agent's, which watches it for
        us (``vouched``)."""
        self._peer_failed(address, exc)

    def peer_exited(self, address: str, how: str) -> None:
        """A child process we spawned has exited (seen by its parent at once)."""
        self._peer_failed(address, PeerLost(f"process at {address} {how}"))

    async def aclose(self) -> None:
        self.beats.close()
        for writer in [*self._writers.values(), *self._lanes.values()]:
            writer.stop()
        if self.listener is not None:
            await self.listener.aclose()
        for task in list(self._tasks):
            task.cancel()
