"""Operations on buffers and how they run: one plane chosen per handle.

- the owner's own process: a memmove;
- else the first of monarch-core's bulk-data planes (``monarch.core.lowlevel.bulk_planes``)
  that reaches the owner, chosen on the handle's first operation: the core's ``memory``
  plane (another process of this host that we may read: read straight from it), this
  wheel's ``pull`` (there, a write: the owner pulls it from us), then its ``ibverbs`` and
  ``tcp`` (``_planes``).

A small read this process copies itself runs on the calling thread; every other operation
on the core's bulk-data executor. What needs the owner (a write of this
host it pulls, a drop, an atomic, a verbs connection) asks its ``rdma`` service
(``_service``). A batch (``RDMAAction``) runs its operations side by
side and its Future ends when the last one has (so no transfer still writes into memory
the caller was told it may reuse), with the first error.
"""

from __future__ import annotations

import ctypes
import operator
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from monarch.core import Future, PullError
from monarch.core.lowlevel import LoanDropped, LoanLost, Plane, bulk_planes

from ._errors import RDMABufferDropped, RDMAError, RDMAOwnerDied, RDMATransferError
from ._handle import Handle
from ._messages import U64, Atomic, Copied, Drop, Old, Stage
from ._overlap import Access
from ._process import local_process
from ._region import Region, region_of
from ._registry import registry
from ._service import ATOMIC_SIZE, INLINE_MAX, ask_owner, registered, serve_atomic, writable
from ._staging import bounce, is_gpu_tensor, staging


@dataclass(frozen=True, slots=True)
class Op:
    kind: str
    """``read``, ``write``, ``fetch_add`` or ``compare_and_swap``."""
    handle: Handle
    local: Region
    size: int
    args: tuple[int, ...] = ()
    land: Callable[[], None] | None = None
    """After a read into a GPU tensor: copies the host bytes read to it (``_staging``)."""

    def accesses(self) -> tuple[Access, Access]:
        """(local, remote) memory this operation touches (see ``_overlap``)."""
        local_end = self.local.address + self.size
        remote_end = self.handle.address + self.size
        here = registry.token
        if self.kind == "read":
            return (
                Access(here, self.local.address, local_end, True),
                Access(self.handle.token, self.handle.address, remote_end, False),
            )
        return (
            Access(here, self.local.address, local_end, self.kind != "write"),
            Access(self.handle.token, self.handle.address, remote_end, True),
        )


def validate_timeout(timeout: int) -> int:
    """Upstream's check: a whole number of seconds that fits an unsigned 64-bit integer."""
    value = operator.index(timeout)
    if value < 0 or value > U64:
        raise OverflowError("timeout must fit in an unsigned 64-bit integer")
    return value


def plane(handle: Handle) -> str:
    """Which plane moves this handle's bytes from here: ``local`` (the owner is us),
    else the name of the bulk-data plane chosen for it (``memory``, ``ibverbs``, ``tcp``)."""
    if handle.token == registry.token:
        return "local"
    return bulk_planes().choose(handle).name


def _chosen(handle: Handle) -> Plane | None:
    """The plane chosen for ``handle`` (once per handle); None when the owner is us."""
    if handle.token == registry.token:
        return None
    return bulk_planes().choose(handle)


def _rdma_error(handle: Handle, error: PullError) -> RDMAError:
    """A memory plane's error in monarch.rdma's words (as they were before the planes)."""
    if isinstance(error, LoanLost):
        return RDMAOwnerDied(f"the owner of the buffer ({handle.owner}) is gone")
    if isinstance(error, LoanDropped):
        return RDMABufferDropped(f"the buffer of {handle.owner} was dropped")
    return RDMATransferError(f"reading the buffer of {handle.owner} failed: {error}")


def _stage(handle: Handle, way: Literal["out", "in"], size: int, deadline: float) -> None:
    """A GPU buffer's copy to (``out``) or from (``in``) its host copies, by its owner."""
    if handle.token == registry.token:
        staging.stage(handle.buffer_id, way, size)
    elif not isinstance(ask_owner(handle, Stage(handle.buffer_id, way, size), deadline), Copied):
        raise RDMATransferError(f"the owner of {handle.owner} did not stage the buffer")


def _read(op: Op, deadline: float) -> None:
    handle = op.handle
    if handle.inbox is not None:
        _stage(handle, "out", handle.size, deadline)
    way = _chosen(handle)
    if way is None:
        ctypes.memmove(op.local.address, registered(handle.buffer_id).address, handle.size)
    else:
        try:
            way.read(handle, op.local.address, deadline)
        except PullError as error:
            raise _rdma_error(handle, error) from None
    if op.land is not None:
        op.land()


def _write(op: Op, deadline: float) -> None:
    handle = op.handle
    target = handle.inbox or handle
    if _chosen(target) is None:
        ctypes.memmove(writable(target.buffer_id, op.size).address, op.local.address, op.size)
    else:
        try:
            bulk_planes().write(target, op.local.address, op.size, deadline)
        except PullError as error:
            raise _rdma_error(target, error) from None
    if handle.inbox is not None:
        _stage(handle, "in", op.size, deadline)


def _atomic(op: Op, deadline: float) -> None:
    handle = op.handle
    first, second = (*op.args, 0, 0)[:2]
    if handle.token == registry.token:
        old = serve_atomic(handle.buffer_id, op.kind, first, second)
    else:
        kind: Literal["fetch_add", "compare_and_swap"] = (
            "fetch_add" if op.kind == "fetch_add" else "compare_and_swap"
        )
        answer = ask_owner(handle, Atomic(handle.buffer_id, kind, first, second), deadline)
        if not isinstance(answer, Old):
            raise RDMATransferError(f"the owner answered an atomic with {answer!r}")
        old = answer.value
    ctypes.c_uint64.from_address(op.local.address).value = old


def drop(handle: Handle, deadline: float) -> None:
    """Unregister the buffer at its owner; done if the owner is gone (its memory is)."""
    bulk_planes().forget(handle)  # its plane is not needed again
    if handle.inbox is not None:
        bulk_planes().forget(handle.inbox)
    if handle.token == registry.token:
        registry.drop(handle.buffer_id, deadline)
        return
    try:
        ask_owner(handle, Drop(handle.buffer_id), deadline)
    except RDMAOwnerDied:
        pass


def _released(buffer_id: int) -> None:
    bulk_planes().release(buffer_id)


_RUN = {"read": _read, "write": _write, "fetch_add": _atomic, "compare_and_swap": _atomic}
registry.on_drop.append(_released)


def _copies_here(op: Op) -> bool:
    """Whether this thread copies the bytes itself (no owner, no socket involved)."""
    if op.handle.inbox is not None and op.handle.token != registry.token:
        return False  # a GPU buffer's owner stages it
    way = _chosen(op.handle)
    if way is None:
        return True
    if op.kind == "read":
        return way.reads_alone
    return op.kind == "write" and way.writes_alone(op.handle)


def _inline(op: Op) -> bool:
    return op.size <= INLINE_MAX and _copies_here(op)


def _settle(future: Future[None], errors: list[BaseException]) -> None:
    if errors:
        future.set_exception(errors[0])
    else:
        future.set_result(None)


def submit(ops: Sequence[Op], timeout: int) -> Future[None]:
    """Run ``ops`` side by side on RDMA threads; the Future ends when all have."""
    deadline = time.monotonic() + validate_timeout(timeout)
    batch = tuple(ops)
    future: Future[None] = Future._new()
    if len(batch) <= 1 and all(map(_inline, batch)):
        errors: list[BaseException] = []
        for op in batch:
            try:
                _RUN[op.kind](op, deadline)
            except Exception as error:  # noqa: BLE001 - handed to the future
                errors.append(error)
        _settle(future, errors)
        return future
    # Copies this process makes itself run one after another in one task: each large one
    # already uses the CPUs it can (``read_process_memory`` splits it among threads), so
    # side by side they would only contend. Those that wait on a peer run side by side.
    here = [op for op in batch if _copies_here(op)]
    tasks = [[op] for op in batch if not _copies_here(op)] + ([here] if here else [])
    proc = local_process()
    left = [len(tasks)]
    failed: list[BaseException] = []
    lock = threading.Lock()

    def run(ops: list[Op]) -> None:
        for op in ops:
            try:
                _RUN[op.kind](op, deadline)
            except BaseException as error:  # noqa: BLE001 - handed to the future
                with lock:
                    failed.append(error)
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            _settle(future, failed)

    for task in tasks:
        proc.threads.submit(run, task)
    return future


def submit_call(run: Callable[[float], None], timeout: int) -> Future[None]:
    """A Future of ``run(deadline)`` on an RDMA thread (a drop)."""
    deadline = time.monotonic() + validate_timeout(timeout)
    future: Future[None] = Future._new()

    def body() -> None:
        try:
            run(deadline)
        except BaseException as error:  # noqa: BLE001 - handed to the future
            future.set_exception(error)
        else:
            future.set_result(None)

    local_process().threads.submit(body)
    return future


def read_op(dst: object, handle: Handle) -> Op:
    """A read of the whole buffer into the start of ``dst``; ValueError if it cannot be."""
    local, land = (
        bounce(dst, "dst", fill=False) if is_gpu_tensor(dst) else (region_of(dst, "dst"), None)
    )
    if not local.writable:
        raise ValueError("dst is read-only: it cannot be read into")
    if local.size < handle.size:
        raise ValueError(
            f"dst ({local.size} bytes) is smaller than the RDMA buffer ({handle.size} bytes)"
        )
    return Op("read", handle, local, handle.size, land=land)


def write_op(handle: Handle, src: object) -> Op:
    """A write of all of ``src`` to the start of the buffer; ValueError if it cannot be."""
    local = bounce(src, "src", fill=True)[0] if is_gpu_tensor(src) else region_of(src, "src")
    if local.size > handle.size:
        raise ValueError(
            f"src ({local.size} bytes) is larger than the RDMA buffer ({handle.size} bytes)"
        )
    if not handle.writable:
        raise ValueError("the RDMA buffer is read-only: it cannot be written")
    return Op("write", handle, local, local.size)


def atomic_op(kind: str, handle: Handle, dst: object, args: tuple[int, ...]) -> Op:
    """fetch_add/compare_and_swap on the buffer's first 8 bytes, the old value to ``dst``."""
    local = region_of(dst, "dst")
    if not local.writable or local.size < ATOMIC_SIZE:
        raise ValueError(f"dst must be writable and hold at least {ATOMIC_SIZE} bytes")
    if handle.size < ATOMIC_SIZE or not handle.writable:
        raise ValueError(f"{kind} needs a writable RDMA buffer of at least {ATOMIC_SIZE} bytes")
    values = tuple(operator.index(a) & U64 for a in args)
    return Op(kind, handle, local, ATOMIC_SIZE, values)
