"""Moving tensors between meshes: ``t.slice_mesh(**coords)`` picks the procs whose shards
move, ``.to_mesh(mesh)`` moves them.

Dimensions match by name: each dimension the slice keeps must be in the destination with
the same size; a destination dimension the slice does not have receives the same shard at
every coordinate (a broadcast, e.g. ``t.slice_mesh(gpus=0).to_mesh(mesh)``). Each source
worker sends its shard straight to the inboxes of its destination procs (a message between
procs, no controller in the path); the destination worker waits for it in order with its
other commands. The source's commands are sent at once, so that no destination waits on a
send still buffered here.
"""

from __future__ import annotations

import itertools
from typing import Any, Generic, Protocol, TypeVar

import torch

from monarch.core import ProcMesh

from ._active import pushed
from ._client import MeshClient, client_for
from ._commands import Recv, Send
from ._stream import Tensor as StreamTensor
from ._stream import check_inputs

T = TypeVar("T", bound="Movable")


class Movable(StreamTensor, Protocol):
    """What ``to_mesh`` needs of a monarch Tensor (``_tensor.Tensor``, which uses this
    module): its client, its metadata, and a tensor of the same class on another mesh."""

    @property
    def _client(self) -> MeshClient: ...

    @property
    def _meta(self) -> torch.Tensor: ...

    @property
    def _device(self) -> torch.device: ...

    def _wrap(self: T, meta: torch.Tensor, client: MeshClient, *, device: torch.device) -> T: ...


class MeshSliceTensor(Generic[T]):
    """The shards of ``tensor`` on a slice of its mesh: only ``to_mesh`` can use it."""

    def __init__(self, tensor: T, selection: dict[str, int | range]) -> None:
        self.tensor = tensor
        self.selection = selection
        """Per dimension of the tensor's mesh: the one coordinate kept, or a range."""

    def __repr__(self) -> str:
        picked = {
            k: v if isinstance(v, int) else f"{v.start}:{v.stop}:{v.step}"
            for k, v in self.selection.items()
        }
        return f"MeshSliceTensor({self.tensor!r}, {picked})"

    def to_mesh(self, mesh: ProcMesh) -> T:
        """A new tensor of ``mesh`` whose shards are copies of this slice's."""
        source = self.tensor._client
        check_inputs("to_mesh", [self.tensor], None)
        destination = client_for(mesh)
        kept = [label for label, pick in self.selection.items() if isinstance(pick, range)]
        missing = [label for label in kept if label not in destination.labels]
        if missing:
            raise ValueError(f"destination mesh does not have dimensions {missing}")
        for label in kept:
            pick = self.selection[label]
            assert isinstance(pick, range)
            size = destination.sizes[destination.labels.index(label)]
            if len(pick) != size:
                raise ValueError(
                    f"dimension {label!r} of the destination mesh has size {size}, "
                    f"the source slice {len(pick)}"
                )
        meta = self.tensor._meta
        if meta.requires_grad:
            raise ValueError(
                "to_mesh of a tensor that requires grad: autograd does not follow it to "
                "another mesh (detach() it first)"
            )
        plan: dict[int, list[dict[str, int]]] = {}
        for coords in itertools.product(*(range(s) for s in destination.sizes)):
            at = dict(zip(destination.labels, coords, strict=True))
            point = {
                label: pick if isinstance(pick, int) else pick[at[label]]
                for label, pick in self.selection.items()
            }
            plan.setdefault(source.rank_of(point), []).append(at)
        with pushed(None):
            result = torch.empty(meta.shape, dtype=meta.dtype, device="meta")
        out = self.tensor._wrap(result, destination, device=self.tensor._device)
        key = destination.transfer_key()
        source.record(Send(self.tensor._ref, key, plan, destination.inbox()))
        source.flush(now=True)  # no destination may wait on a send still held here
        destination.record(Recv(out._ref, key))
        return out


def select(client: MeshClient, coords: dict[str, Any]) -> dict[str, int | range]:
    """Each dimension of ``client``'s mesh as ``slice_mesh(**coords)`` leaves it."""
    unknown = sorted(set(coords) - set(client.labels))
    if unknown:
        raise ValueError(f"unknown mesh dimensions {unknown}; the mesh has {client.labels}")
    out: dict[str, int | range] = {}
    for label, size in zip(client.labels, client.sizes, strict=True):
        pick = coords.get(label, slice(None))
        if isinstance(pick, slice):
            picked = range(size)[pick]
            if not picked:
                raise IndexError(f"{label}={pick} selects no coordinate of a dimension of {size}")
            out[label] = picked
        elif isinstance(pick, int) and not isinstance(pick, bool):
            if not -size <= pick < size:
                raise IndexError(f"{label}={pick} is out of range for a dimension of size {size}")
            out[label] = pick % size
        else:
            raise TypeError(f"{label}={pick!r}: an int or a slice")
    return out
