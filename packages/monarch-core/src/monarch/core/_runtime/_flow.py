"""Flow control of what peers send: fair turns for the reader, backpressure for senders.

A receiver that reads and decodes everything its peers send before anything else runs
starves its own consumers under a flood, and its memory grows as fast as the senders
send. So:

- **Turns.** A connection delivers at most ``TURN_MESSAGES`` messages (``TURN_BYTES``)
  per loop turn, then stops reading until its next turn: the loop runs what waits (the
  endpoint awaiting a ``recv()``), and other connections get theirs.
- **Lanes.** Values for a port opened with ``Channel`` (an *inbox*: whoever consumes it
  may be slower than its senders) go to a peer on a connection of their own, its *lane*;
  everything else (calls, replies, control, supervision) on the main one, never held up
  by a full inbox. A lane that has delivered more than ``HIGH_WATER`` bytes its inboxes
  have not consumed is not read until they are down to ``LOW_WATER``: its frames wait in
  the kernel's buffers, undecoded, and then in the sender's.
- **Senders slow down, while their receiver consumes.** A thread whose lane to a peer
  holds more than ``SEND_HIGH`` bytes (queued, unwritten or lent) waits until it is below
  ``SEND_LOW``, ``STALL`` seconds at most per message. It waits only while the peer shows
  progress: the lane is written to, or, while held, its inboxes consume (the receiver
  says so on the lane, ``NOTICE_EVERY``). A receiver that has consumed nothing for
  ``PATIENCE`` may itself be waiting for this sender (two actors that each send all,
  then receive all): its senders then buffer, as they would with no flow control,
  rather than deadlock.
- **A sender on an async actor's loop is suspended, not blocked.** Each async actor runs
  on an event loop of its own, on its own thread, where its consumers run too: blocking
  that thread for the peer would stop the very task the peer may wait for (two actors
  flooding each other). There ``throttle`` only notes what the thread owes (``owed``); the
  sending task waits for the room at its next ``await`` (``suspend_owed``), while the
  actor's other tasks run.
- **A waiting receiver is never starved by a held lane.** While some ``recv()`` waits
  on an empty inbox, its message may be behind a lane held for another inbox: held
  lanes are read on, up to ``HARD_LIMIT`` each (the bound on a receiver's memory), the
  ones that have fed that inbox before or, for one never fed, all of them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final

TURN_MESSAGES: Final = 256
"""Messages one connection delivers per loop turn (a full ``Batch`` frame is one turn)."""
TURN_BYTES: Final = 1024 * 1024
"""Bytes one connection delivers per loop turn."""
HIGH_WATER: Final = 4 * 1024 * 1024
"""Bytes a lane may have delivered unconsumed before it is held (not read), once it
has delivered two messages (large ones still stream, one consumed while one is read)."""
LOW_WATER: Final = 1024 * 1024
"""A held lane is read again once its unconsumed bytes are down to this."""
HARD_LIMIT: Final = 64 * 1024 * 1024
"""Unconsumed bytes past which a lane is held even for a waiting receiver."""
MESSAGE_COST: Final = 512
"""Bytes counted per message beyond its payload: the objects that hold it."""
SEND_HIGH: Final = 8 * 1024 * 1024
"""Bytes queued or lent to a peer's lane past which a sending thread waits."""
SEND_LOW: Final = 2 * 1024 * 1024
"""What a waiting sender waits for the lane's backlog to come down to."""
STALL: Final = 0.05
"""The longest a sender waits per message (seconds)."""
PATIENCE: Final = 5.0
"""Seconds without progress from a peer after which its senders stop waiting for it."""
NOTICE_EVERY: Final = 0.1
"""Seconds between a held lane's notices that its inboxes consume."""
CONSUMER_TURN: Final = 0.002
"""Seconds a consumer on the loop may take values already there without the loop turning:
``recv()`` then completes at once, later it waits for the next turn (the loop is shared)."""


class Flow:
    """What one lane has delivered to inboxes and they have not consumed yet (bytes).

    ``hold`` when a value is queued in an inbox, ``release`` when it is taken out (on
    the loop). Once ``over`` the high-water mark, the lane's reader stops reading
    (``held_up``); ``resume`` is called once it is down to the low-water mark.
    """

    __slots__ = ("count", "held", "held_up", "noticed", "notify", "resume", "wanted")

    def __init__(self, resume: Callable[[], None], notify: Callable[[], None]) -> None:
        self.held = 0
        self.count = 0
        """Messages delivered and not consumed yet."""
        self.held_up = False
        """The lane is not being read (set by its reader, cleared by ``resume``)."""
        self.resume = resume
        self.notify = notify
        """Tells the sender that its held lane's inboxes consume (it may keep waiting)."""
        self.noticed = 0.0
        self.wanted = 0
        """Receivers waiting on an empty inbox this lane has fed before."""

    def hold(self, size: int) -> None:
        self.held += size
        self.count += 1

    def release(self, size: int) -> None:
        self.held -= size
        self.count -= 1
        if self.held_up:
            if self.held <= LOW_WATER or self.count <= 1:
                self.held_up = False
                self.resume()
            else:
                now = time.monotonic()
                if now - self.noticed >= NOTICE_EVERY:
                    self.noticed = now
                    self.notify()

    def over(self, wanted: bool) -> bool:
        """Whether the lane must be held now (``wanted``: a receiver may wait on it)."""
        return self.held > (HARD_LIMIT if wanted else HIGH_WATER) and self.count > 1


class Room:
    """A lane's "the backlog is low again": waited for by a thread (``wait``) or by a task
    on an actor's loop (``wait_async``: only that task waits). Set from any thread."""

    __slots__ = ("_event", "_lock", "_waiters")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        self._event.clear()

    def set(self) -> None:
        self._event.set()
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop is closed: its actor is gone
                pass

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def wait_async(self, timeout: float) -> asyncio.Future[None]:
        """A future of the running loop, done when the room is set or ``timeout`` passed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        with self._lock:
            if self._event.is_set():
                future.set_result(None)
                return future
            self._waiters.append(entry)

        def expire() -> None:
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)
            _resolve(future)

        handle = loop.call_later(timeout, expire)
        future.add_done_callback(lambda _: handle.cancel())
        return future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Owed(threading.local):
    suspends = False
    """This thread runs an async actor's loop: its senders are suspended, not blocked."""
    owed: Room | None = None
    """The room the task running now must wait for at its next ``await``."""


owed = _Owed()


def owe(room: Room) -> None:
    """Called by a sender on an actor's loop instead of waiting (see ``suspend_owed``)."""
    owed.owed = room


class _Passed:
    """What the wrapped coroutine gave up the loop for (a future, or None for a bare
    yield), given up in turn: the task's answer comes back as the ``await``'s value."""

    __slots__ = ("waits_on",)

    def __init__(self, waits_on: Any) -> None:
        self.waits_on = waits_on

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self.waits_on)


async def suspend_owed(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` as it is, except that at each point where it gives up the loop, the
    room its sends owe (``owe``) is waited for first, ``STALL`` seconds at most: what an
    actor loop's task factory wraps every task's coroutine in. (A native coroutine: from
    Python 3.12 a task refuses a generator-based one.)"""
    send, throw = coro.send, coro.throw
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            if error is None:
                waits_on = send(value)
            else:
                waits_on = throw(error)
                error = None
        except StopIteration as stop:
            return stop.value
        room = owed.owed
        if room is not None:
            owed.owed = None
            try:
                await room.wait_async(STALL)
            except BaseException as exc:  # noqa: BLE001 - cancelled while it waits for the room
                if isinstance(waits_on, asyncio.Future):
                    waits_on.cancel()
                error, value = exc, None
                continue
        try:
            value = await _Passed(waits_on)
        except BaseException as exc:  # noqa: BLE001 - the task's cancellation, passed on
            error, value = exc, None


def _suspending_task(
    loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
) -> asyncio.Task[Any]:
    return asyncio.Task(suspend_owed(coro), loop=loop, **kwargs)


def suspend_senders(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop``, which this thread runs (an async actor's), suspend a task whose sends
    outrun their peer rather than block the thread (see the module)."""
    owed.suspends = True
    loop.set_task_factory(_suspending_task)
