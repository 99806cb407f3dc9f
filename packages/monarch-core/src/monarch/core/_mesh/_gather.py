"""The gather: one reply per rank of a cast, collected on a port.

Every call that wants replies opens one ``Gather``: it is the port's handler, completes
the call's future (one value, a ``ValueMesh``, or a stream of arrivals) and fails fast
when a reply is an error or a proc it waits on dies (seen here, or by a relay of the cast
tree that gathers replies on their way up: see ``_runtime._combine``). Thousands may be
pending at once, so it is one slotted object per call; a mesh's calls share one watch of
its procs (``SharedWatch``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from monarch.core._errors import PeerLost, RemoteFailure, SupervisionError
from monarch.core._layout._shape import Shape
from monarch.core._layout._value_mesh import ValueMesh
from monarch.core._payload._serialize import loads
from monarch.core._runtime import Runtime
from monarch.core._runtime._messages import Body, PortBatch, PortValue
from monarch.transport import Buffer

from ._future import Future


class GatheredMesh(Protocol):
    """The mesh a gathered call went to: its values are laid out on its shape."""

    def _shape_for_values(self) -> Shape: ...


class Gather:
    """Collects one reply per rank of a cast on a port; fails fast on errors or dead procs.

    When done it completes ``result`` (a call's future: its one value, or a ValueMesh
    over ``mesh``) or calls ``on_done``. One object per call in flight, itself the
    port's handler: thousands may be pending at once.

    Any thread may make one (a caller casting itself, see ``ActorMesh._cast_here``); from
    then on only the loop touches it, and a peer's failure may reach it before the maker
    has returned (see ``__init__``).
    """

    __slots__ = (
        "_done",
        "_outcome",
        "arrivals",
        "count",
        "mesh",
        "on_done",
        "port",
        "procs",
        "received",
        "result",
        "runtime",
        "shared",
        "values",
        "want",
        "watches",
    )

    def __init__(
        self,
        runtime: Runtime,
        count: int,
        procs: Collection[str],
        *,
        stream: bool = False,
        on_done: Callable[[list[Any] | None, BaseException | None], None] | None = None,
        result: Future[Any] | None = None,
        want: str = "",
        mesh: GatheredMesh | None = None,
        shared: SharedWatch | None = None,
    ) -> None:
        self.runtime = runtime
        self.procs = procs
        self.shared = shared
        self.count = count
        self.on_done = on_done
        self.result = result
        self.want = want
        self.mesh = mesh
        self.values: list[Any] = [None] * count
        self.received = 0
        self._done: asyncio.Future[list[Any]] | None = None
        self._outcome: tuple[list[Any] | None, BaseException | None] | None = None
        self.arrivals: list[asyncio.Future[Any]] | None = (
            [runtime.loop.create_future() for _ in range(count)] if stream else None
        )
        if result is not None:
            result._answering = len(procs)
        if shared is not None:  # the mesh's procs, watched once for all its calls
            self.watches: Sequence[tuple[str, int]] = ()
            self.port = runtime.open_port(self)
            shared.add(self)
            return
        # Watchers last: from the first on, ``_on_peer_lost`` may run on the loop (a peer
        # already failed, or failing now) while this thread is still here, so everything
        # it touches is set. It unwatches what ``watches`` holds by then; what is added
        # after it ran is unwatched below.
        self.watches = watches = []
        self.port = runtime.open_port(self)
        for proc in procs:
            watches.append((proc, runtime.watch_peer(proc, self._on_peer_lost)))
        if self.finished():
            for proc, key in watches:
                runtime.unwatch_peer(proc, key)

    def __call__(self, body: Body, payload: Sequence[Buffer]) -> None:
        """A value for the port, or a batch of them (each distinct value unpickled once)."""
        if isinstance(body, PortValue):
            self._accept((body.rank,), *self._read(body.error, payload))
        elif isinstance(body, PortBatch):
            for address, what in body.lost:  # a relay saw a subtree's head fail
                self._on_peer_lost(address, PeerLost(what))
            at = 0
            for ranks, error, count in body.groups:
                if self._outcome is not None:
                    return
                self._accept(ranks, *self._read(error, payload[at : at + count]))
                at += count

    @staticmethod
    def _read(error: bool, payload: Sequence[Buffer]) -> tuple[Any, bool]:
        try:
            value = loads(payload)
        except Exception as exc:  # noqa: BLE001 - a reply that cannot be read fails the call
            return exc, True
        if error and isinstance(value, RemoteFailure):
            value = value.to_error()
        return value, error

    def _accept(self, ranks: Sequence[int], value: Any, error: bool) -> None:
        if self.arrivals is not None:
            for _ in ranks:
                slot = self.arrivals[self.received]
                (slot.set_exception if error else slot.set_result)(value)
                self.received += 1
            if self.received == self.count:
                self._finish(None)
            return
        if error:
            self._finish(value)
            return
        values = self.values
        for rank in ranks:
            values[rank] = value
        self.received += len(ranks)
        if self.received == self.count:
            self._finish(None)

    def finished(self) -> bool:
        """Whether the call is over (any thread: the loop may end it meanwhile)."""
        return self._outcome is not None

    def _on_peer_lost(self, address: str, exc: BaseException) -> None:
        error = SupervisionError(
            f"the proc at {address} and all its descendants have failed: {exc}"
        )
        if self.arrivals is not None:
            for slot in self.arrivals:
                if not slot.done():
                    slot.set_exception(error)
        self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        if self._outcome is not None:
            return
        values = self.values
        self._outcome = (None, error) if error is not None else (values, None)
        runtime = self.runtime
        runtime.close_port(self.port)
        if self.shared is not None:
            self.shared.pending.discard(self)
        for proc, key in self.watches:
            runtime.unwatch_peer(proc, key)
        result = self.result
        if result is not None and not result.done():
            if error is not None:
                result.set_exception(error)
            elif self.want == "one":
                result.set_result(values[0])
            else:
                assert self.mesh is not None
                result.set_result(ValueMesh(self.mesh._shape_for_values(), values))
        if self.on_done is not None:
            self.on_done(None if error is not None else values, error)
        if self._done is not None:
            self._settle(self._done)

    @property
    def done(self) -> asyncio.Future[list[Any]]:
        """The values, as an asyncio future of the loop (made when first asked for)."""
        if self._done is None:
            self._done = self.runtime.loop.create_future()
            if self._outcome is not None:
                self._settle(self._done)
        return self._done

    def _settle(self, done: asyncio.Future[list[Any]]) -> None:
        assert self._outcome is not None
        values, error = self._outcome
        if error is not None:
            done.set_exception(error)
            done.exception()  # observed here; on_done or an awaiter reports it
        else:
            assert values is not None
            done.set_result(values)


class SharedWatch:
    """The procs of one mesh, watched once for every gather that waits on some of them.

    A gather watching each of its N procs itself registers N watchers and removes them
    again: O(procs) work for the caller per call. Gathers given a ``SharedWatch`` join its
    ``pending`` set instead, and a proc's failure reaches those of them that wait on it.
    From any thread, as ``Runtime.watch_peer``: a failure is recorded before the pending
    gathers are read, and a gather joins before reading the failures, so none is missed
    (one may hear twice: ``_on_peer_lost`` tolerates that).
    """

    __slots__ = ("failed", "keys", "pending", "runtime")

    def __init__(self, runtime: Runtime, procs: Sequence[str]) -> None:
        self.runtime = runtime
        self.pending: set[Gather] = set()
        self.failed: dict[str, BaseException] = {}
        self.keys = [(proc, runtime.watch_peer(proc, self._lost)) for proc in dict.fromkeys(procs)]

    def add(self, gather: Gather) -> None:
        self.pending.add(gather)
        if not self.failed:  # the common case: nothing to tell it
            return
        for address, exc in list(self.failed.items()):
            if address in gather.procs:
                self.runtime.call_soon(gather._on_peer_lost, address, exc)
                return

    def _lost(self, address: str, exc: BaseException) -> None:
        self.failed.setdefault(address, exc)
        for gather in list(self.pending):
            if address in gather.procs:
                gather._on_peer_lost(address, exc)

    def close(self) -> None:
        """Stop watching (the mesh is stopped: no gather will wait on it again)."""
        keys, self.keys = self.keys, []
        for proc, key in keys:
            self.runtime.unwatch_peer(proc, key)
