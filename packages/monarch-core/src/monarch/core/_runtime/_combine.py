"""Replies gathered on their way up: one message per subtree of the cast tree.

A gathered call's replies do not all travel to the caller. A relay of the cast tree
(see ``_cast``) opens a ``Combine`` for its own actors' reply and one per subtree it
relays to, and sends one ``PortBatch`` up when all have answered; a proc hosting several
of the targets does the same for its actors. The caller then reads one message per
subtree it cast to: its cost grows with the fan-out, not with the number of procs.

Identical small values are kept once (a mesh answering ``"pong"`` sends one pickle up).
An error goes up at once (``fail_fast``): the caller fails the call on the first error it
reads, as it would with flat replies. A subtree whose head this relay sees fail is named
in the batch's ``lost``, with what it says: the caller reports it in its own words, as if
it had seen that proc fail itself (see ``Gather``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from monarch.transport import Buffer

from ._messages import Body, PortBatch, PortRef, PortValue


class Ports(Protocol):
    """What a ``Combine`` needs of the runtime (``_router``'s ``Runtime``, above this
    module): a port of its own, watches of the subtrees' heads, and a send up."""

    def open_port(
        self, handler: Callable[[Body, Sequence[Buffer]], None], inbox: bool = False
    ) -> PortRef: ...

    def close_port(self, port: PortRef) -> None: ...

    def watch_peer(self, address: str, watcher: Callable[[str, BaseException], None]) -> int: ...

    def unwatch_peer(self, address: str, key: int) -> None: ...

    def send_to_port(
        self,
        port: PortRef,
        body: Body,
        payload: Sequence[Buffer] = (),
        batch: list[Any] | None = None,
    ) -> None: ...


SAME_MAX: Final = 1024
"""Values whose one pickle is at most this many bytes are compared, and kept once."""


class Combine:
    """Collects ``count`` messages (``PortValue`` or ``PortBatch``) on a port of this proc
    and sends them on to ``reply`` as one ``PortBatch``. Loop thread only; one slotted
    object per call in flight at this proc."""

    __slots__ = ("fail_fast", "groups", "left", "lost", "port", "reply", "runtime", "watches")

    def __init__(
        self,
        runtime: Ports,
        reply: PortRef,
        count: int,
        *,
        fail_fast: bool,
        watch: Sequence[str] = (),
    ) -> None:
        self.runtime = runtime
        self.reply = reply
        self.left = count
        self.fail_fast = fail_fast
        self.groups: dict[Any, tuple[list[int], bool, Sequence[Buffer]]] = {}
        self.lost: list[tuple[str, str]] = []
        self.port = runtime.open_port(self)
        self.watches: list[tuple[str, int]] = []
        for address in watch:  # the heads of the subtrees below: on the loop, none fires now
            self.watches.append((address, runtime.watch_peer(address, self._lost)))

    def __call__(self, body: Body, payload: Sequence[Buffer]) -> None:
        if self.left <= 0:
            return
        error = False
        if isinstance(body, PortValue):
            self._add((body.rank,), body.error, payload)
            error = body.error
        elif isinstance(body, PortBatch):
            at = 0
            for ranks, failed, count in body.groups:
                self._add(ranks, failed, payload[at : at + count])
                at += count
                error = error or failed
            self.lost.extend(body.lost)
        else:
            return
        self.left -= 1
        if self.left == 0 or (self.fail_fast and (error or self.lost)):
            self._send()

    def _add(self, ranks: Sequence[int], error: bool, payload: Sequence[Buffer]) -> None:
        key: Any
        if len(payload) == 1 and len(payload[0]) <= SAME_MAX:
            key = (error, bytes(payload[0]))
        else:
            key = object()
        group = self.groups.get(key)
        if group is None:
            self.groups[key] = (list(ranks), error, payload)
        else:
            group[0].extend(ranks)

    def _lost(self, address: str, exc: BaseException) -> None:
        """A subtree's head failed: what its subtree would send will not come."""
        if self.left <= 0:
            return
        self.lost.append((address, str(exc)))
        self._send()

    def _send(self) -> None:
        self.left = 0
        runtime = self.runtime
        runtime.close_port(self.port)
        for address, key in self.watches:
            runtime.unwatch_peer(address, key)
        groups = self.groups.values()
        batch = PortBatch(
            tuple((tuple(ranks), error, len(parts)) for ranks, error, parts in groups),
            tuple(self.lost),
        )
        runtime.send_to_port(self.reply, batch, [part for _, _, parts in groups for part in parts])
