"""Activating a mesh: ``ProcMesh.activate()`` (through the core's entry points, with
``ProcMesh.rank_tensor(s)``), ``no_mesh``, ``get_active_mesh``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from monarch.core import ProcMesh, context, engine_factory_for

from ._active import current_client, pushed
from ._client import client_for
from ._remote import rank_tensor, rank_tensors
from ._tensor import ActiveMode


def activate(proc_mesh: ProcMesh) -> AbstractContextManager[Any]:
    """What ``proc_mesh.activate()`` returns: this engine, or in an actor whose class
    ``patch_tensor_engine`` names, the engine its factory makes of ``proc_mesh``."""
    factory = engine_factory_for(context().actor_instance.class_name)
    if factory is not None:
        mocked: AbstractContextManager[Any] = factory(proc_mesh).activate()
        return mocked
    return activate_engine(proc_mesh)


@contextmanager
def activate_engine(proc_mesh: ProcMesh) -> Iterator[ProcMesh]:
    """Torch operations inside run on ``proc_mesh``. Leaving sends what is still buffered
    (nothing waits for the workers)."""
    client = client_for(proc_mesh)
    try:
        with pushed(client), ActiveMode():
            yield proc_mesh
    finally:
        client.flush()


class _NoMesh:
    """``with no_mesh.activate():`` torch operations are local again (upstream's name)."""

    @contextmanager
    def activate(self) -> Iterator[None]:
        with pushed(None):
            yield

    def __repr__(self) -> str:
        return "no_mesh"


no_mesh = _NoMesh()


def get_active_mesh() -> ProcMesh | None:
    """The mesh of the innermost ``activate()``, or None."""
    client = current_client()
    return None if client is None else client.proc_mesh


def mesh_rank_tensor(proc_mesh: ProcMesh, dim: str | Sequence[str]) -> Any:
    """``proc_mesh.rank_tensor(dim)``: ``rank_tensor`` of that mesh, active or not."""
    with activate_engine(proc_mesh):
        return rank_tensor(dim)


def mesh_rank_tensors(proc_mesh: ProcMesh) -> dict[str, Any]:
    """``proc_mesh.rank_tensors()``."""
    with activate_engine(proc_mesh):
        return rank_tensors()
