"""The ibverbs plane: RDMA READ and WRITE on reliable-connection queue pairs (pyverbs).

pyverbs is Debian's ``python3-pyverbs`` (rdma-core), imported only when this plane is used.
The owner registers a buffer's memory (a memory region, its ``rkey`` in the handle) when it
makes the buffer; a peer that wants to reach it connects one queue pair to one of the
owner's, the two exchanging their queue pair numbers and GIDs through the owner's service
(an actor message, not a side channel), then posts RDMA READ/WRITE work requests straight
against the owner's memory: the owner's CPU takes no part. The caller's memory is
registered for the transfer's duration. Completions are polled with a growing pause
(``time.sleep`` lets go of the GIL), never in a loop that holds it.

A drop deregisters the region: a later access fails at the NIC with a remote access error,
reported as ``RDMABufferDropped``; an owner gone makes the queue pair's retries run out.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

from monarch.core import current_config

from ._chunks import KIB, MIB, plan
from ._errors import RDMABufferDropped, RDMAOwnerDied, RDMATimeoutError, RDMATransferError
from ._region import Region

log = logging.getLogger("monarch.rdma")

READ: Final = "read"
WRITE: Final = "write"
MAX_OUTSTANDING: Final = 64
"""Work requests a queue pair has in flight at once."""
_REMOTE_ACCESS_ERROR: Final = 10
_RETRY_EXCEEDED: Final = 12
_POLL_PAUSE_MAX: Final = 0.001


@functools.cache
def _pyverbs() -> dict[str, ModuleType] | None:
    try:
        return {
            name: importlib.import_module(f"pyverbs.{name}")
            for name in ("enums", "device", "pd", "mr", "cq", "qp", "addr", "wr")
        }
    except Exception:  # noqa: BLE001 - no pyverbs or no libibverbs: no plane
        return None


@functools.cache
def device_names() -> tuple[str, ...]:
    """The ibverbs devices pyverbs sees (none without pyverbs), looked up once."""
    verbs = _pyverbs()
    if verbs is None:
        return ()
    try:
        return tuple(
            d.name.decode() if isinstance(d.name, bytes) else str(d.name)
            for d in verbs["device"].get_device_list()
        )
    except Exception:  # noqa: BLE001 - a broken stack is no device
        return ()


@dataclass
class Connection:
    """Our end of a queue pair connected to one owner process."""

    qp: Any
    cq: Any
    lock: threading.Lock
    broken: bool = False
    pd: Any = None
    """Its own protection domain (the transport's links), or None: the device's."""


def close_link(link: Connection) -> None:
    """Close a link's queue pair, completion queue and protection domain (what fails to
    close never carried anything)."""
    for item in (link.qp, link.cq, link.pd):
        try:
            item.close()
        except Exception:  # noqa: BLE001 - closing what never carried anything
            pass


class Device:
    """This process's ibverbs device: its protection domain, regions and connections."""

    def __init__(self, name: str) -> None:
        verbs = _pyverbs()
        assert verbs is not None
        self.v = verbs
        e = verbs["enums"]
        self.name = name
        self.ctx = verbs["device"].Context(name=name)
        self.port = 1
        self.port_attr = self.ctx.query_port(self.port)
        self.gid_index, self.gid = self._pick_gid()
        self.pd = verbs["pd"].PD(self.ctx)
        self.access = (
            e.IBV_ACCESS_LOCAL_WRITE
            | e.IBV_ACCESS_REMOTE_WRITE
            | e.IBV_ACCESS_REMOTE_READ
            | e.IBV_ACCESS_REMOTE_ATOMIC
        )
        self._lock = threading.Lock()
        self._connections: dict[int, Connection] = {}
        self._served: dict[tuple[int, int], tuple[Any, Any]] = {}
        """Queue pairs we answer on, by (peer token, peer qp number): kept alive."""
        self.regions: dict[int, Any] = {}
        """Memory regions of our buffers, by buffer id."""

    def _pick_gid(self) -> tuple[int, str]:
        """A usable GID of the port: index 1 (RoCE v2 on rxe) when set, else the first."""
        size = max(1, int(getattr(self.port_attr, "gid_tbl_len", 2)))
        found: list[tuple[int, str]] = []
        for index in range(min(size, 16)):
            try:
                gid = str(self.ctx.query_gid(self.port, index))
            except Exception:  # noqa: BLE001 - an empty slot
                continue
            if gid.replace(":", "").strip("0"):
                found.append((index, gid))
        if not found:
            raise RDMATransferError(f"{self.name} has no usable GID on port {self.port}")
        return next((f for f in found if f[0] == 1), found[0])

    # -- memory -------------------------------------------------------------------------------

    def register(self, buffer_id: int, region: Region) -> int:
        """Register a buffer's memory; its rkey."""
        access = self.access if region.writable else self.v["enums"].IBV_ACCESS_REMOTE_READ
        mr = self.v["mr"].MR(self.pd, region.size, access, address=region.address)
        with self._lock:
            self.regions[buffer_id] = mr
        return int(mr.rkey)

    def deregister(self, buffer_id: int) -> None:
        with self._lock:
            mr = self.regions.pop(buffer_id, None)
        if mr is not None:
            mr.close()

    # -- queue pairs --------------------------------------------------------------------------

    def _new_qp(self, pd: Any = None) -> tuple[Any, Any]:
        e, qp = self.v["enums"], self.v["qp"]
        cq = self.v["cq"].CQ(self.ctx, 2 * MAX_OUTSTANDING)
        cap = qp.QPCap(max_send_wr=MAX_OUTSTANDING, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        attr = qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)
        return qp.QP(self.pd if pd is None else pd, attr), cq

    def _to_rts(self, qp: Any, remote_qpn: int, remote_gid: str) -> None:
        v = self.v
        attr = v["qp"].QPAttr(port_num=self.port)
        attr.path_mtu = self.port_attr.active_mtu
        attr.dest_qp_num = remote_qpn
        attr.rq_psn = attr.sq_psn = 0
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.qp_access_flags = self.access
        gid = v["addr"].GID()
        gid.gid = remote_gid
        route = v["addr"].GlobalRoute(dgid=gid, sgid_index=self.gid_index)
        attr.ah_attr = v["addr"].AHAttr(gr=route, is_global=1, port_num=self.port)
        qp.to_rts(attr)

    def accept(self, peer: int, peer_qpn: int, peer_gid: str) -> tuple[int, str]:
        """On the owner: a queue pair connected to a peer's; its number and our GID."""
        qp, cq = self._new_qp()
        self._to_rts(qp, peer_qpn, peer_gid)
        with self._lock:
            old = self._served.pop((peer, peer_qpn), None)
            self._served[(peer, peer_qpn)] = (qp, cq)
        if old is not None:
            old[0].close()
        return int(qp.qp_num), self.gid

    def connection(self, owner: int, ask: Any) -> Connection:
        """Our connection to the owner process ``owner`` (its token), made through ``ask``
        (a request to its service) the first time, or again after a failure."""
        with self._lock:
            found = self._connections.get(owner)
        if found is not None and not found.broken:
            return found
        qp, cq = self._new_qp()
        remote_qpn, remote_gid = ask(int(qp.qp_num), self.gid)
        self._to_rts(qp, remote_qpn, remote_gid)
        made = Connection(qp, cq, threading.Lock())
        with self._lock:
            self._connections[owner] = made
        return made

    # -- the transport's links (``_transport``) -----------------------------------------------

    def open_link(self) -> Connection:
        """A queue pair in a protection domain of its own, not connected yet: its peer can
        reach only the memory registered in that domain (what was offered to it)."""
        pd = self.v["pd"].PD(self.ctx)
        qp, cq = self._new_qp(pd)
        return Connection(qp, cq, threading.Lock(), pd=pd)

    def connect_link(self, link: Connection, remote_qpn: int, remote_gid: str) -> None:
        self._to_rts(link.qp, remote_qpn, remote_gid)

    def offer(self, link: Connection, address: int, size: int) -> Any:
        """A memory region over ``size`` bytes at ``address`` that the link's peer may only
        read (RDMA READ), nothing around them."""
        read_only = self.v["enums"].IBV_ACCESS_REMOTE_READ
        return self.v["mr"].MR(link.pd, size, read_only, address=address)

    # -- transfers ----------------------------------------------------------------------------

    def transfer(
        self,
        conn: Connection,
        op: str,
        local: Region,
        size: int,
        remote_address: int,
        rkey: int,
        deadline: float,
        gone: Callable[[], bool],
    ) -> None:
        """RDMA READ (``op`` read) or WRITE of ``size`` bytes between the start of ``local``
        and the owner's memory at ``remote_address``; ``gone()`` says the owner died (its
        queue pair may never answer: the wait ends then, not at the deadline)."""
        v, e = self.v, self.v["enums"]
        config = current_config()
        chunks = plan(
            size, 1, config.rdma_max_chunk_size_mb * MIB, config.rdma_min_stripe_size_kb * KIB
        )
        opcode = e.IBV_WR_RDMA_READ if op == READ else e.IBV_WR_RDMA_WRITE
        # the destination of a read is written by the NIC; the source of a write only read
        access = e.IBV_ACCESS_LOCAL_WRITE if op == READ else 0
        pd = self.pd if conn.pd is None else conn.pd
        mr = v["mr"].MR(pd, max(size, 1), access, address=local.address)
        try:
            with conn.lock:
                self._run(conn, opcode, chunks, mr, remote_address, rkey, deadline, gone)
        except BaseException:
            conn.broken = True  # a failed queue pair is in the error state: make a new one
            raise
        finally:
            mr.close()

    def _run(
        self,
        conn: Connection,
        opcode: int,
        chunks: list[tuple[int, int]],
        mr: Any,
        remote_address: int,
        rkey: int,
        deadline: float,
        gone: Callable[[], bool],
    ) -> None:
        wr_mod, e = self.v["wr"], self.v["enums"]
        pending = iter(chunks)
        outstanding = 0
        left = len(chunks)
        while left:
            while outstanding < MAX_OUTSTANDING:
                chunk = next(pending, None)
                if chunk is None:
                    break
                offset, length = chunk
                sge = wr_mod.SGE(mr.buf + offset, length, mr.lkey)
                wr = wr_mod.SendWR(
                    opcode=opcode, num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED
                )
                wr.set_wr_rdma(rkey, remote_address + offset)
                conn.qp.post_send(wr)
                outstanding += 1
            done = _poll(conn.cq, outstanding, deadline, gone)
            outstanding -= done
            left -= done


def _poll(cq: Any, most: int, deadline: float, gone: Callable[[], bool]) -> int:
    """Wait for at least one completion (up to ``most``); raise for a failed one."""
    pause = 0.0
    while True:
        count, completions = cq.poll(num_entries=most)
        if count:
            for wc in completions[:count]:
                if wc.status == _REMOTE_ACCESS_ERROR:
                    raise RDMABufferDropped(
                        "the owner's NIC refused the access: the buffer was dropped"
                    )
                if wc.status != 0:
                    raise RDMATransferError(
                        f"RDMA work request failed: status {wc.status}"
                        + (
                            " (retries exhausted: owner unreachable)"
                            if wc.status == _RETRY_EXCEEDED
                            else ""
                        )
                    )
            return int(count)
        if gone():
            raise RDMAOwnerDied("the buffer's owner died during the RDMA transfer")
        if time.monotonic() > deadline:
            raise RDMATimeoutError("the RDMA transfer did not complete in time")
        time.sleep(pause)
        pause = min(max(pause * 2, 20e-6), _POLL_PAUSE_MAX)


_opened: list[Device | None] = []
"""This process's device once tried: [the device] or [None] when opening it failed."""
_device_lock = threading.Lock()


def device() -> Device | None:
    """This process's device when the ibverbs plane is on (a device, not disabled), made
    on first use; None otherwise (or if opening it failed: logged once)."""
    if _opened:
        return _opened[0]
    config = current_config()
    names = device_names()
    if config.rdma_disable_ibverbs or not names:
        return None
    target = config.rdma_ibverbs_target
    name = target[4:] if target.startswith("nic:") and target[4:] in names else names[0]
    with _device_lock:
        if not _opened:
            try:
                _opened.append(Device(name))
            except Exception as error:  # noqa: BLE001 - the other planes still work
                log.warning("cannot open ibverbs device %s: %s; using the fallback", name, error)
                _opened.append(None)
    return _opened[0]
