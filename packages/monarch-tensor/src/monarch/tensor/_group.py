"""``RemoteProcessGroup``: a process group of the workers, for a remote function.

A remote function given one (``process_group("gpus")``) gets, on each worker, that worker's
gloo group along those mesh dimensions (the ranks that differ from it only there: the same
groups ``reduce`` uses), so it can run torch.distributed collectives itself
(``dist.all_reduce(t, group=pg)``). The group is formed by the workers at its first use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch._C._distributed_c10d import FakeProcessGroup

from ._active import current_client
from ._client import MeshClient, client_for
from ._commands import GroupRef


class RemoteProcessGroup:
    """The controller's view of a process group of a mesh's workers (upstream's)."""

    def __init__(self, dims: tuple[str, ...], client: MeshClient) -> None:
        unknown = [d for d in dims if d not in client.labels]
        if unknown or not dims:
            raise ValueError(
                f"a process group over {dims!r}: the mesh has dimensions {client.labels}"
            )
        self.dims = dims
        self._client = client
        self._axes = tuple(sorted({client.labels.index(d) for d in dims}))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """In a command: the worker's own group (see the module)."""
        return (GroupRef, (self._axes, self._client.store()))

    def fake(self) -> Any:
        """A stand-in for running the function on meta tensors: its collectives do nothing."""
        return fake_group(0, math.prod(self._client.sizes[a] for a in self._axes))

    def __repr__(self) -> str:
        return f"RemoteProcessGroup(dims={self.dims!r})"


def process_group(dims: str | Sequence[str], mesh: Any = None) -> RemoteProcessGroup:
    """The workers' process group along ``dims`` of ``mesh`` (a ProcMesh; default: the active
    one), to pass to remote functions (upstream's ``DeviceMesh.process_group``)."""
    client = client_for(mesh) if mesh is not None else current_client()
    if client is None:
        raise RuntimeError("process_group needs a mesh: pass one, or use it inside activate()")
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    return RemoteProcessGroup(names, client)


def fake_group(rank: int, size: int) -> Any:
    """torch's process group whose collectives return at once, touching nothing (the
    shapes of a function's results are learned without its peers)."""
    return FakeProcessGroup._create_internal(rank, size)
