"""Casting: one message per subtree, forwarded down a tree; FIFO restored by sequence numbers.

A cast to N procs is not N messages from the caster. The targets, in cast order, are
split into ``max_cast_fanout`` contiguous chunks; the caster sends one message to the
head of each chunk, carrying the rest of the chunk, and every head relays the same
way, reusing the received payload parts. The caster's cost grows with the fan-out,
not with the number of actors.

Different casts reach a proc along different paths, so each Call carries, per target,
a sequence number counted by the caster for that (mesh, rank); the receiving actor
processes messages from each origin in sequence order, holding early ones back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
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
    """Send ``call`` to ``targets`` through a tree: one message per chunk head."""
    for chunk in split(targets, fanout):
        below = tuple(chunk[1:])
        head_call = call if below == call.forward else msgspec.structs.replace(call, forward=below)
        post(chunk[0], TO_ACTOR, dest, head_call, payload)


class SendOrder:
    """The caster's side: the next sequence number per (mesh, rank)."""

    def __init__(self) -> None:
        self._next: dict[str, list[int]] = {}

    def take(self, mesh: str, ranks: Sequence[int], size: int) -> tuple[int, ...]:
        counters = self._next.get(mesh)
        if counters is None:
            counters = self._next[mesh] = [0] * size
        elif len(counters) < size:
            counters.extend([0] * (size - len(counters)))
        seqs = []
        for rank in ranks:
            counters[rank] += 1
            seqs.append(counters[rank])
        return tuple(seqs)


class ReceiveOrder:
    """The receiver's side: hands messages on in sequence order per origin.

    A message whose predecessor has not arrived waits. If the gap is still open after
    ``gap_timeout`` seconds (its relay died), the waiting messages go on with a warning
    rather than never.
    """

    def __init__(self, deliver: Callable[[Any], None], call_later: Callable[..., Any]) -> None:
        self._deliver = deliver
        self._call_later = call_later
        self._expected: dict[str, int] = {}
        self._held: dict[str, dict[int, Any]] = {}
        self._gap_timeout = 30.0

    def accept(self, origin: str, seq: int, item: Any, gap_timeout: float) -> None:
        if seq == UNORDERED:
            self._deliver(item)
            return
        self._gap_timeout = gap_timeout
        expected = self._expected.get(origin, 1)
        if seq < expected:
            log.warning("duplicate message %d from %s dropped", seq, origin)
            return
        if seq > expected:
            held = self._held.setdefault(origin, {})
            if not held:
                self._call_later(gap_timeout, self._give_up, origin, expected)
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
            self._call_later(self._gap_timeout, self._give_up, origin, expected)

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
