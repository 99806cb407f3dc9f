"""Operations on buffers and how they run: one plane chosen per pair of processes.

- the owner's own process: a memmove;
- another process of this host that we may read (``_shm``): read straight from it; a
  write is pulled by the owner from us;
- a process elsewhere, both with an ibverbs device (``_verbs``): RDMA READ/WRITE;
- anywhere else (``_tcp``): the owner's data server, in chunks over several streams.

A small read this process copies itself runs on the calling thread; every other operation
on an RDMA thread of this process. A batch (``RDMAAction``) runs its operations side by
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

from monarch.core import Future, current_config

from . import _shm as shm
from . import _tcp as tcp
from . import _verbs as verbs
from ._chunks import KIB, MIB, plan
from ._errors import (
    RDMABufferDropped,
    RDMAError,
    RDMAOwnerDied,
    RDMATimeoutError,
    RDMATransferError,
)
from ._handle import Handle
from ._overlap import Access
from ._process import Process, local_process
from ._region import Region, region_of
from ._registry import registry

ATOMIC_SIZE = 8
"""fetch_add and compare_and_swap act on the buffer's first 8 bytes (an unsigned 64-bit
integer, native byte order, as ibverbs' atomics), and write its old value to ``dst``."""
U64 = (1 << 64) - 1
INLINE_MAX = 4 * 1024 * 1024
"""A lone read from this process or another of this host, up to this size, is copied by
the calling thread itself: handing it to another thread and waking the caller again
costs more than the copy (each hop is a scheduling delay on a loaded machine)."""


@dataclass(frozen=True, slots=True)
class Op:
    kind: str
    """``read``, ``write``, ``fetch_add`` or ``compare_and_swap``."""
    handle: Handle
    local: Region
    size: int
    args: tuple[int, ...] = ()

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
    """Which plane moves this handle's bytes from here: ``local``, ``shm`` or ``tcp``."""
    if handle.token == registry.token:
        return "local"
    if shm.usable(handle):
        return "shm"
    if handle.rkey and verbs.device() is not None:
        return "ibverbs"
    return "tcp"


def _registered(buffer_id: int) -> Region:
    region = registry.get(buffer_id)
    if region is None:
        raise RDMABufferDropped("the buffer was dropped")
    return region


def _writable(buffer_id: int, size: int) -> Region:
    region = _registered(buffer_id)
    if not region.writable:
        raise RDMAError("the buffer is read-only: it cannot be written")
    if size > region.size:
        raise RDMAError(f"{size} bytes do not fit in a buffer of {region.size}")
    return region


def _over_tcp(
    proc: Process, handle: Handle, op: int, local: Region, size: int, deadline: float
) -> None:
    config = current_config()
    chunks = plan(
        size,
        proc.width,
        config.rdma_max_chunk_size_mb * MIB,
        config.rdma_min_stripe_size_kb * KIB,
    )
    streams = proc.streams(handle.tcp_host, handle.tcp_port)
    try:
        tcp.transfer(
            streams, op, handle.buffer_id, local, size, deadline, chunks, proc.helpers, proc.width
        )
    except RDMATransferError as error:
        if not isinstance(error, RDMAOwnerDied) and handle.proc in proc.runtime.failed_peers:
            raise RDMAOwnerDied(f"the buffer's owner ({handle.owner}) died") from error
        raise


def _over_verbs(handle: Handle, op: str, local: Region, size: int, deadline: float) -> None:
    nic = verbs.device()
    assert nic is not None
    proc = local_process()
    failed = proc.runtime.failed_peers

    def gone() -> bool:
        return handle.proc in failed

    if gone():
        raise RDMAOwnerDied(f"the buffer's owner ({handle.owner}) died")

    def ask(qpn: int, gid: str) -> tuple[int, str]:
        request = ("verbs_connect", registry.token, qpn, gid)
        answer: tuple[int, str] = proc.ask(handle.proc, handle.service, request, deadline)
        return answer

    conn = nic.connection(handle.token, ask)
    try:
        nic.transfer(conn, op, local, size, handle.address, handle.rkey, deadline, gone)
    except RDMATransferError as error:
        if handle.proc in proc.runtime.failed_peers:
            raise RDMAOwnerDied(f"the buffer's owner ({handle.owner}) died") from error
        raise


def _serve_connect(peer: int, qpn: int, gid: str) -> tuple[int, str]:
    """On the owner: a queue pair for a peer's (see ``_verbs``)."""
    nic = verbs.device()
    if nic is None:
        raise RDMATransferError("the owner has no ibverbs device")
    return nic.accept(peer, qpn, gid)


def _deregister(buffer_id: int) -> None:
    nic = verbs.device()
    if nic is not None:
        nic.deregister(buffer_id)


def _read(op: Op, deadline: float) -> None:
    handle = op.handle
    way = plane(handle)
    if way == "local":
        ctypes.memmove(op.local.address, _registered(handle.buffer_id).address, handle.size)
    elif way == "shm":
        shm.read(handle, op.local)
    elif way == "ibverbs":
        _over_verbs(handle, verbs.READ, op.local, handle.size, deadline)
    else:
        _over_tcp(local_process(), handle, tcp.READ, op.local, handle.size, deadline)


def _write(op: Op, deadline: float) -> None:
    handle = op.handle
    way = plane(handle)
    if way == "local":
        ctypes.memmove(_writable(handle.buffer_id, op.size).address, op.local.address, op.size)
        return
    if way == "ibverbs":
        _over_verbs(handle, verbs.WRITE, op.local, op.size, deadline)
        return
    proc = local_process()
    if way == "shm":
        pid, identity, token = shm.own_identity()
        expires = time.time() + (deadline - time.monotonic())  # one clock on one host
        request = (
            "pull",
            handle.buffer_id,
            expires,
            pid,
            identity,
            token,
            op.local.address,
            op.size,
        )
        if proc.ask(handle.proc, handle.service, request, deadline):
            return
    _over_tcp(proc, handle, tcp.WRITE, op.local, op.size, deadline)


def serve_atomic(buffer_id: int, kind: str, first: int, second: int) -> int:
    """On the owner: the atomic, under this process's lock; returns the old value."""
    region = _writable(buffer_id, ATOMIC_SIZE)
    word = ctypes.c_uint64.from_address(region.address)
    with registry.atomics:
        old = int(word.value)
        if kind == "fetch_add":
            word.value = (old + first) & U64
        elif old == first:
            word.value = second
    return old


def _atomic(op: Op, deadline: float) -> None:
    handle = op.handle
    first, second = (*op.args, 0, 0)[:2]
    if handle.token == registry.token:
        old = serve_atomic(handle.buffer_id, op.kind, first, second)
    else:
        request = ("atomic", handle.buffer_id, op.kind, first, second)
        old = local_process().ask(handle.proc, handle.service, request, deadline)
    ctypes.c_uint64.from_address(op.local.address).value = old


def serve_pull(
    buffer_id: int, expires: float, pid: int, identity: int, token: int, address: int, size: int
) -> bool:
    """On the owner: a writer of this host asks us to read ``size`` bytes of it. Not once
    the writer has given up (a stopped owner resumed late): its memory may be reused."""
    if time.time() > expires:
        raise RDMATimeoutError("the write request expired before the owner could serve it")
    return shm.pull_into(_writable(buffer_id, size), pid, identity, token, address, size)


def drop(handle: Handle, deadline: float) -> None:
    """Unregister the buffer at its owner; done if the owner is gone (its memory is)."""
    if handle.token == registry.token:
        registry.drop(handle.buffer_id)
        return
    try:
        local_process().ask(handle.proc, handle.service, ("drop", handle.buffer_id), deadline)
    except RDMAOwnerDied:
        pass


_RUN = {"read": _read, "write": _write, "fetch_add": _atomic, "compare_and_swap": _atomic}
Process.handlers.update(
    pull=serve_pull, drop=registry.drop, atomic=serve_atomic, verbs_connect=_serve_connect
)
registry.on_drop.append(_deregister)
Process.quick.append(lambda request: request[0] != "pull" or request[-1] <= INLINE_MAX)


def _copies_here(op: Op) -> bool:
    """Whether this thread copies the bytes itself (no owner, no socket involved)."""
    way = plane(op.handle)
    return way == "local" or (way == "shm" and op.kind == "read")


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
        proc.ops.submit(run, task)
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

    local_process().ops.submit(body)
    return future


def read_op(dst: object, handle: Handle) -> Op:
    """A read of the whole buffer into the start of ``dst``; ValueError if it cannot be."""
    local = region_of(dst, "dst")
    if not local.writable:
        raise ValueError("dst is read-only: it cannot be read into")
    if local.size < handle.size:
        raise ValueError(
            f"dst ({local.size} bytes) is smaller than the RDMA buffer ({handle.size} bytes)"
        )
    return Op("read", handle, local, handle.size)


def write_op(handle: Handle, src: object) -> Op:
    """A write of all of ``src`` to the start of the buffer; ValueError if it cannot be."""
    local = region_of(src, "src")
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
