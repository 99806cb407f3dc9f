"""Each worker's GPU environment (``_devices``), as upstream's tensor worker sets it: the
variables every proc of a mesh gets, checked on these CPU procs (the GPU tests in
``test_cuda.py`` check that CUDA then gives each its own device)."""

from __future__ import annotations

import os
import sys

import cloudpickle
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from monarch.actor import this_host
from monarch.core import Extent, Point
from monarch.tensor import inspect, remote
from monarch.tensor._devices import VISIBLE, worker_env

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import it

_NAMES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _env() -> torch.Tensor:
    return torch.tensor([int(os.environ[VISIBLE])] + [int(os.environ[n]) for n in _NAMES])


def test_every_worker_of_a_gpus_mesh_gets_its_local_rank() -> None:
    """The first engine on a proc sets it; a slice's engine, started later, keeps it."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        where = remote(_env, propagate=lambda: torch.empty(5, dtype=torch.int64))
        with procs.activate():
            seen = where()
        with procs.slice(gpus=1).activate():
            again = where()
        for rank in (0, 1):
            assert inspect(seen, gpus=rank).tolist() == [rank, rank, rank, 2, 2]
        assert inspect(again).tolist() == [1, 1, 1, 2, 2]
    finally:
        procs.stop().get(timeout=60)


@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    gpu_dim=st.sampled_from(["gpus", "gpu", None]),
    data=st.data(),
)
def test_the_device_is_the_local_rank_of_the_visible_ones(
    sizes: list[int], gpu_dim: str | None, data: st.DataObject
) -> None:
    labels = [f"d{i}" for i in range(len(sizes))]
    if gpu_dim is not None:
        labels[-1] = gpu_dim
    extent = Extent(labels, sizes)
    rank = data.draw(st.integers(0, extent.nelements - 1))
    point = Point(rank, extent)
    visible = data.draw(st.one_of(st.none(), st.lists(st.sampled_from("01234567"), min_size=1)))
    assume(gpu_dim is not None or visible is not None)  # else the host's /dev/nvidia* decide
    saved = os.environ.get(VISIBLE)
    try:
        if visible is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = ",".join(visible)
        env = worker_env(point, "procs")
    finally:
        if saved is None:
            os.environ.pop(VISIBLE, None)
        else:
            os.environ[VISIBLE] = saved
    local = point[gpu_dim] if gpu_dim else rank % len(visible or [])
    assert env["LOCAL_RANK"] == str(local)
    assert env[VISIBLE] == (visible[local % len(visible)] if visible else str(local))
    assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == str(extent.nelements)
