"""A connection a peer opened to this process: its hello, then its messages, read a turn at a
time and handed to the ports, actors and services they are for."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, Final, Protocol

import anyio

from monarch.core._bulk._lending import RingKey
from monarch.core._bulk._ring import RingReader
from monarch.core._runtime._messages import (
    Batch,
    Beat,
    Body,
    Envelope,
    Hello,
    Packed,
    decode_single,
    encode,
)
from monarch.transport import (
    Buffer,
    Connection,
    ConnectionAttribute,
    Frame,
    FrameQueue,
    TransportError,
)

from ._beats import Beats
from ._flow import TURN_BYTES, TURN_MESSAGES, Flow
from ._sendqueue import frame_queue

CONSUMED: Final = encode(Beat(consumed=True))
"""A held lane's notice to its sender: its inboxes consume (see ``_flow``)."""


class Receiver(Protocol):
    """What a connection peers opened needs of the runtime that reads it (``_router``'s
    ``Runtime``, above this module): delivery in batches, admission, heartbeats, and the
    runtime's books of held lanes and open connections."""

    loop: asyncio.AbstractEventLoop
    beats: Beats
    received: int
    delivering: Flow | None
    _batching: int
    _held: set[Inbound]
    _inbound: dict[str, dict[Connection, asyncio.Event]]

    def _dispatch(self, frame: Sequence[Buffer], rings: dict[RingKey, RingReader | None]) -> str:
        """Deliver a message of several parts; returns its sender."""

    def _deliver(self, envelope: Envelope, body: Body, payload: Sequence[Buffer]) -> str:
        """Deliver one decoded message; returns its sender."""

    def _end_batch(self) -> None:
        """A batch of deliveries ended: flush what they sent."""

    def wanted(self, flow: Flow) -> bool:
        """Whether a receiver waits on one of ``flow``'s inboxes."""

    def spawn_task(self, coro: Any) -> asyncio.Task[Any]:
        """Run a task owned by the runtime."""

    def _admit(self, sender: str, incarnation: str | None) -> bool:
        """Whether a peer's hello is admitted."""

    def _can_pull_from(self, hello: Hello) -> bool:
        """Whether we may read the peer's memory (it is on this machine)."""

    def _send_heartbeats(
        self, queue: FrameQueue, hello: Hello, pulls: bool
    ) -> Coroutine[Any, Any, None]:
        """Answer a hello, then beat at the interval the peer asked for."""


class Inbound:
    """A connection a peer opened to us: its hello, then its messages, a turn at a time.

    Each turn delivers at most ``TURN_MESSAGES`` (``TURN_BYTES``), then the connection
    is not read until its next turn, so the loop runs what waits meanwhile. A *lane*
    (values for our inboxes, see ``_flow``) is also held, not read, while its inboxes
    have not consumed enough of what it delivered.
    """

    def __init__(self, runtime: Receiver, conn: Connection) -> None:
        self.runtime = runtime
        self.conn = conn
        self.queue = frame_queue(conn, runtime.loop)
        """Our sending side (``_sendqueue``): the hello's answer, heartbeats, notices."""
        self.push = conn.extra(ConnectionAttribute.push_receiver, None)
        """The connection's push mode, where it has one (see ``_serve_connection``)."""
        self.sender = "?"
        self.ended: asyncio.Future[None] = runtime.loop.create_future()
        """Done when the connection is refused or fails (with the failure)."""
        self._beats: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()
        self.rings: dict[RingKey, RingReader | None] = {}
        """The sender's rings we have opened (see ``_ring``)."""
        self.flow: Flow | None = None
        """Set for a lane (by its hello): what it delivered that is not consumed yet."""
        self.pushed = False
        """Read in push mode (callbacks), else by ``_serve_connection``'s loop."""
        self.paused = False
        """Reading is paused: the turn is over, or the lane is held."""
        self._turn_due = False
        self._resumed = asyncio.Event()
        """Pull mode: set when a held lane may be read again."""

    def take_pushed(self) -> None:
        """Frames are ready (push mode): take them; a failure ends the connection."""
        if self.ended.done():
            return
        try:
            self.take(None)
        except Exception as exc:  # noqa: BLE001 - raised again by _serve_connection
            self.ended.set_exception(exc)

    def take(self, frame: Frame | None) -> None:
        """Deliver ``frame`` and the frames already read, a turn's worth, as one batch:
        what they send in return goes out together when it ends."""
        runtime, push, flow = self.runtime, self.push, self.flow
        if frame is None and flow is not None and flow.held_up:
            assert push is not None  # frame is None: push mode
            if push.closed and not self.ended.done():
                self.ended.set_result(None)  # we closed it (its peer failed): drop the rest
            return
        runtime._batching += 1
        runtime.delivering = flow
        messages = size = 0
        try:
            if frame is None:
                assert push is not None
                frame = push.receive_nowait()
            while True:
                if len(frame) > 1:
                    self.sender = runtime._dispatch(frame, self.rings)
                    messages += 1
                    for part in frame:
                        size += len(part)
                else:
                    single = decode_single(frame[0])
                    size += len(frame[0])
                    if isinstance(single, Packed):
                        self.sender = runtime._deliver(single.envelope, single.body, single.payload)
                        messages += 1
                    elif isinstance(single, Batch):
                        deliver = runtime._deliver
                        for packed in single.items:
                            self.sender = deliver(packed.envelope, packed.body, packed.payload)
                        messages += len(single.items)
                    elif not self._hello(single):
                        self.ended.set_result(None)
                        return
                if flow is not None and flow.over(runtime.wanted(flow)):
                    self._hold()
                    return
                if messages >= TURN_MESSAGES or size >= TURN_BYTES:
                    self._end_turn()
                    return
                if push is None:
                    return  # one frame per receive() where there is no push mode
                if not push.frames_ready():
                    self._all_taken()
                    return
                frame = push.receive_nowait()
        except anyio.WouldBlock:
            self._all_taken()
        finally:
            runtime.received += messages
            runtime.delivering = None
            runtime._end_batch()

    def _all_taken(self) -> None:
        """Push mode, every frame read is taken: read the socket again if paused."""
        if self.paused and self.push is not None:
            self.paused = False
            self.push.resume_receiving()

    def _pause(self) -> None:
        if not self.paused:
            self.paused = True
            if self.push is not None:
                self.push.pause_receiving()

    def _end_turn(self) -> None:
        """The turn is over: the rest waits for the next (push mode: a callback; pull
        mode: ``_serve_connection`` lets the loop run first)."""
        self._pause()
        if self.pushed and not self._turn_due:
            self._turn_due = True
            self.runtime.loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_due = False
        self.take_pushed()

    def _hold(self) -> None:
        """The lane's inboxes are full: not read until they have room (``read_on``)."""
        assert self.flow is not None
        self.flow.held_up = True
        self.runtime._held.add(self)
        self._resumed.clear()
        self._pause()

    def read_on(self) -> None:
        """A held lane may be read again (its inboxes have room, or a receiver waits)."""
        assert self.flow is not None
        self.flow.held_up = False
        self.runtime._held.discard(self)
        self._resumed.set()
        if self.pushed and not self._turn_due:
            self._turn_due = True
            self.runtime.loop.call_soon(self._next_turn)

    def _notice(self) -> None:
        """Tell the sender of a held lane that its inboxes consume (see ``_flow``)."""
        self.runtime.spawn_task(self._send_quietly(CONSUMED))

    async def _send_quietly(self, frame: bytes) -> None:
        await send_back(self.queue, frame)

    async def wait_turn(self) -> None:
        """Pull mode: return when the connection may be read."""
        if self.paused:
            self.paused = False
            await asyncio.sleep(0)  # the loop runs what waits
        flow = self.flow
        while flow is not None and flow.held_up:
            await self._resumed.wait()

    def _hello(self, hello: Hello) -> bool:
        """A peer's hello (see PeerWriter.run): whether it is admitted."""
        runtime = self.runtime
        self.sender = hello.sender
        if not runtime._admit(hello.sender, hello.incarnation or None):
            return False
        runtime._inbound.setdefault(hello.sender, {})[self.conn] = self._drained
        if hello.lane and self.flow is None:
            self.flow = Flow(self.read_on, self._notice)
        if self._beats is None:
            pulls = runtime._can_pull_from(hello)
            self._beats = runtime.spawn_task(runtime._send_heartbeats(self.queue, hello, pulls))
        return True

    def close(self) -> None:
        self.runtime._held.discard(self)
        if self._beats is not None:
            self._beats.cancel()
        self.runtime.beats.remove(self.queue)
        self.runtime._inbound.get(self.sender, {}).pop(self.conn, None)
        self.rings.clear()  # unmapped once no frame of this connection is being read
        self._drained.set()
        if not self.ended.done():
            self.ended.cancel()


async def send_back(queue: FrameQueue, frame: bytes) -> None:
    """Send on a connection a peer opened to us: its heartbeats go from another thread
    (see ``_beats``), so every frame we send on it is queued thread-safely."""
    try:
        if not queue.send_threadsafe([frame]):
            await queue.flush()
    except TransportError:
        pass  # the connection is gone; its reader reports that
