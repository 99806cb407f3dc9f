"""The tensor engine on GPUs: each proc on its own device, ops and reductions on CUDA
tensors, fetches to the CPU, and the CUDA helpers (``monarch.random``, ``monarch.memory``,
``monarch.timer``). They need a GPU (skipped without one); the project's CI has none."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest
import torch

from monarch.actor import ProcMesh, this_host
from monarch.tensor import fetch_shard, inspect, rank_tensor, remote

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import it


@pytest.fixture(scope="module")
def shared_gpu() -> Iterator[ProcMesh]:
    """Two procs on one GPU: a dimension other than ``gpus`` puts rank r on GPU r % count."""
    mesh = this_host().spawn_procs(per_host={"procs": 2})
    yield mesh
    mesh.stop().get(timeout=60)


def _where() -> torch.Tensor:
    """This proc's view of its GPUs: the visible list, the count, its local rank."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return torch.tensor(
        [int(visible or -1), torch.cuda.device_count(), int(os.environ["LOCAL_RANK"])]
    )


where = remote(_where, propagate=lambda: torch.empty(3, dtype=torch.int64))


def test_each_worker_sees_its_own_gpu_as_device_0(shared_gpu: ProcMesh) -> None:
    count = torch.cuda.device_count()
    with shared_gpu.activate():
        seen = where()
    for rank in (0, 1):
        visible, devices, local = inspect(seen, procs=rank).tolist()
        assert (visible, devices, local) == (rank % count, 1, rank % count)


def test_a_gpus_dimension_names_the_device() -> None:
    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        with mesh.activate():
            seen = where()
            on_gpu = torch.ones(3, device="cuda") * 2
        assert inspect(seen).tolist() == [0, 1, 0]
        assert torch.equal(inspect(on_gpu), torch.full((3,), 2.0))
    finally:
        mesh.stop().get(timeout=60)


def test_cuda_ops_and_a_reduce_give_local_values_fetched_to_the_cpu(
    shared_gpu: ProcMesh,
) -> None:
    with shared_gpu.activate():
        w = torch.ones(16, 8, device="cuda")
        x = torch.arange(16.0, device="cuda") * (rank_tensor("procs") + 1)
        y = (x @ w).relu()
        total = y.reduce("procs", "sum")
        on_cpu = total.cpu() + 1
        back = on_cpu.to(x.device) * 2  # to the GPU again, by a tensor's device
    assert x.device == total.device == back.device == torch.device("cuda", 0)
    assert on_cpu.device == torch.device("cpu")
    shards = [torch.arange(16.0) * (r + 1) @ torch.ones(16, 8) for r in (0, 1)]
    expected = shards[0].relu() + shards[1].relu()
    for rank in (0, 1):
        fetched = fetch_shard(total, procs=rank).get(timeout=60)
        assert fetched.device.type == "cpu"
        torch.testing.assert_close(fetched, expected)
        torch.testing.assert_close(inspect(on_cpu, procs=rank), expected + 1)
        torch.testing.assert_close(inspect(back, procs=rank), (expected + 1) * 2)


def test_random_state_reads_and_restores_the_cuda_generator(shared_gpu: ProcMesh) -> None:
    import monarch.random

    with shared_gpu.activate():
        state = monarch.random.get_state()
        first = torch.rand(4, device="cuda")
        monarch.random.set_state(state)
        again = torch.rand(4, device="cuda")
    assert inspect(state.cuda).numel() == 16
    torch.testing.assert_close(inspect(first), inspect(again))


def test_memory_snapshots_are_written_per_rank(shared_gpu: ProcMesh, tmp_path: Path) -> None:
    import monarch.memory

    with shared_gpu.activate():
        monarch.memory.record_memory_history()
        kept = torch.ones(1 << 20, device="cuda")
        monarch.memory.dump_memory_snapshot(dir_snapshots=str(tmp_path))
        inspect(kept.sum())
        inspect(kept.sum(), procs=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot_0.pickle", "snapshot_1.pickle"]


def test_set_device_with_the_local_rank_is_allowed(shared_gpu: ProcMesh) -> None:
    def _set() -> torch.Tensor:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        return torch.ones(1, device="cuda").cpu()

    with shared_gpu.activate():
        done = remote(_set, propagate=lambda: torch.empty(1))()
    assert inspect(done).tolist() == [1.0]
