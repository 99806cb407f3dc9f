"""monarch-rdma's bulk-data planes, registered in the ``monarch.bulk_planes`` entry points.

The core's plane (``memory``: processes of one host copy from each other) comes first; then

- ``pull``: the memory plane, writing: the owner, asked through its ``rdma`` service,
  reads the bytes out of the writer (``Pull``); reached where the memory plane is, so a
  read is the memory plane's and a write comes here next (``Planes.write``);
- ``ibverbs``: RDMA READ/WRITE between processes that both have an ibverbs device (the
  buffer is registered with ours when lent; its rkey travels in the handle);
- ``tcp``: the owner's data server (``_tcp``), in chunks over several streams; reaches
  any owner, so it is the last one asked.

Each is a ``monarch.core.lowlevel.Plane``: ``RDMABuffer`` lends through all of them and
an operation moves its bytes through the first that reaches the owner (``_transfer``).
"""

from __future__ import annotations

import os
import time
from typing import ClassVar

from monarch.core import current_config
from monarch.core.lowlevel import Loan, MemoryPlane, Plane

from . import _tcp as tcp
from . import _verbs as verbs
from ._chunks import KIB, MIB, plan
from ._errors import RDMAOwnerDied, RDMATransferError
from ._handle import Handle
from ._messages import Connect, Connected, Pull, Pulled
from ._process import local_process
from ._region import Region
from ._registry import registry
from ._service import ask_owner


def _handle(loan: Loan) -> Handle:
    if not isinstance(loan, Handle):
        raise TypeError(f"monarch-rdma's planes move RDMABuffer handles, not {loan!r}")
    return loan


class PullPlane(MemoryPlane):
    """The memory plane, whose writes the owner pulls (see the module docstring)."""

    name: ClassVar[str] = "pull"
    order: ClassVar[int] = 15

    def writes_alone(self, loan: Loan) -> bool:
        return False  # a write asks the owner: off the caller's thread, as any ask

    def write(self, loan: Loan, source: int, size: int, deadline: float) -> bool:
        """Ask the owner to read ``size`` bytes at ``source`` of ours into the buffer
        (False: it cannot read us, the next plane writes)."""
        if not isinstance(loan, Handle):
            return False  # not an RDMABuffer's: no owner's service to ask
        handle = loan
        expires = time.time() + (deadline - time.monotonic())  # one clock on one host
        request = Pull(
            handle.buffer_id,
            expires,
            os.getpid(),
            registry.identity_address,
            registry.token,
            source,
            size,
        )
        answer = ask_owner(handle, request, deadline)
        return isinstance(answer, Pulled) and answer.done


class TcpPlane(Plane):
    """The owner's TCP data server: reaches every owner."""

    name: ClassVar[str] = "tcp"
    order: ClassVar[int] = 30

    def lend(self, buffer_id: int, address: int, size: int) -> tuple[str, int]:
        server = local_process().data_server()
        return server.host, server.port

    def reaches(self, loan: Loan) -> bool:
        return loan.reach(self.name) is not None

    def read(self, loan: Loan, into: int, deadline: float) -> None:
        handle = _handle(loan)
        _over_tcp(handle, tcp.READ, Region(into, handle.size, True, None), handle.size, deadline)

    def write(self, loan: Loan, source: int, size: int, deadline: float) -> bool:
        _over_tcp(_handle(loan), tcp.WRITE, Region(source, size, False, None), size, deadline)
        return True


def _over_tcp(handle: Handle, op: int, local: Region, size: int, deadline: float) -> None:
    proc = local_process()
    config = current_config()
    chunks = plan(
        size,
        proc.width,
        config.rdma_max_chunk_size_mb * MIB,
        config.rdma_min_stripe_size_kb * KIB,
    )
    reach = handle.reach(TcpPlane.name)
    assert reach is not None
    host, port = reach
    streams = proc.streams(host, port)
    try:
        tcp.transfer(
            streams, op, handle.buffer_id, local, size, deadline, chunks, proc.threads, proc.width
        )
    except RDMATransferError as error:
        if not isinstance(error, RDMAOwnerDied) and handle.proc in proc.runtime.failed_peers:
            raise RDMAOwnerDied(f"the buffer's owner ({handle.owner}) died") from error
        raise


class IbverbsPlane(Plane):
    """RDMA READ/WRITE where both ends have an ibverbs device."""

    name: ClassVar[str] = "ibverbs"
    order: ClassVar[int] = 20

    def lend(self, buffer_id: int, address: int, size: int) -> tuple[int] | None:
        nic = verbs.device()
        if nic is None:
            return None
        region = registry.get(buffer_id)  # as registered: writable or not
        if region is None:
            return None
        try:
            return (nic.register(buffer_id, region),)
        except Exception as error:  # noqa: BLE001 - served by the other planes then
            verbs.log.warning("cannot register %d bytes with %s: %s", size, nic.name, error)
            return None

    def release(self, buffer_id: int) -> None:
        nic = verbs.device()
        if nic is not None:
            nic.deregister(buffer_id)

    def reaches(self, loan: Loan) -> bool:
        reach = loan.reach(self.name)
        return reach is not None and bool(reach[0]) and verbs.device() is not None

    def read(self, loan: Loan, into: int, deadline: float) -> None:
        handle = _handle(loan)
        local = Region(into, handle.size, True, None)
        _over_verbs(handle, verbs.READ, local, handle.size, deadline)

    def write(self, loan: Loan, source: int, size: int, deadline: float) -> bool:
        _over_verbs(_handle(loan), verbs.WRITE, Region(source, size, False, None), size, deadline)
        return True


def _over_verbs(handle: Handle, op: str, local: Region, size: int, deadline: float) -> None:
    nic = verbs.device()
    assert nic is not None
    reach = handle.reach(IbverbsPlane.name)
    assert reach is not None
    proc = local_process()
    failed = proc.runtime.failed_peers

    def gone() -> bool:
        return handle.proc in failed

    if gone():
        raise RDMAOwnerDied(f"the buffer's owner ({handle.owner}) died")

    def ask(qpn: int, gid: str) -> tuple[int, str]:
        answer = ask_owner(handle, Connect(registry.token, qpn, gid), deadline)
        if not isinstance(answer, Connected):
            raise RDMATransferError(f"the owner answered a connection with {answer!r}")
        return answer.qpn, answer.gid

    conn = nic.connection(handle.token, ask)
    try:
        nic.transfer(conn, op, local, size, handle.address, reach[0], deadline, gone)
    except RDMATransferError as error:
        if handle.proc in proc.runtime.failed_peers:
            raise RDMAOwnerDied(f"the buffer's owner ({handle.owner}) died") from error
        raise
