"""A worker's collectives: its gloo groups along mesh dimensions, and the reductions.

The groups are the worker's own (``ProcessGroupGloo`` on a prefix of the controller's
``TCPStore``), not torch.distributed's global group: a mesh and its slices may share
processes. Each stream has its own groups: two streams' collectives, met in different orders
by different ranks, would cross in one group.
"""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store

from monarch.core import Point, advise_huge_pages

from ._host import reachable_host

COLLECTIVE_TIMEOUT = timedelta(seconds=120)
"""A peer that never joins a collective fails it (then its outputs are poisoned)."""

Reduction = Literal["sum", "avg", "max", "min", "stack"]

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


class Group:
    """This rank's gloo group along some mesh dimensions: the group, this rank's index in it
    and its size."""

    __slots__ = ("index", "pg", "size")

    def __init__(self, pg: dist.ProcessGroupGloo, index: int, size: int) -> None:
        self.pg = pg
        self.index = index
        self.size = size


class Groups:
    """One worker's groups, per stream and set of mesh dimensions, made at first use."""

    def __init__(self) -> None:
        self._groups: dict[tuple[int, ...], Group] = {}
        self._store: Store | None = None
        self._lock = threading.Lock()

    def get(self, sid: int, dims: tuple[int, ...], store: tuple[str, int], here: Point) -> Group:
        """The group of the ranks that differ from ``here`` only along ``dims``, met at the
        controller's ``store``, for stream ``sid``."""
        key = (sid, *dims)
        group = self._groups.get(key)
        if group is not None:
            return group
        sizes = here.extent.sizes
        with self._lock:  # not around the group: that waits for the peers
            if self._store is None:
                host, port = store
                self._store = dist.TCPStore(  # type: ignore[attr-defined]
                    host,
                    port,
                    here.extent.nelements,
                    is_master=False,
                    timeout=COLLECTIVE_TIMEOUT,
                )
            base = self._store
        coords = [here[label] for label in here.extent.labels]
        ranks = []
        for varied in itertools.product(*(range(sizes[d]) for d in dims)):
            point = list(coords)
            for d, c in zip(dims, varied, strict=True):
                point[d] = c
            ranks.append(_linear(point, sizes))
        ranks.sort()
        kept = ",".join(str(c) for d, c in enumerate(coords) if d not in dims)
        prefix = f"reduce/{sid}/{','.join(map(str, dims))}/{kept}"
        index = ranks.index(here.rank)
        pg = dist.ProcessGroupGloo(
            dist.PrefixStore(prefix, base),  # type: ignore[attr-defined]
            index,
            len(ranks),
            _gloo_options(),
        )
        group = self._groups[key] = Group(pg, index, len(ranks))
        return group


def all_reduce(group: Group, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType) -> None:
    options = dist.AllreduceOptions()
    options.reduceOp = op  # type: ignore[assignment] # torch's stubs: a RedOpType is one
    group.pg.allreduce([tensor], options).wait()  # type: ignore[attr-defined] # not in its stubs


def any_failed(group: Group, failed: bool) -> bool:
    """Whether any rank of ``group`` has a failed input (every rank takes part even with
    one, or its peers would wait forever)."""
    flag = torch.tensor([1 if failed else 0])
    all_reduce(group, flag, dist.ReduceOp.MAX)
    return bool(flag.item())


def collective(
    value: torch.Tensor, group: Group, reduction: Reduction, scatter: bool, inplace: bool
) -> torch.Tensor:
    """``value`` reduced over ``group`` (into a new tensor unless ``inplace``)."""
    if reduction == "stack":
        parts = [torch.empty_like(value) for _ in range(group.size)]
        pg: Any = group.pg  # allgather is not in ProcessGroupGloo's stubs
        pg.allgather([parts], [value.detach().contiguous()]).wait()
        return torch.stack(parts)
    target = value if inplace else _fresh_copy(value.detach())
    with torch.no_grad():
        if not target.is_contiguous():  # gloo reduces contiguous memory: reduce a copy
            dense = target.contiguous()
            all_reduce(group, dense, _OPS[reduction])
            target.copy_(dense)
        else:
            all_reduce(group, target, _OPS[reduction])
        if reduction == "avg":
            if inplace:
                target.div_(group.size)
            else:
                target = target / group.size
    if scatter:
        return target.chunk(group.size)[group.index].clone()
    return target


def _fresh_copy(value: torch.Tensor) -> torch.Tensor:
    """``value.clone()`` into memory advised to use huge pages before it is first touched:
    a large fresh tensor otherwise costs more in page faults than the copy (a reduction's
    output: 3x faster at 128 MiB here)."""
    out = torch.empty_like(value, memory_format=torch.preserve_format)
    if out.device.type == "cpu":  # a GPU's memory is not the process's pages
        advise_huge_pages(out.data_ptr(), out.untyped_storage().nbytes())
    return out.copy_(value)


def _linear(coords: list[int], sizes: list[int]) -> int:
    rank = 0
    for c, s in zip(coords, sizes, strict=True):
        rank = rank * s + c
    return rank


def _gloo_options() -> dist.ProcessGroupGloo._Options:  # type: ignore[name-defined]
    """gloo on this proc's network address: by default gloo listens where the machine's
    name resolves, which peers on other machines may not reach (loopback; no address at all
    in a container or a network namespace): their collectives would wait out the timeout."""
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = COLLECTIVE_TIMEOUT
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=reachable_host())]
    return options
