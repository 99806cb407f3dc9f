"""The controller's side of one proc mesh: ids, the command stream, the workers.

Commands are buffered and sent as one fire-and-forget broadcast per batch (the core keeps
a sender's messages in order, so a later fetch, a gathered call on the same actor mesh,
sees every command before it). Freed ids ride along with the next batch (or ``_freeing``'s
thread sends them).
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any

from torch._C._distributed_c10d import TCPStore

from monarch.core import ActorMesh, Future, ProcMesh, ValueMesh, mesh_stopped
from monarch.core.lowlevel import sends_together

from ._commands import Command, Delete, UseStream
from ._errors import RemoteException
from ._freeing import later
from ._host import reachable_host
from ._stream import Stream, get_active_stream
from ._worker import TensorInbox, TensorWorker

BATCH = 512
"""Commands buffered before they are sent without waiting for a fetch or the end of
``activate()``: large enough to amortize a message, small enough to keep workers busy."""

_ATTRIBUTE = "_monarch_tensor_client"


class _Coalescing(threading.local):
    """Per thread: how deep inside ``coalescing()``, the clients holding commands, and
    whether a batch is being pickled."""

    def __init__(self) -> None:
        self.depth = 0
        self.held: dict[MeshClient, None] = {}
        self.sending = False
        """Pickling a batch of commands (no ``Tensor`` may be lent from there)."""


coalesced = _Coalescing()


class MeshClient:
    """Everything the controller knows about the tensors of one proc mesh."""

    def __init__(self, proc_mesh: ProcMesh) -> None:
        self.proc_mesh = proc_mesh
        extent = proc_mesh.extent
        self.labels: list[str] = list(extent.labels)
        self.sizes: list[int] = list(extent.sizes)
        self._ids = itertools.count()
        self._commands: list[Command] = []
        self._freed: deque[int] = deque()
        self._lock = threading.Lock()
        self._sending = threading.RLock()
        """Held from taking a batch to sending it (``flush`` and ``_freeing``'s thread)."""
        self._workers: ActorMesh[TensorWorker] | None = None
        self._inbox: ActorMesh[TensorInbox] | None = None
        self._one: dict[int, ActorMesh[TensorWorker]] = {}
        self._store: TCPStore | None = None
        self._token = uuid.uuid4().hex
        self._transfers = itertools.count()
        self._recording = 0
        """The stream of the last command recorded (the workers' too: they see every batch)."""
        self.actor_calls = False
        """An ``rref`` (a worker calling a user's actor) was recorded since the workers last
        said they had run everything (see ``settle_actor_calls``)."""

    def new_id(self) -> int:
        return next(self._ids)

    def record(self, command: Command, stream: Stream | None = None) -> None:
        """Buffer ``command``, for ``stream`` (default: the active one): a change of stream
        between two commands is a ``UseStream`` command (none in a program of one stream)."""
        sid = (stream or get_active_stream()).sid
        with self._lock:
            if sid != self._recording:
                self._commands.append(UseStream(sid))
                self._recording = sid
            self._commands.append(command)
            full = len(self._commands) >= BATCH
        if full and not coalesced.depth:
            self.flush()

    def free(self, ref: int) -> None:
        """Called when a controller Tensor dies (any thread, GC included): never blocks."""
        self._freed.append(ref)

    def flush(self, *, now: bool = False, freed: bool = False) -> None:
        """Send what is buffered, as one message to every worker, with the ids freed so far;
        inside ``coalescing()`` only when something waits for the workers (``now``: a fetch,
        a send to another mesh, a shard lent to an actor), else at its end. Freed ids alone
        wait for the next batch, or ``_freeing``'s thread (``freed``: sent at once)."""
        if coalesced.depth and not now:
            coalesced.held[self] = None
            return
        with self._sending:
            with self._lock:
                commands, self._commands = self._commands, []
            if commands or freed:
                self._send(commands)
            elif self._freed:
                later.schedule(self)

    def send_freed(self) -> None:
        """The freed ids alone (``_freeing``'s thread), unless commands are buffered: their
        batch carries them once it is sent, after the commands that may still read them."""
        with self._sending:
            with self._lock:
                if self._commands:
                    return
            workers = self._workers
            if workers is None or mesh_stopped(workers) is not None:
                self._freed.clear()  # no worker holds them (the core's stopped mesh would
                return  # log the dropped cast)
            self._send([])

    def _send(self, commands: list[Command]) -> None:
        """One batch to every worker: ``commands``, then the deletion of the freed ids
        (after every command that read them). The caller holds ``_sending``, so batches
        leave in the order their commands were taken."""
        freed = []
        while self._freed:
            freed.append(self._freed.popleft())
        if freed:
            commands.append(Delete(tuple(freed)))
        if commands:
            coalesced.sending = True  # a monarch Tensor met here is no actor's argument
            try:
                self.workers().run.broadcast(commands)
            finally:
                coalesced.sending = False

    def workers(self) -> ActorMesh[TensorWorker]:
        if self._workers is None:
            self._workers = self.proc_mesh.spawn("tensor_engine", TensorWorker)
        return self._workers

    def inbox(self) -> ActorMesh[TensorInbox]:
        """Where other meshes' workers send this mesh's workers values (``to_mesh``)."""
        if self._inbox is None:
            self._inbox = self.proc_mesh.spawn("tensor_inbox", TensorInbox)
        return self._inbox

    def transfer_key(self) -> str:
        """A key no other transfer of any controller uses."""
        return f"{self._token}/{next(self._transfers)}"

    def rank_of(self, coords: Mapping[str, object]) -> int:
        """The row-major rank of ``coords`` (missing dimensions are 0)."""
        unknown = set(coords) - set(self.labels)
        if unknown:
            raise ValueError(
                f"unknown mesh dimensions {sorted(unknown)}; the mesh has {self.labels}"
            )
        rank = 0
        for label, size in zip(self.labels, self.sizes, strict=True):
            c = coords.get(label, 0)
            if not isinstance(c, int) or not 0 <= c < size:
                raise IndexError(f"{label}={c!r} is out of range for a dimension of size {size}")
            rank = rank * size + c
        return rank

    def fetch(self, ids: list[int], rank: int) -> Future[list[Any]]:
        """The values of ``ids`` on ``rank``: a call to that rank's worker alone, which the
        core delivers after every batch sent before it (one sender, one actor: in order).
        The batch and the fetch leave together: the fetched worker reads both at once."""

        def pick(value: Any) -> list[Any]:
            if isinstance(value, RemoteException):
                raise value
            assert isinstance(value, list)
            return value

        with sends_together():
            self.flush(now=True)
            future: Future[list[Any]] = self.worker(rank).fetch.call_one(ids, rank).then(pick)
        return future

    def fetch_all(self, ids: list[int]) -> Future[ValueMesh[list[Any]]]:
        """The values of ``ids`` on every rank (a gathered call on all the workers)."""
        self.flush(now=True)

        def check(values: ValueMesh[Any]) -> ValueMesh[list[Any]]:
            for value in values.values():
                if isinstance(value, RemoteException):
                    raise value
            return values

        future: Future[ValueMesh[list[Any]]] = self.workers().fetch.call(ids, -1).then(check)
        return future

    def settle_actor_calls(self, timeout: float) -> None:
        """Wait for the workers to finish the ``rref`` calls recorded so far. A user's call to
        an actor that lends it a shard must reach it after them: the actor, waiting for the
        shard, would otherwise hold up the worker's call to it, which the shard is behind."""
        if self.actor_calls:
            self.fetch_all([]).get(timeout=timeout)
            self.actor_calls = False

    def worker(self, rank: int) -> ActorMesh[TensorWorker]:
        """The worker of ``rank`` alone (kept: slicing a mesh costs more than a fetch)."""
        one = self._one.get(rank)
        if one is None:
            coords = {}
            for label, size in zip(reversed(self.labels), reversed(self.sizes), strict=True):
                rank, coords[label] = divmod(rank, size)
            one = self._one[self.rank_of(coords)] = self.workers().slice(**coords)
        return one

    def store(self) -> tuple[str, int]:
        """Where the workers meet to form their gloo process group: a TCPStore that this
        controller serves (the workers reach the controller already)."""
        if self._store is None:
            self._store = TCPStore("0.0.0.0", 0, None, is_master=True, wait_for_workers=False)
        return (reachable_host(), int(self._store.port))


def client_for(proc_mesh: ProcMesh) -> MeshClient:
    """The one client of ``proc_mesh`` (made on first use, kept on the mesh object)."""
    client = proc_mesh.__dict__.get(_ATTRIBUTE)
    if client is None:
        client = MeshClient(proc_mesh)
        proc_mesh.__dict__[_ATTRIBUTE] = client
    assert isinstance(client, MeshClient)
    return client
