"""The owner's side of a buffer, and how a peer asks it: the ``rdma`` service.

The owner of a buffer must answer for it while its actor is busy (a sync endpoint
computing, an async one awaiting), and a buffer may be made anywhere: the client, an
``__init__``, an endpoint of either kind. So the owner's side is a monarch-core
``Service``, answered on the runtime loop of every process that imported this module
(every process that made or received a buffer), not an actor that would have to be
spawned before the first buffer could be handed out. A peer asks with monarch-core's
``ask``: the owner's death fails the question at once, its deadline ends it. The
owner's refusals (``Refused``) become the asker's exceptions of the same kind.
"""

from __future__ import annotations

import ctypes
import time
from concurrent.futures import Future
from typing import Final

from monarch.core import PeerLost, PullError
from monarch.core.lowlevel import Service, ServiceError, ask, pull_into

from . import _verbs as verbs
from ._errors import (
    RDMABufferDropped,
    RDMAError,
    RDMAOwnerDied,
    RDMATimeoutError,
    RDMATransferError,
)
from ._handle import Handle
from ._messages import (
    U64,
    Answer,
    Atomic,
    Connected,
    Copied,
    Drop,
    Dropped,
    Failure,
    Old,
    Pull,
    Pulled,
    Refused,
    Request,
    Stage,
)
from ._process import local_process
from ._region import Region
from ._registry import registry
from ._staging import staging

ATOMIC_SIZE: Final = 8
"""fetch_add and compare_and_swap act on the buffer's first 8 bytes (an unsigned 64-bit
integer, native byte order, as ibverbs' atomics), and write its old value to ``dst``."""
INLINE_MAX: Final = 4 * 1024 * 1024
"""A copy up to this size is made by the thread that has it to make (the owner's loop for
a pull, the caller for a read): a hop to another thread and back costs more."""

DROP_WAIT: Final = 60.0
"""Seconds an owner's drop waits for the writers of this host that hold the buffer's
write gate (a writer stopped mid-write) before it says so (``RDMATimeoutError``)."""

_RAISES: Final[dict[Failure, type[RDMAError]]] = {
    "dropped": RDMABufferDropped,
    "timeout": RDMATimeoutError,
    "transfer": RDMATransferError,
    "error": RDMAError,
}


def registered(buffer_id: int) -> Region:
    region = registry.get(buffer_id)
    if region is None:
        raise RDMABufferDropped("the buffer was dropped")
    return region


def writable(buffer_id: int, size: int) -> Region:
    region = registered(buffer_id)
    if not region.writable:
        raise RDMAError("the buffer is read-only: it cannot be written")
    if size > region.size:
        raise RDMAError(f"{size} bytes do not fit in a buffer of {region.size}")
    return region


def serve_atomic(buffer_id: int, kind: str, first: int, second: int) -> int:
    """On the owner: the atomic, under this process's lock; returns the old value (on a
    GPU buffer's first 8 bytes: through its host copies, ``_staging``)."""
    region = writable(buffer_id, ATOMIC_SIZE)
    gpu = staging.get(buffer_id)
    word = ctypes.c_uint64.from_address(region.address)
    with registry.atomics:
        if gpu is not None:
            staging.stage(buffer_id, "out", ATOMIC_SIZE)
        old = int(word.value)
        new = (old + first) & U64 if kind == "fetch_add" else second if old == first else old
        if gpu is not None:
            ctypes.c_uint64.from_address(gpu.inbox.data_ptr()).value = new
            staging.stage(buffer_id, "in", ATOMIC_SIZE)
        else:
            word.value = new
    return old


def _pull(request: Pull) -> Pulled:
    """A writer of this host asks us to read its bytes into the buffer. Not once the
    writer has given up (a stopped owner resumed late): its memory may be reused."""
    if time.time() > request.expires:
        raise RDMATimeoutError("the write request expired before the owner could serve it")
    target = writable(request.buffer_id, request.size)
    try:
        done = pull_into(
            target.address,
            request.pid,
            request.identity,
            request.token,
            request.address,
            request.size,
        )
    except PullError as error:
        raise RDMATransferError(f"reading the writer's memory failed: {error}") from None
    return Pulled(done)


def _refused(error: BaseException) -> Refused:
    if isinstance(error, RDMABufferDropped):
        return Refused("dropped", str(error))
    if isinstance(error, RDMATimeoutError):
        return Refused("timeout", str(error))
    if isinstance(error, RDMATransferError):
        return Refused("transfer", str(error))
    if isinstance(error, RDMAError):
        return Refused("error", str(error))
    return Refused("error", f"{type(error).__name__}: {error}")


def _pull_later(request: Pull) -> Future[Answer]:
    """A large pull, on a bulk-data thread (the loop goes on meanwhile)."""

    def run() -> Answer:
        try:
            return _pull(request)
        except Exception as error:  # noqa: BLE001 - the asker gets it
            return _refused(error)

    return local_process().threads.submit(run)


def _stage_later(request: Stage) -> Future[Answer]:
    """A GPU buffer's copy, on a bulk-data thread (CUDA copies block their caller)."""

    def run() -> Answer:
        try:
            staging.stage(request.buffer_id, request.way, request.size)
        except Exception as error:  # noqa: BLE001 - the asker gets it
            return _refused(error)
        return Copied()

    return local_process().threads.submit(run)


def _drop_later(buffer_id: int) -> Future[Answer]:
    """A drop that waits for the writers in its buffer's gate, on a bulk-data thread."""

    def run() -> Answer:
        try:
            return Dropped(registry.drop(buffer_id, time.monotonic() + DROP_WAIT))
        except Exception as error:  # noqa: BLE001 - the asker gets it
            return _refused(error)

    return local_process().threads.submit(run)


def _serve(request: Request) -> Answer | Future[Answer]:
    """Answer one request, on the runtime loop (a large pull on a bulk-data thread while
    one is free: see ``monarch.core.lowlevel.bulk_executor``)."""
    try:
        if isinstance(request, Pull):
            if request.size > INLINE_MAX and not local_process().threads.saturated():
                return _pull_later(request)
            return _pull(request)
        if isinstance(request, Drop):
            if registry.gate.busy(request.buffer_id):  # a writer writes it: wait off the loop
                return _drop_later(request.buffer_id)
            return Dropped(registry.drop(request.buffer_id))
        if isinstance(request, Atomic):
            return Old(serve_atomic(request.buffer_id, request.kind, request.first, request.second))
        if isinstance(request, Stage):
            writable(request.buffer_id, request.size)  # registered, and the size fits
            return _stage_later(request)
        nic = verbs.device()
        if nic is None:
            raise RDMATransferError("the owner has no ibverbs device")
        qpn, gid = nic.accept(request.peer, request.qpn, request.gid)
        return Connected(qpn, gid)
    except Exception as error:  # noqa: BLE001 - the asker gets it
        return _refused(error)


SERVICE: Final = Service[Request]("rdma", Request, _serve, answers=Answer)
"""The owner's side of every buffer of this process."""


def ask_owner(handle: Handle, request: Request, deadline: float) -> Answer:
    """Ask the owner of ``handle`` and block for its answer (on an RDMA thread, never the
    loop); its refusal, its death or the deadline raise the matching ``RDMAError``."""
    try:
        answer: Answer = ask(handle.proc, request, max(0.0, deadline - time.monotonic())).get()
    except PeerLost as error:
        raise RDMAOwnerDied(f"the buffer's owner at {handle.proc} died: {error}") from None
    except ServiceError as error:
        raise RDMAError(f"the buffer's owner at {handle.proc} could not answer: {error}") from None
    except TimeoutError:
        raise RDMATimeoutError(
            f"the buffer's owner at {handle.proc} did not answer in time"
        ) from None
    if isinstance(answer, Refused):
        raise _RAISES[answer.why](answer.message)
    return answer
