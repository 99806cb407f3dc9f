"""``reduce``/``reduce_`` between the procs of a mesh, over gloo on CPU."""

from __future__ import annotations

import programs
import pytest
import torch

from monarch.actor import ProcMesh
from monarch.tensor import (
    RemoteException,
    Tensor,
    inspect,
    process_group,
    rank_tensor,
    reduce,
    remote,
)

WAIT = 60.0


def mesh(t: torch.Tensor) -> Tensor:
    """``t`` as the monarch Tensor it is (torch's annotations say torch.Tensor)."""
    assert isinstance(t, Tensor)
    return t


def shard(rank: int) -> torch.Tensor:
    """What rank ``rank`` holds in these tests: (rank + 1) * [0, 1, 2, 3]."""
    return torch.arange(4.0) * (rank + 1)


@pytest.mark.parametrize(
    ("reduction", "combine"),
    [
        ("sum", lambda a, b: a + b),
        ("avg", lambda a, b: (a + b) / 2),
        ("max", torch.maximum),
        ("min", torch.minimum),
        ("stack", lambda a, b: torch.stack([a, b])),
    ],
)
def test_reduce_over_two_procs(procs: ProcMesh, reduction: str, combine: object) -> None:
    with procs.activate():
        t = mesh(torch.arange(4.0) * (rank_tensor("gpus") + 1))
        r = t.reduce("gpus", reduction)
    expected = combine(shard(0), shard(1))  # type: ignore[operator]
    assert r.shape == expected.shape
    for rank in (0, 1):
        torch.testing.assert_close(inspect(r, gpus=rank), expected)
        torch.testing.assert_close(inspect(t, gpus=rank), shard(rank))  # input unchanged


def test_scatter_gives_each_rank_its_part(procs: ProcMesh) -> None:
    with procs.activate():
        t = mesh(torch.arange(4.0) * (rank_tensor("gpus") + 1))
        r = reduce(t, "gpus", "sum", scatter=True)
    total = shard(0) + shard(1)
    assert r.shape == (2,)
    assert torch.equal(inspect(r, gpus=0), total[:2])
    assert torch.equal(inspect(r, gpus=1), total[2:])


def test_reduce_in_place(procs: ProcMesh) -> None:
    with procs.activate():
        t = mesh(torch.arange(4.0) * (rank_tensor("gpus") + 1))
        view = t[1:]
        same = t.reduce_("gpus", "avg")
        assert same is t
    expected = (shard(0) + shard(1)) / 2
    assert torch.equal(inspect(t, gpus=1), expected)
    assert torch.equal(inspect(view, gpus=0), expected[1:])


def test_reduce_along_one_dimension_of_two(grid: ProcMesh) -> None:
    with grid.activate():
        h, g = rank_tensor("hosts"), rank_tensor("gpus")
        t = mesh(torch.ones(3) * (10 * h + g))
        over_gpus = t.reduce("gpus")
        over_hosts = t.reduce("hosts")
        over_all = t.reduce(("hosts", "gpus"))
    for host in (0, 1):
        for gpu in (0, 1):
            at = {"hosts": host, "gpus": gpu}
            assert torch.equal(inspect(over_gpus, at), torch.full((3,), 20.0 * host + 1))
            assert torch.equal(inspect(over_hosts, at), torch.full((3,), 10.0 + 2 * gpu))
            assert torch.equal(inspect(over_all, at), torch.full((3,), 22.0))


def test_a_slice_of_a_mesh_reduces_among_its_own_procs(grid: ProcMesh) -> None:
    """A slice gets workers and process groups of its own, beside the whole mesh's (the same
    OS processes, which torch.distributed's one global group could not serve)."""
    with grid.activate():
        whole = mesh(torch.ones(2) * (rank_tensor("hosts") * 2 + rank_tensor("gpus"))).reduce(
            ("hosts", "gpus")
        )
    row = grid.slice(hosts=1)
    with row.activate():
        t = mesh(torch.ones(2) * (rank_tensor("gpus") + 5))
        r = t.reduce("gpus", "max")
        non_contiguous = mesh((torch.ones(3, 2) * (rank_tensor("gpus") + 1)).t())
        non_contiguous.reduce_("gpus")
    assert torch.equal(inspect(r, gpus=0), torch.full((2,), 6.0))
    assert torch.equal(inspect(non_contiguous, gpus=1), torch.full((2, 3), 3.0))
    assert torch.equal(inspect(whole, hosts=1, gpus=1), torch.full((2,), 6.0))


def test_a_remote_function_runs_its_own_collective_on_a_process_group(grid: ProcMesh) -> None:
    """``process_group(dims)`` (upstream's ``RemoteProcessGroup``): the function gets its
    worker's gloo group along those dimensions and calls torch.distributed itself."""
    summed = remote(programs.all_summed)  # shapes from a meta run with a group that does nothing
    cached = remote(programs.all_summed, propagate="cached")  # the first proc runs it alone
    with grid.activate():
        t = torch.ones(3) * (rank_tensor("hosts") * 2 + rank_tensor("gpus"))  # ranks 0..3
        along_gpus = process_group("gpus")
        rows = summed(t, along_gpus)
        everything = cached(t, process_group(("hosts", "gpus")))
    assert torch.equal(inspect(rows, hosts=1, gpus=0), torch.full((3,), 2.0 + 3.0))
    assert torch.equal(inspect(rows, hosts=0, gpus=1), torch.full((3,), 0.0 + 1.0))
    assert torch.equal(inspect(everything, hosts=1, gpus=1), torch.full((3,), 6.0))
    with grid.activate():
        sizes = remote(programs.group_size).call(along_gpus).get(timeout=60)
    assert sizes.item(hosts=1, gpus=1) == (1, 2)
    with pytest.raises(ValueError, match="dimensions"):
        process_group("nope", grid)
    assert repr(along_gpus) == "RemoteProcessGroup(dims=('gpus',))"


def test_bad_arguments_raise_at_the_call(procs: ProcMesh) -> None:
    with procs.activate():
        t = mesh(torch.ones(3))
        with pytest.raises(ValueError, match="dimensions"):
            t.reduce("hosts")
        with pytest.raises(ValueError, match="reduction must be"):
            t.reduce("gpus", "median")
        with pytest.raises(ValueError, match="divisible"):
            t.reduce("gpus", scatter=True)
        with pytest.raises(ValueError, match="reduce_"):
            t.reduce_("gpus", scatter=True)
        with pytest.raises(TypeError, match="floating point"):
            mesh(torch.ones(3, dtype=torch.int64)).reduce("gpus", "avg")


def test_a_failed_input_poisons_the_reduction_on_every_rank(procs: ProcMesh) -> None:
    fail = remote(programs.fail_on_rank)
    with procs.activate():
        t = mesh(torch.ones(2))
        r = mesh(fail(t, 1)).reduce("gpus")
        after = mesh(t * 2).reduce("gpus")  # the group is still usable
    with pytest.raises(RemoteException, match="refused on rank 1"):
        inspect(r, gpus=1)
    with pytest.raises(RemoteException, match="reduce"):
        inspect(r, gpus=0)
    assert torch.equal(inspect(after, gpus=0), torch.full((2,), 4.0))
