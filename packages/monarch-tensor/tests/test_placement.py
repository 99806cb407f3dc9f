"""What the controller knows of a monarch Tensor's device (``_placement``): ``t.device``,
``.cpu()``/``.cuda()``/``.to(...)`` as torch's, without a GPU here (a tensor placed on CUDA
is only recorded: the CPU workers fail it at the fetch, as they would any CUDA op)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.actor import ProcMesh
from monarch.tensor import RemoteException, Tensor, inspect
from monarch.tensor._placement import as_move, device_of

CPU = torch.device("cpu")
GPU = torch.device("cuda", 0)


def test_a_cpu_tensor_says_cpu_and_moves_to_the_cpu_are_itself(procs: ProcMesh) -> None:
    with procs.activate():
        x = torch.arange(4.0)
        assert x.device == CPU
        assert not x.is_cuda and x.is_cpu and x.get_device() == -1
        assert x.cpu() is x
        assert x.to("cpu") is x
        assert x.to(x.device) is x
        doubled = x.to(torch.float64) * 2
        same = x.to(CPU, torch.float64)
    assert torch.equal(inspect(doubled), torch.arange(4.0, dtype=torch.float64) * 2)
    assert torch.equal(inspect(same), torch.arange(4.0, dtype=torch.float64))


def test_a_tensor_made_on_cuda_is_placed_there_and_its_results_too(procs: ProcMesh) -> None:
    with procs.activate():
        g = torch.ones(3, device="cuda")
        h = (g * 2).sum()
        back = g.cpu()
        again = back.to(g.device)
        other = torch.zeros(2, device=0)
        kept = torch.ones(2) + 1
    assert isinstance(g, Tensor)
    assert g.device == GPU and g.is_cuda and g.get_device() == 0
    assert h.device == GPU
    assert back.device == CPU and back is not g
    assert again.device == GPU and again is not back
    assert other.device == GPU
    with pytest.raises(RemoteException):  # these workers have no CUDA
        inspect(h)
    assert torch.equal(inspect(kept), torch.full((2,), 2.0))  # nothing else is poisoned


_DEVICES = st.sampled_from(["cpu", "cuda", "cuda:0", 0, CPU, GPU])
_MOVES = st.lists(st.tuples(st.sampled_from(["to", "cpu", "cuda"]), _DEVICES))


@settings(max_examples=200, deadline=None)
@given(start=_DEVICES, moves=_MOVES)
def test_a_move_lands_where_torch_would_put_it(
    start: object, moves: list[tuple[str, object]]
) -> None:
    """The rewritten move names the device torch's move would give, and copies exactly
    when the device changes."""
    here = device_of(start)
    assert here is not None
    meta = torch.empty(2, device="meta")
    for kind, target in moves:
        func = {"to": torch.Tensor.to, "cpu": torch.Tensor.cpu, "cuda": torch.Tensor.cuda}[kind]
        args: tuple[object, ...] = (meta,) if kind == "cpu" else (meta, target)
        if kind == "cuda":
            args = (meta, 0) if target in (0, "cuda", "cuda:0", GPU) else (meta,)
        rewritten = as_move(func, args, {}, here)
        assert rewritten is not None
        new_func, new_args, options = rewritten
        assert new_func is torch.Tensor.to and new_args == (meta,)
        expected = CPU if kind == "cpu" else GPU if kind == "cuda" else device_of(target)
        assert expected is not None
        assert options.get("device", here) == expected
        assert options.get("copy", False) == (expected != here)
        here = expected
