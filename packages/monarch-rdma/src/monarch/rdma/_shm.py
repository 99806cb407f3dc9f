"""The shared-memory plane: processes of one host copy straight from each other's memory.

A reader copies a buffer out of its owner with ``process_vm_readv`` (monarch-core's
``read_process_memory``, the same one large messages are lent with), checking the
buffer's liveness cell before and after (see ``_registry``): no message, no copy in
between. A write goes the other way round: the writer asks the owner's service, and the
owner reads the writer's memory into its buffer, so the owner's memory is only ever
written by the owner, which knows the buffer is registered while it writes (a writer
that wrote into another process could race a drop and scribble on freed memory).
"""

from __future__ import annotations

import errno
import os

from monarch.core import (
    PullError,
    buffer_address,
    current_config,
    lending_available,
    read_process_memory,
)

from ._errors import RDMABufferDropped, RDMAOwnerDied, RDMATransferError
from ._handle import Handle
from ._region import Region
from ._registry import CELL, IDENTITY_MAGIC, registry

_readable: dict[tuple[int, int], bool] = {}
"""Whether we can read the process (pid, token), tested once each."""


def _read_pair(pid: int, address: int) -> tuple[int, int]:
    into = bytearray(CELL.size)
    read_process_memory(pid, buffer_address(into), address, CELL.size)
    first, second = CELL.unpack(into)
    return first, second


def is_us(pid: int, identity: int, token: int) -> bool:
    """Whether the process ``pid`` is the one with ``token`` and we may read it."""
    if pid == os.getpid() or not lending_available() or not current_config().read_peer_buffers:
        return False
    key = (pid, token)
    known = _readable.get(key)
    if known is None:
        try:
            known = _read_pair(pid, identity) == (IDENTITY_MAGIC, token)
        except (PullError, OverflowError):
            known = False
        _readable[key] = known
    return known


def usable(handle: Handle) -> bool:
    """Whether ``handle``'s owner is a process of this host that we may read."""
    return is_us(handle.pid, handle.identity, handle.token)


def _check_live(handle: Handle) -> None:
    try:
        token, buffer_id = _read_pair(handle.pid, handle.cell)
    except PullError as error:
        if error.errno == errno.ESRCH:
            raise RDMAOwnerDied(f"the owner of the buffer ({handle.owner}) is gone") from None
        raise RDMATransferError(f"cannot read the owner {handle.owner}: {error}") from None
    if token != handle.token:
        raise RDMAOwnerDied(f"the owner of the buffer ({handle.owner}) is gone")
    if buffer_id != handle.buffer_id:
        raise RDMABufferDropped(f"the buffer of {handle.owner} was dropped")


def read(handle: Handle, into: Region) -> None:
    """Copy the whole buffer into the start of ``into`` (checked large enough)."""
    _check_live(handle)
    try:
        read_process_memory(handle.pid, into.address, handle.address, handle.size)
    except PullError as error:
        _check_live(handle)  # a drop or a death explains it better
        raise RDMATransferError(f"reading the buffer of {handle.owner} failed: {error}") from None
    _check_live(handle)  # a drop during the copy: the bytes may be anyone's


def pull_into(target: Region, pid: int, identity: int, token: int, address: int, size: int) -> bool:
    """On the owner: copy ``size`` bytes at ``address`` of the writer ``pid`` into
    ``target``; False if we cannot read that writer (it then writes over TCP)."""
    if not is_us(pid, identity, token):
        return False
    try:
        read_process_memory(pid, target.address, address, size)
    except PullError as error:
        raise RDMATransferError(f"reading the writer's memory failed: {error}") from None
    return True


def own_identity() -> tuple[int, int, int]:
    """(pid, identity cell address, token) of this process, for a write request."""
    return os.getpid(), registry.identity_address, registry.token
