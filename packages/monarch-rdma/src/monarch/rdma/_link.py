"""The bulk-data plane of one ``ibverbs://`` connection: its queue pair, in a protection
domain of its own, over which the peer reads the frame parts lent to it.

The ibverbs transport (``_transport``) lends a frame's large parts with monarch-core's
``Lender``, through this plane: ``lend`` registers the part's memory in the link's own
protection domain, readable by RDMA READ only (so the peer reaches what was lent to it on
this connection and nothing else: not other connections' parts, not ``RDMABuffer``
regions), and says its ``rkey``; the receiver ``read``s each ``lent_part`` over its end of the
link; the key given back, the ``Lender`` has this plane ``release`` the region. Not one of
the registered planes (``_planes``): one is made per connection, by the transport.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

from monarch.core.lowlevel import Lent, Loan, Plane
from monarch.transport import ConnectionClosed

from . import _verbs as verbs
from ._region import Region


class LinkPlane(Plane):
    """The queue pair of one connection (see the module docstring)."""

    name: ClassVar[str] = "ibverbs-link"
    order: ClassVar[int] = 20

    def __init__(
        self,
        nic: verbs.Device,
        link: verbs.Connection,
        hung_up: Callable[[], Callable[[], bool]],
    ) -> None:
        self.nic = nic
        self.link = link
        self._hung_up = hung_up
        """A new check of whether the peer has gone, made for each read."""
        self._regions: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._use = threading.Lock()
        """Held by a read over the link and by its closing: never both at once."""
        self.closed = False

    def lend(self, buffer_id: int, address: int, size: int) -> tuple[int] | None:
        try:
            region = self.nic.offer(self.link, address, size)
        except Exception as error:  # noqa: BLE001 - pinned-memory limit...: sent inline
            verbs.log.debug("cannot register a %d-byte part (%s): sent inline", size, error)
            return None
        with self._lock:
            if self.closed:  # closed meanwhile: its regions are gone already
                region.close()
                return None
            self._regions[buffer_id] = region
        return (int(region.rkey),)

    def release(self, buffer_id: int) -> None:
        with self._lock:
            region = self._regions.pop(buffer_id, None)
        if region is not None:
            region.close()

    def reaches(self, loan: Loan) -> bool:
        return not self.closed and loan.reach(self.name) is not None

    def read(self, loan: Loan, into: int, deadline: float) -> None:
        """RDMA READ the part into ``into``; the peer's death ends it (see ``_hung_up``)."""
        reach = loan.reach(self.name)
        if reach is None:
            raise ValueError(f"{loan!r} was not lent over this connection")
        gone = self._hung_up()
        local = Region(into, loan.size, True, None)
        with self._use:
            if self.closed:
                raise ConnectionClosed("the connection was closed")
            self.nic.transfer(
                self.link, verbs.READ, local, loan.size, loan.address, reach[0], deadline, gone
            )

    def write(self, loan: Loan, source: int, size: int, deadline: float) -> bool:
        return False  # a peer only reads what was lent to it

    def close_now(self) -> bool:
        """Close at once if no read is in progress (whether it did: else ``close``)."""
        if not self._use.acquire(blocking=False):
            return False
        try:
            self._close()
        finally:
            self._use.release()
        return True

    def close(self) -> None:
        """Deregister what is still lent, then the link: after any read over it has ended."""
        with self._use:
            self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.link.broken = True
        with self._lock:
            regions, self._regions = self._regions, {}
        for region in regions.values():
            region.close()
        verbs.close_link(self.link)


def lent_part(key: int, address: int, size: int, rkey: int) -> Lent:
    """The loan an ``Offer`` names: a part lent over one connection, reached by its plane."""
    return Lent(key, address, size, ((LinkPlane.name, (rkey,)),))
