"""Activating a mesh: ``ProcMesh.activate()`` (through the core's entry points, with
``ProcMesh.rank_tensor(s)``), ``no_mesh``, ``get_active_mesh``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from monarch.core import ProcMesh

from ._active import current_client, pushed
from ._client import client_for
from ._remote import rank_tensor, rank_tensors
from ._tensor import ActiveMode


@contextmanager
def activate(proc_mesh: ProcMesh) -> Iterator[ProcMesh]:
    """Torch operations inside run on ``proc_mesh``: what ``proc_mesh.activate()`` returns.
    Leaving sends what is still buffered (nothing waits for the workers)."""
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
    with activate(proc_mesh):
        return rank_tensor(dim)


def mesh_rank_tensors(proc_mesh: ProcMesh) -> dict[str, Any]:
    """``proc_mesh.rank_tensors()``."""
    with activate(proc_mesh):
        return rank_tensors()
