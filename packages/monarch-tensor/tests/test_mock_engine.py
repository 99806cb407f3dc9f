"""``patch_tensor_engine``: an actor whose tensor program is written for GPUs runs, and
computes, on CPU procs (upstream's GRPO simulation with the tensor engine); a custom
factory's engine replaces the real one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import programs
import pytest
import torch

from monarch._src.actor.mock import get_tensor_engine_factory, patch_tensor_engine
from monarch.actor import ProcMesh, this_host
from monarch.tensor import no_mesh
from monarch.tensor._simulated import CpuForCuda

WAIT = 120.0


@pytest.fixture(scope="module")
def one_proc() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    yield mesh
    mesh.stop().get(timeout=WAIT)


def local_losses(steps: int) -> list[float]:
    """The same program run here, CUDA read as the CPU."""
    default = torch.get_default_device()
    try:
        with CpuForCuda():
            model, optim = programs.gpu_model()
            return [float(programs.gpu_training_step(model, optim, step)) for step in range(steps)]
    finally:
        torch.set_default_device(default)


def test_a_gpu_program_trains_on_cpu_procs(one_proc: ProcMesh) -> None:
    async def main() -> list[float]:
        trainer = one_proc.spawn("gpu_trainer", programs.GpuTrainer)
        return [await trainer.train_step.call_one() for _ in range(3)]

    with patch_tensor_engine(programs.GpuTrainer):
        assert get_tensor_engine_factory(programs.GpuTrainer) is not None
        losses = asyncio.run(main())
    assert get_tensor_engine_factory(programs.GpuTrainer) is None
    expected = local_losses(3)
    assert losses == pytest.approx(expected, rel=1e-5)
    assert losses[0] != losses[2]  # the optimizer's steps changed the model


class LocalEngine:
    """A custom factory's engine: the tensor program runs in the actor's own process (on
    its CPU)."""

    def __init__(self, proc_mesh: Any) -> None:
        self.proc_mesh = proc_mesh

    @contextmanager
    def activate(self) -> Iterator[None]:
        with no_mesh.activate(), CpuForCuda():
            yield


def test_a_custom_factory_replaces_the_engine(one_proc: ProcMesh) -> None:
    @patch_tensor_engine(programs.GpuTrainer, LocalEngine)
    def spawn_local() -> Any:
        return one_proc.spawn("local_engine_trainer", programs.GpuTrainer)

    with patch_tensor_engine(programs.GpuTrainer):
        on_mesh = one_proc.spawn("mesh_engine_trainer", programs.GpuTrainer)
    local = spawn_local()
    assert on_mesh.made_on_mesh.call_one().get(timeout=WAIT) is True
    assert local.made_on_mesh.call_one().get(timeout=WAIT) is False
