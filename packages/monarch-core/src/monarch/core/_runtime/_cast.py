"""Casting: one message per subtree, forwarded down a tree; FIFO restored by sequence numbers.

A cast to N procs is not N messages from the caster. The targets, in cast order, are
split into ``max_cast_fanout`` contiguous chunks; the caster sends one message to the
head of each chunk, carrying the rest of the chunk, and every head relays the same
way, reusing the received payload parts. The caster's cost grows with the fan-out,
not with the number of actors.

Different casts reach a proc along different paths, so each Call carries, per target
proc, a sequence number counted by the caster for that (mesh, proc); the receiving proc
hands messages from each origin to the mesh's actors in sequence order, holding early
ones back.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import msgspec

from monarch.transport import Buffer

from ._messages import TO_ACTOR, Call

log = logging.getLogger("monarch.core")

UNORDERED: Final = 0


def split(targets: Sequence[str], fanout: int) -> list[Sequence[str]]:
    """``targets`` in at most ``fanout`` contiguous chunks of near-equal size."""
    count = len(targets)
    chunks = min(max(fanout, 1), count)
    out: list[Sequence[str]] = []
    start = 0
    for i in range(chunks):
        end = start + count // chunks + (1 if i < count % chunks else 0)
        out.append(targets[start:end])
        start = end
    return out


def fan_out(
    post: Callable[[str, int, str, Any, Sequence[Buffer]], None],
    targets: Sequence[str],
    dest: str,
    call: Call,
    payload: Sequence[Buffer],
    fanout: int,
) -> None:
    """Send ``call`` to ``targets`` through a tree: one message per chunk head.

    ``call.seqs`` (if any) runs parallel to ``targets``; each head gets its chunk's.
    """
    seqs = call.seqs
    start = 0
    for chunk in split(targets, fanout):
        end = start + len(chunk)
        below = tuple(chunk[1:])
        head_seqs = seqs[start:end] if seqs else ()
        if below == call.forward and head_seqs == seqs:
            head_call = call
        else:
            head_call = msgspec.structs.replace(call, forward=below, seqs=head_seqs)
        post(chunk[0], TO_ACTOR, dest, head_call, payload)
        start = end


class SendOrder:
    """The caster's side: the next sequence number per (mesh, destination proc).

    Callers' threads cast too (see ``ActorMesh._cast_here``): each number comes from an
    ``itertools.count``, whose ``next`` is atomic, so no lock is needed. Casts made at the
    same time by two threads may interleave differently at different procs, as they may
    arrive differently anyway; each proc still sees each thread's casts in order.
    """

    def __init__(self) -> None:
        self._next: dict[str, dict[str, Iterator[int]]] = {}

    def take(self, mesh: str, targets: Sequence[str]) -> tuple[int, ...]:
        counters = self._next.get(mesh)
        if counters is None:
            counters = self._next.setdefault(mesh, {})
        if len(targets) == 1:
            counter = counters.get(targets[0])
            if counter is None:
                counter = counters.setdefault(targets[0], itertools.count(1))
            return (next(counter),)
        return tuple(
            next(counters.get(target) or counters.setdefault(target, itertools.count(1)))
            for target in targets
        )


class ReceiveOrder:
    """The receiver's side: hands messages on in sequence order per origin.

    A message whose predecessor has not arrived waits. If the gap is still open after
    ``gap_timeout()`` seconds (its relay died), the waiting messages go on with a warning
    rather than never.
    """

    def __init__(
        self,
        deliver: Callable[[Any], None],
        call_later: Callable[..., Any],
        gap_timeout: Callable[[], float],
    ) -> None:
        self._deliver = deliver
        self._call_later = call_later
        self._gap_timeout = gap_timeout
        self._expected: dict[str, int] = {}
        self._held: dict[str, dict[int, Any]] = {}

    def is_next(self, origin: str, seq: int) -> bool:
        """Whether ``seq`` is the number expected from ``origin`` with none waiting: if so
        it is taken as delivered, and the caller hands the message on now."""
        expected = self._expected.get(origin, 1)  # never UNORDERED (0)
        if seq != expected or origin in self._held:
            return False
        self._expected[origin] = seq + 1
        return True

    def accept(self, origin: str, seq: int, item: Any) -> None:
        if seq == UNORDERED or self.is_next(origin, seq):
            self._deliver(item)
            return
        expected = self._expected.get(origin, 1)
        if seq < expected:
            log.warning("duplicate message %d from %s dropped", seq, origin)
            return
        if seq > expected:
            held = self._held.setdefault(origin, {})
            if not held:
                self._call_later(self._gap_timeout(), self._give_up, origin, expected)
            held[seq] = item
            return
        self._deliver(item)
        self._advance(origin, seq + 1)

    def _advance(self, origin: str, expected: int) -> None:
        held = self._held.get(origin)
        while held and expected in held:
            self._deliver(held.pop(expected))
            expected += 1
        self._expected[origin] = expected
        if not held:
            self._held.pop(origin, None)
        else:  # another gap: give it the same time to fill
            self._call_later(self._gap_timeout(), self._give_up, origin, expected)

    def _give_up(self, origin: str, missing: int) -> None:
        held = self._held.get(origin)
        if not held or self._expected.get(origin, 1) != missing:
            return
        resume = min(held)
        log.warning(
            "messages %d..%d from %s never arrived; going on without them",
            missing,
            resume - 1,
            origin,
        )
        self._advance(origin, resume)
