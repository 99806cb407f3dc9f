"""The module paths upstream's docs import (``monarch.fetch``, ``monarch.opaque_module``,
``monarch.profiler``, ...): each works on CPU procs as upstream 0.7.0's does, or raises an
error saying what is missing."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import programs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import ProcMesh
from monarch.tensor import RemoteException, inspect, rank_tensor

PATHS = {
    "monarch.fetch": ["fetch_shard", "inspect", "show"],
    "monarch.tensor_engine": [],
    "monarch.random": ["State", "get_state", "set_state", "make_deterministic", "new_state"],
    "monarch.memory": ["record_memory_history", "dump_memory_snapshot"],
    "monarch.profiler": ["profile", "record_function", "Schedule"],
    "monarch.opaque_module": ["OpaqueModule"],
    "monarch.opaque_object": ["OpaqueObject", "opaque_method"],
    "monarch.parallel": ["PipelineParallelism", "get_parameter_udf"],
    "monarch.cached_remote_function": ["remote_autograd_function", "RemoteAutogradFunction"],
    "monarch._src.actor.mock": ["patch_actor", "patch_tensor_engine"],
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_documented_paths_import(path: str) -> None:
    module = importlib.import_module(path)
    for name in PATHS[path]:
        assert hasattr(module, name), f"{path}.{name}"


def test_fetch_shard_by_its_module_path(procs: ProcMesh) -> None:
    from monarch.fetch import fetch_shard

    with procs.activate():
        t = torch.arange(3.0) * (rank_tensor("gpus") + 1)
        got = fetch_shard(t, gpus=1).get(timeout=60)
    assert torch.equal(got, torch.arange(3.0) * 2)


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.integers(1, 4), values=st.lists(st.integers(-9, 9), min_size=3, max_size=3))
def test_opaque_module_computes_as_the_module_locally(
    procs: ProcMesh, rows: int, values: list[int]
) -> None:
    """Its output, its parameters and their gradients are the local module's; its input is
    not changed."""
    from monarch.opaque_module import OpaqueModule

    x_local = torch.tensor([values] * rows, dtype=torch.float32)
    with procs.activate():
        module = OpaqueModule(programs.make_linear_module)
        x = torch.tensor([values] * rows, dtype=torch.float32)
        y = module(x, propagator=lambda self, x: torch.empty(x.shape[0], 2))
        y.sum().backward()
        weight, bias = module.parameters()
        grad = weight.grad
    local = programs.make_linear_module()
    expected = local(x_local)
    expected.sum().backward()
    for gpu in (0, 1):
        assert torch.allclose(inspect(y, gpus=gpu), expected.detach())
        assert torch.equal(inspect(weight, gpus=gpu), local.weight.detach())
        assert torch.equal(inspect(bias, gpus=gpu), local.bias.detach())
        assert local.weight.grad is not None
        assert torch.equal(inspect(grad, gpus=gpu), local.weight.grad)
        assert torch.equal(inspect(x, gpus=gpu), x_local)


def test_opaque_module_methods_without_gradients(procs: ProcMesh) -> None:
    from monarch.opaque_module import OpaqueModule

    with procs.activate(), torch.no_grad():
        module = OpaqueModule(programs.make_linear_module)
        y = module.call_method("__call__", lambda self, x: torch.empty(2, 2), torch.ones(2, 3))
    assert torch.allclose(inspect(y), programs.make_linear_module()(torch.ones(2, 3)).detach())


def test_an_opaque_object_keeps_its_state_on_each_proc(procs: ProcMesh) -> None:
    from monarch.opaque_object import OpaqueObject, opaque_method

    class Counter(OpaqueObject):
        @opaque_method
        def add(self, t: torch.Tensor) -> torch.Tensor:
            return t.clone()

    with procs.activate():
        counter = Counter(programs.Counter, torch.zeros(2) + rank_tensor("gpus"))
        counter.add(torch.ones(2))
        second = counter.add(torch.ones(2))
    assert torch.equal(inspect(second, gpus=1), torch.full((2,), 3.0))
    assert torch.equal(inspect(second, gpus=0), torch.full((2,), 2.0))
    fetched = counter.call_method_on_shard_and_fetch("add", torch.zeros(2), shard={"gpus": 1})
    assert torch.equal(fetched.get(timeout=60), torch.full((2,), 3.0))


def test_the_profiler_writes_each_procs_trace(procs: ProcMesh, tmp_path: Path) -> None:
    from monarch.profiler import profile, record_function

    cpu = [torch.profiler.ProfilerActivity.CPU]
    with procs.activate():
        with profile(activities=cpu, on_trace_ready=str(tmp_path)), record_function("section"):
            t = torch.ones(64, 64) @ torch.ones(64, 64)
        inspect(t)  # after the profiler's end, in each worker's order: the traces are written
        inspect(t, gpus=1)
    for rank in (0, 1):
        trace = json.loads((tmp_path / f"trace_{rank}.json").read_text())
        names = {event.get("name") for event in trace["traceEvents"]}
        assert "section" in names


def test_random_state_needs_cuda_and_says_so(procs: ProcMesh) -> None:
    import monarch.random

    with procs.activate():
        monarch.random.make_deterministic()
        state = monarch.random.get_state()
        after = torch.ones(2) + 1
    if torch.cuda.is_available():  # pragma: no cover - no GPU in this project's tests
        pytest.skip("the procs have CUDA")
    with pytest.raises(RemoteException, match="CUDA is not available"):
        inspect(state.cpu)
    assert torch.equal(inspect(after), torch.full((2,), 2.0))  # nothing else is poisoned
    torch.use_deterministic_algorithms(False)


def test_memory_snapshots_need_a_directory(procs: ProcMesh) -> None:
    import monarch.memory

    with procs.activate():
        with pytest.raises(ValueError, match="dir_snapshots"):
            monarch.memory.dump_memory_snapshot()
        monarch.memory.record_memory_history()  # fails on CPU procs, there and alone
        after = torch.ones(2) * 3
    assert torch.equal(inspect(after), torch.full((2,), 3.0))


def test_pipeline_parallelism_says_what_is_missing() -> None:
    from monarch.parallel import PipelineParallelism, get_parameter_udf

    with pytest.raises(NotImplementedError, match="pipeline-parallel runtime"):
        PipelineParallelism([], [], None, None)
    with pytest.raises(NotImplementedError, match="to_mesh"):
        get_parameter_udf()


def test_a_remote_autograd_function_runs_forward_and_backward_on_the_workers(
    procs: ProcMesh,
) -> None:
    from monarch.cached_remote_function import remote_autograd_function

    remote_doubled = remote_autograd_function(programs.Doubled)
    assert remote_autograd_function(remote_doubled) is remote_doubled
    with procs.activate():
        x = (torch.ones(3) * (rank_tensor("gpus") + 1)).requires_grad_(True)
        y = remote_doubled.apply(x)  # type: ignore[no-untyped-call]
        y.sum().backward()
        grad = x.grad
    assert torch.equal(inspect(y, gpus=1), torch.full((3,), 4.0))
    assert torch.equal(inspect(grad, gpus=1), torch.full((3,), 3.0))  # Doubled's backward
    local = torch.ones(3, requires_grad=True)
    local_y = remote_doubled.apply(local)  # type: ignore[no-untyped-call]
    local_y.sum().backward()  # local tensors: Doubled itself
    assert local.grad is not None and torch.equal(local.grad, torch.full((3,), 3.0))


def test_the_tensor_engine_module_is_empty_as_upstreams() -> None:
    import monarch.tensor_engine

    assert monarch.tensor_engine.__all__ == []
    assert os.path.basename(monarch.tensor_engine.__file__ or "") == "__init__.py"
