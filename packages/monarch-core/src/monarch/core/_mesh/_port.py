"""Ports and channels: typed mailboxes that any actor (or the client) can send to.

``Channel.open()`` makes a port bound to the calling process's runtime and a
receiver for it. A Port is a small picklable handle (proc address + port number):
pass it in a message and whoever holds it can ``send`` from anywhere. Values from
one sender arrive in send order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from monarch.core._errors import RemoteFailure
from monarch.core._payload._serialize import dumps, loads
from monarch.core._runtime import CONSUMER_TURN, MESSAGE_COST, Flow, Runtime, current_runtime
from monarch.core._runtime._messages import Body, PortRef, PortValue
from monarch.core._runtime._scope import message_rank
from monarch.transport import Buffer

from ._future import Future, run_on

R = TypeVar("R")


class Port(Generic[R]):
    """Where values of type ``R`` can be sent; picklable."""

    def __init__(
        self, ref: PortRef, rank: int | None = None, *, return_undeliverable: bool = True
    ) -> None:
        self._ref = ref
        self._rank = rank
        self.return_undeliverable = return_undeliverable

    def _sender_rank(self) -> int:
        if self._rank is not None:
            return self._rank
        return message_rank()

    def send(self, obj: R) -> None:
        """Send a value (never blocks; raises if ``obj`` cannot be pickled)."""
        current_runtime().send_to_port(self._ref, PortValue(self._sender_rank()), dumps(obj))

    def exception(self, exc: BaseException) -> None:
        """Make the receiver's ``recv`` (or the call answered here) raise ``exc`` itself, as
        upstream's; one that cannot be pickled arrives as an ActorError with its text."""
        try:
            payload = dumps(exc)
        except Exception:  # noqa: BLE001 - sent as text instead
            payload = dumps(RemoteFailure.of(exc, "a value sent to a port"))
        current_runtime().send_to_port(self._ref, PortValue(self._sender_rank(), True), payload)

    def __reduce__(self) -> Any:
        return (Port, (self._ref, self._rank), {"return_undeliverable": self.return_undeliverable})

    def __repr__(self) -> str:
        return f"<Port {self._ref.proc}#{self._ref.port}>"


_Item = tuple[int, bool, Sequence[Buffer], Flow | None, int]
"""A value as it came: the sender's rank, whether it is an error, its parts, the lane that
delivered it (held until it is taken) and the bytes it holds there."""


class _Inbox:
    """The receiving end, fed on the runtime loop.

    Values wait here as they came, undecoded: their consumer unpickles them, so a
    flood costs the loop no more than reading it. One that came on a lane holds it
    until consumed (see ``_runtime._flow``). A consumer on another thread (an async
    actor's loop) takes a value already here itself, under ``lock``: a flood costs it
    no round trip through the runtime loop per value.
    """

    def __init__(self, runtime: Runtime, once: bool) -> None:
        self.runtime = runtime
        self.once = once
        self.lock = threading.Lock()
        """Guards ``items`` and ``getting`` (the loop feeds, any thread takes)."""
        self.items: deque[_Item] = deque()
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.sources: set[Flow] = set()
        """The lanes that have fed this inbox."""
        self.getting = 0
        """``recv()`` calls waiting on the loop: a value taken at once must not overtake
        them."""
        self._streak: float | None = None
        """When the consumer began taking values at once, if the loop has not turned
        since (see ``receive``)."""
        self.ref = runtime.open_port(self.on_value, inbox=True)
        self.closed = False

    def on_value(self, body: Body, payload: Sequence[Buffer]) -> None:
        if not isinstance(body, PortValue) or self.closed:
            return
        flow = self.runtime.delivering
        size = 0
        if flow is not None:
            size = MESSAGE_COST + sum(memoryview(part).nbytes for part in payload)
            flow.hold(size)
            self.sources.add(flow)
        with self.lock:
            self.items.append((body.rank, body.error, payload, flow, size))
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        if self.once:
            self.closed = True
            self.runtime.close_port(self.ref)

    def _decode(self, item: _Item) -> tuple[int, Any]:
        """A value taken out, decoded; raises what was sent as an error."""
        rank, error, payload, flow, size = item
        if flow is not None:
            if self.runtime.on_loop():
                flow.release(size)
            else:
                self.runtime.call_soon(flow.release, size)
        value = loads(payload)  # a value that cannot be read raises in the receiver
        if error:
            raise value.to_error() if isinstance(value, RemoteFailure) else value
        return rank, value

    def receive(self, ranked: bool) -> Future[Any]:
        """The next value (with its sender's rank if ``ranked``), from any thread.

        One already here, taken on the loop's own thread with nothing asked before it,
        comes in a done future: no task, no turn of the loop (a consumer keeping up
        with a flood never waits for one), for ``CONSUMER_TURN`` at most; then the loop
        turns, so the consumer cannot keep it from everything else.
        """
        future: Future[Any] = Future._new()
        runtime = self.runtime
        item: _Item | None = None
        with self.lock:
            if self.items and not self.getting and self._in_turn():
                item = self.items.popleft()
            else:
                self.getting += 1
        if item is not None:
            self._decode_into(item, future, ranked)
        elif runtime.on_loop():
            self._start_get(future, ranked)
        else:
            runtime.call_soon(self._start_get, future, ranked)
        return future

    def _start_get(self, future: Future[Any], ranked: bool) -> None:
        self.runtime.spawn_task(self._get_into(future, ranked))

    async def _get_into(self, future: Future[Any], ranked: bool) -> None:
        try:
            if not self.items:
                await self._wait()
            self._take_into(future, ranked)
        except asyncio.CancelledError:
            if not future.done():
                future.set_exception(asyncio.CancelledError("the runtime stopped the operation"))
            raise
        finally:
            with self.lock:
                self.getting -= 1

    def _take_into(self, future: Future[Any], ranked: bool) -> None:
        with self.lock:
            item = self.items.popleft()
        self._decode_into(item, future, ranked)

    def _decode_into(self, item: _Item, future: Future[Any], ranked: bool) -> None:
        try:
            rank, value = self._decode(item)
        except Exception as exc:  # noqa: BLE001 - handed to the future
            future.set_exception(exc)
        else:
            future.set_result((rank, value) if ranked else value)

    def _in_turn(self) -> bool:
        """Whether the consumer may take a value at once: for ``CONSUMER_TURN`` after its
        loop last turned (a thread with no loop of its own holds none up: always)."""
        loop = asyncio._get_running_loop()
        if loop is None:
            return True
        now = time.perf_counter()
        if self._streak is None:
            self._streak = now
            loop.call_soon(self._turned)
            return True
        return now - self._streak < CONSUMER_TURN

    def _turned(self) -> None:
        self._streak = None

    async def _wait(self) -> None:
        sources = tuple(self.sources)
        self.runtime.receiver_waiting(sources, True)
        try:
            while not self.items:
                waiter = self.runtime.loop.create_future()
                self.waiters.append(waiter)
                try:
                    await waiter
                except BaseException:
                    if waiter.done() and not waiter.cancelled():
                        self._pass_on()  # woken, but gone: the next one takes it
                    raise
        finally:
            self.runtime.receiver_waiting(sources, False)

    def _pass_on(self) -> None:
        if self.items:
            while self.waiters:
                waiter = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return


class PortReceiver(Generic[R]):
    """Receives what is sent to its port, in order per sender."""

    def __init__(self, inbox: _Inbox) -> None:
        self._inbox = inbox

    def recv(self) -> Future[R]:
        return self._inbox.receive(ranked=False)

    def ranked(self) -> RankedPortReceiver[R]:
        return RankedPortReceiver(self._inbox)


class RankedPortReceiver(Generic[R]):
    """Like PortReceiver, but yields ``(sender_rank, value)``."""

    def __init__(self, inbox: _Inbox) -> None:
        self._inbox = inbox

    def recv(self) -> Future[tuple[int, R]]:
        return self._inbox.receive(ranked=True)


class Channel(Generic[R]):
    """Factory of (port, receiver) pairs bound to the calling actor or client."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        inbox = _open_inbox(once)
        return Port(inbox.ref), PortReceiver(inbox)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], RankedPortReceiver[R]]:
        inbox = _open_inbox(once)
        return Port(inbox.ref), RankedPortReceiver(inbox)


def _open_inbox(once: bool) -> _Inbox:
    runtime = current_runtime()
    if runtime.on_loop():
        return _Inbox(runtime, once)

    async def make() -> _Inbox:
        return _Inbox(runtime, once)

    return run_on(runtime, make())._wait()  # a moment of the loop: no user-facing get()
