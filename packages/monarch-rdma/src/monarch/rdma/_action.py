"""``RDMAAction``: a batch of reads, writes and atomics that run side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch.core import Future

from . import _transfer as transfer
from ._buffer import RDMABuffer
from ._handle import Handle
from ._overlap import first_race

if TYPE_CHECKING:
    from ._buffer import LocalMemory


def _handle(buffer: object, what: str) -> Handle:
    if not isinstance(buffer, RDMABuffer):
        raise TypeError(f"{what} must be an RDMABuffer, not {type(buffer).__name__}")
    return buffer._handle


_NAMES = {
    "read": "read_remote",
    "write": "write_remote",
    "fetch_add": "fetch_add",
    "compare_and_swap": "compare_and_swap",
}


class RDMAAction:
    """Operations queued with ``read_remote``/``write_remote``/``fetch_add``/
    ``compare_and_swap`` and run together by ``submit``.

    They run in no particular order, so two that touch the same bytes, one of them
    writing (two reads into one tensor, a write of a buffer another reads), would give a
    result that depends on timing: such an operation is refused (ValueError) when added.
    """

    def __init__(self) -> None:
        self._ops: list[transfer.Op] = []

    def _add(self, op: transfer.Op) -> RDMAAction:
        race = first_race([o.accesses() for o in self._ops] + [op.accesses()])
        if race is not None:
            other = self._ops[race[0]]
            raise ValueError(
                f"{_NAMES[op.kind]} races with operation {race[0]} of the batch "
                f"({_NAMES[other.kind]}): they touch the same memory and one writes it"
            )
        self._ops.append(op)
        return self

    def read_remote(self, dst: LocalMemory, src: RDMABuffer) -> RDMAAction:
        """Queue a read of the whole buffer ``src`` into the start of ``dst``."""
        return self._add(transfer.read_op(dst, _handle(src, "src")))

    def write_remote(self, dst: RDMABuffer, src: LocalMemory) -> RDMAAction:
        """Queue a write of all of ``src`` to the start of the buffer ``dst``."""
        return self._add(transfer.write_op(_handle(dst, "dst"), src))

    def fetch_add(self, src: RDMABuffer, dst: LocalMemory, add: int) -> RDMAAction:
        """Queue an atomic add of ``add`` to the unsigned 64-bit integer at the start of
        ``src``; its old value goes to ``dst`` (8 bytes). Atomic with respect to other
        atomics on the buffer (as ibverbs' are), not to plain writes."""
        return self._add(transfer.atomic_op("fetch_add", _handle(src, "src"), dst, (add,)))

    def compare_and_swap(
        self, src: RDMABuffer, dst: LocalMemory, compare: int, swap: int
    ) -> RDMAAction:
        """Queue: if the unsigned 64-bit integer at the start of ``src`` equals
        ``compare``, make it ``swap``; its old value goes to ``dst`` (8 bytes)."""
        return self._add(
            transfer.atomic_op("compare_and_swap", _handle(src, "src"), dst, (compare, swap))
        )

    def submit(self, *, timeout: int = 60) -> Future[None]:
        """Run the queued operations (again, if called again); the Future ends when every
        one has, with the first error if any failed."""
        return transfer.submit(self._ops, timeout)
