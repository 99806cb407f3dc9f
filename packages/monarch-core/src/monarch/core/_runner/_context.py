"""The calling context: which actor runs, where it sits, and the message's rank.

``context()`` is upstream's: in an endpoint the running actor's ``Instance`` and the
message's position in the slice it was sent to; on the client (or outside any actor) the
root client's. ``Instance.stop``/``abort``/``kill`` reach the actor's runner through the
registry here, which the runner fills (see ``_runner``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from monarch.core._layout._shape import Extent, Point
from monarch.core._mesh._proc_mesh import ProcMesh, this_proc
from monarch.core._runtime import current_runtime
from monarch.core._runtime._scope import current_context


class ActorControls(Protocol):
    """What ``Instance`` asks of the runner of its actor."""

    def request_stop(self, reason: str) -> None: ...

    def request_abort(self, reason: str) -> None: ...

    def release(self) -> None: ...

    def join(self, timeout: float) -> None: ...


running: dict[str, ActorControls] = {}
"""The actors running in this process by actor id (for ``Instance.stop``/``abort``)."""


@dataclass(frozen=True)
class Instance:
    """The running actor: where it sits in the mesh it was spawned on."""

    rank: Point
    name: str
    class_name: str | None
    """``module.Class`` of the actor (``None`` for the root client), as upstream's."""
    actor_id: str
    """Unique per actor; starts with its mesh's name (``current_actor_name()``)."""
    proc_id: str
    creator: str | None = None
    """The process that spawned this actor (``None`` for the root client)."""
    shown: str = field(default="<root>", compare=False)
    """Its name down the ownership tree, as supervision texts write it and as upstream's
    ``repr`` shows it (``<root>.<module.Class mesh{'gpus': 0/2}>``)."""

    def __repr__(self) -> str:
        return self.shown

    @property
    def proc(self) -> ProcMesh:
        """This actor's own process, as a ProcMesh of one: ``spawn`` on it stays local."""
        return this_proc()

    @property
    def proc_mesh(self) -> ProcMesh:
        return self.proc

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor after the message it is handling (``__cleanup__`` runs)."""
        self._controls().request_stop(reason or "stopped by itself")

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor: its owner is told, later calls raise SupervisionError."""
        self._controls().request_abort(reason or "(no reason provided)")  # upstream's words

    def kill(self, reason: str | None = None) -> None:
        """Like :meth:`abort`: the actor fails without running ``__cleanup__``."""
        self._controls().request_abort(reason or "killed by itself")

    def _controls(self) -> ActorControls:
        controls = running.get(self.actor_id)
        if controls is None:
            raise RuntimeError(
                f"{self.actor_id} is not an actor running in this process (the root client "
                "is stopped with shutdown_context())"
            )
        return controls


@dataclass(frozen=True)
class Context:
    actor_instance: Instance
    message_rank: Point


EMPTY_POINT = Point(0, Extent([], []))


def context() -> Context:
    """The running actor and the message's rank; on the client, the root client context."""
    current: Context | None = current_context.get()
    if current is not None:
        return current
    runtime = current_runtime()
    address = runtime.address
    return Context(Instance(EMPTY_POINT, "root", None, f"client@{address}", address), EMPTY_POINT)


def current_rank() -> Point:
    return context().message_rank


def current_size() -> dict[str, int]:
    return dict(context().message_rank.extent.items())


def current_actor_name() -> str:
    """The running actor's id, as upstream's: unique per actor, starting with the (lower-cased)
    name of its mesh, for logs (``Instance.name`` is the mesh's name as given)."""
    return context().actor_instance.actor_id
