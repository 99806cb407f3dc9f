"""Which operations of an ``RDMAAction`` would race: the batch's check before it runs.

The operations of a batch run at once, in no order, so two of them that touch the same
bytes, one of them writing, give a result that depends on timing. Memory is named by the
process that holds it (its token) and an address there, so a buffer owned by this process
and a local tensor over the same bytes are seen as the same memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Access:
    space: int
    """The token of the process whose memory this is."""
    start: int
    end: int
    writes: bool

    def conflicts(self, other: Access) -> bool:
        return (
            self.space == other.space
            and self.start < self.end  # an empty range touches nothing
            and other.start < other.end
            and self.start < other.end
            and other.start < self.end
            and (self.writes or other.writes)
        )


def first_race(ops: Sequence[Sequence[Access]]) -> tuple[int, int] | None:
    """The first pair ``(i, j)``, ``i < j``, of operations that race, or None."""
    for j in range(len(ops)):
        for i in range(j):
            if any(a.conflicts(b) for a in ops[i] for b in ops[j]):
                return i, j
    return None
