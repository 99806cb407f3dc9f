"""Upstream's names for the tensor engine: ``ProcMesh.rank_tensor(s)``,
``monarch.mesh_controller.RemoteException``, the top-level ``monarch.*`` functions."""

from __future__ import annotations

import programs
import pytest
import torch

import monarch
import monarch.mesh_controller
import monarch.tensor
from monarch.actor import ProcMesh
from monarch.tensor import Tensor, inspect, rank_tensor, remote


def test_a_proc_mesh_makes_its_rank_tensors_active_or_not(procs: ProcMesh, grid: ProcMesh) -> None:
    r = procs.rank_tensor("gpus")
    assert isinstance(r, Tensor) and r.dtype == torch.int64 and r.shape == ()
    assert [int(inspect(r, gpus=g)) for g in (0, 1)] == [0, 1]
    ranks = grid.rank_tensors()
    assert sorted(ranks) == ["gpus", "hosts"]
    assert int(inspect(ranks["hosts"], hosts=1, gpus=0)) == 1
    with procs.activate():  # another mesh active: the tensor is still grid's
        flat = grid.rank_tensor(("hosts", "gpus"))
    assert [int(inspect(flat, hosts=h, gpus=g)) for h in (0, 1) for g in (0, 1)] == [0, 1, 2, 3]
    with grid.activate():
        backwards = rank_tensor(["gpus", "hosts"])
    assert int(inspect(backwards, hosts=1, gpus=0)) == 1
    with pytest.raises(ValueError, match="not a dimension"):
        procs.rank_tensor("hosts")


def test_mesh_controller_remote_exception_is_the_one_raised(procs: ProcMesh) -> None:
    assert monarch.mesh_controller.RemoteException is monarch.RemoteException
    fail = remote(programs.fail_on_rank)
    with procs.activate():
        bad = fail(torch.ones(1), 0)
    with pytest.raises(monarch.mesh_controller.RemoteException, match="refused on rank 0"):
        inspect(bad)


def test_the_top_level_names_are_the_engines() -> None:
    names = ("to_mesh", "slice_mesh", "coalescing", "reduce", "fetch_shard", "Tensor", "Stream")
    for name in (*names, "get_active_stream"):
        assert getattr(monarch, name) is getattr(monarch.tensor, name), name
