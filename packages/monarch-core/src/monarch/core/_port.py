"""Ports and channels: typed mailboxes that any actor (or the client) can send to.

``Channel.open()`` makes a port bound to the calling process's runtime and a
receiver for it. A Port is a small picklable handle (proc address + port number):
pass it in a message and whoever holds it can ``send`` from anywhere. Values from
one sender arrive in send order.
"""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

from ._errors import RemoteFailure
from ._future import Future, run_on
from ._messages import Body, PortRef, PortValue
from ._runtime import Runtime, current_runtime
from ._scope import message_rank
from ._serialize import dumps, loads

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


class _Inbox:
    """The receiving end, living on the runtime loop."""

    def __init__(self, runtime: Runtime, once: bool) -> None:
        self.runtime = runtime
        self.once = once
        self.queue: asyncio.Queue[tuple[int, bool, Any]] = asyncio.Queue()
        self.ref = runtime.open_port(self.on_value)
        self.closed = False

    def on_value(self, body: Body, payload: Any) -> None:
        if not isinstance(body, PortValue) or self.closed:
            return
        try:
            value = loads(payload)
        except Exception as exc:  # noqa: BLE001 - the receiver sees why it cannot read it
            self.queue.put_nowait((body.rank, True, exc))
        else:
            if body.error and isinstance(value, RemoteFailure):
                value = value.to_error()
            self.queue.put_nowait((body.rank, body.error, value))
        if self.once:
            self.closed = True
            self.runtime.close_port(self.ref)

    async def get(self) -> tuple[int, Any]:
        rank, error, value = await self.queue.get()
        if error:
            raise value
        return rank, value


class PortReceiver(Generic[R]):
    """Receives what is sent to its port, in order per sender."""

    def __init__(self, inbox: _Inbox) -> None:
        self._inbox = inbox

    def recv(self) -> Future[R]:
        return run_on(self._inbox.runtime, self._recv())

    async def _recv(self) -> R:
        _, value = await self._inbox.get()
        return value  # type: ignore[no-any-return]

    def ranked(self) -> RankedPortReceiver[R]:
        return RankedPortReceiver(self._inbox)


class RankedPortReceiver(Generic[R]):
    """Like PortReceiver, but yields ``(sender_rank, value)``."""

    def __init__(self, inbox: _Inbox) -> None:
        self._inbox = inbox

    def recv(self) -> Future[tuple[int, R]]:
        return run_on(self._inbox.runtime, self._inbox.get())


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

    return run_on(runtime, make()).get()
