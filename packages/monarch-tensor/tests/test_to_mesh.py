"""``slice_mesh``/``to_mesh``: shards move between meshes (other processes, or the same
ones), dimensions matched by name, broadcast along the ones only the destination has."""

from __future__ import annotations

import programs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import monarch
from monarch.actor import ProcMesh
from monarch.tensor import MeshSliceTensor, RemoteException, Tensor, inspect, rank_tensor, remote


def mesh(t: torch.Tensor) -> Tensor:
    assert isinstance(t, Tensor)
    return t


def grid_tensor(grid: ProcMesh) -> Tensor:
    """On the 2x2 grid: every proc holds [10 * hosts + gpus] * 3."""
    with grid.activate():
        return mesh(torch.ones(3) * (10 * rank_tensor("hosts") + rank_tensor("gpus")))


def value(host: int, gpu: int) -> torch.Tensor:
    return torch.ones(3) * (10 * host + gpu)


def test_a_row_of_the_grid_moves_to_another_mesh(grid: ProcMesh, procs: ProcMesh) -> None:
    """Other processes: each shard travels from its grid proc to the procs' proc."""
    t = grid_tensor(grid)
    moved = t.slice_mesh(hosts=1).to_mesh(procs)
    assert moved._client is not t._client
    assert moved.shape == t.shape and moved.dtype == t.dtype
    for gpu in (0, 1):
        assert torch.equal(inspect(moved, gpus=gpu), value(1, gpu))
    with procs.activate():
        doubled = moved * 2  # an ordinary tensor of its new mesh
    assert torch.equal(inspect(doubled, gpus=1), value(1, 1) * 2)


def test_a_dimension_only_the_destination_has_gets_the_same_shard(
    grid: ProcMesh, procs: ProcMesh
) -> None:
    with procs.activate():
        t = mesh(torch.arange(4.0) + 100 * rank_tensor("gpus"))
    spread = t.to_mesh(grid)
    for host in (0, 1):
        for gpu in (0, 1):
            got = inspect(spread, hosts=host, gpus=gpu)
            assert torch.equal(got, torch.arange(4.0) + 100 * gpu)
    one = t.slice_mesh(gpus=1).to_mesh(procs)  # within one mesh: rank 1's shard everywhere
    assert torch.equal(inspect(one, gpus=0), torch.arange(4.0) + 100)


def test_a_moved_shard_is_a_copy(procs: ProcMesh) -> None:
    """Changing the source afterwards (in the same processes) leaves the copy alone."""
    with procs.activate():
        t = mesh(torch.zeros(2, 2) + rank_tensor("gpus"))
        moved = t.slice_mesh(gpus=0).to_mesh(procs)
        t.add_(5)
    assert torch.equal(inspect(moved, gpus=1), torch.zeros(2, 2))
    assert torch.equal(inspect(t, gpus=1), torch.full((2, 2), 6.0))


def test_pytrees_and_the_top_level_names(grid: ProcMesh, procs: ProcMesh) -> None:
    t = grid_tensor(grid)
    sliced = monarch.slice_mesh({"a": t, "b": [t]}, hosts=0, gpus=slice(None))
    assert isinstance(sliced["a"], MeshSliceTensor)
    moved = monarch.to_mesh(sliced, procs)
    assert torch.equal(inspect(moved["b"][0], gpus=1), value(0, 1))
    whole = monarch.to_mesh([t], grid)[0]  # a tensor, not a slice: the mesh's own shape
    assert torch.equal(inspect(whole, hosts=1, gpus=0), value(1, 0))


def test_mismatched_meshes_raise_at_the_call(grid: ProcMesh, procs: ProcMesh) -> None:
    t = grid_tensor(grid)
    with pytest.raises(ValueError, match="does not have dimensions \\['hosts'\\]"):
        t.to_mesh(procs)
    with pytest.raises(ValueError, match="size 2, the source slice 1"):
        t.slice_mesh(hosts=0, gpus=slice(0, 1)).to_mesh(procs)
    with pytest.raises(ValueError, match="unknown mesh dimensions"):
        t.slice_mesh(cpus=0)
    with pytest.raises(IndexError, match="out of range"):
        t.slice_mesh(hosts=2)
    with procs.activate():
        w = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="requires grad"):
        mesh(w).to_mesh(procs)


def test_a_failed_shard_poisons_only_where_it_goes(grid: ProcMesh, procs: ProcMesh) -> None:
    fail = remote(programs.fail_on_rank)
    with procs.activate():
        bad = mesh(fail(torch.ones(2), 1))
    moved = bad.to_mesh(grid)
    with pytest.raises(RemoteException, match="refused on rank 1"):
        inspect(moved, hosts=0, gpus=1)
    assert torch.equal(inspect(moved, hosts=1, gpus=0), torch.ones(2))


picks = st.one_of(
    st.integers(0, 1),
    st.sampled_from([slice(None), slice(0, 1), slice(1, 2), slice(None, None, -1)]),
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(host=picks, gpu=picks, to_procs=st.booleans())
def test_every_destination_shard_is_the_source_shard_at_its_coordinates(
    grid: ProcMesh, procs: ProcMesh, host: int | slice, gpu: int | slice, to_procs: bool
) -> None:
    t = grid_tensor(grid)
    sliced = t.slice_mesh(hosts=host, gpus=gpu)
    kept = {k: v for k, v in sliced.selection.items() if isinstance(v, range)}
    destination = procs if to_procs else grid
    labels = ["gpus"] if to_procs else ["hosts", "gpus"]
    sizes = dict.fromkeys(labels, 2)
    if set(kept) - set(labels) or any(len(r) != sizes[k] for k, r in kept.items()):
        with pytest.raises(ValueError, match="destination mesh"):
            sliced.to_mesh(destination)
        return
    moved = sliced.to_mesh(destination)
    for h in range(2 if not to_procs else 1):
        for g in range(2):
            at = {"gpus": g} if to_procs else {"hosts": h, "gpus": g}
            src = {k: v if isinstance(v, int) else v[at[k]] for k, v in sliced.selection.items()}
            assert torch.equal(inspect(moved, at), value(src["hosts"], src["gpus"])), (at, src)
