"""Torch programs inside ``activate()`` run on every proc and give what torch gives locally."""

from __future__ import annotations

import gc
import importlib.machinery
import pickle
import sys
import types
from typing import Any

import programs
import pytest
import torch

import monarch
import monarch.tensor
from monarch.actor import ProcMesh
from monarch.core.testing import wait_until
from monarch.tensor import (
    RemoteException,
    Tensor,
    call_on_shard_and_fetch,
    fetch_shard,
    get_active_mesh,
    inspect,
    no_mesh,
    rank_tensor,
    rank_tensors,
    remote,
)
from monarch.tensor._client import client_for

WAIT = 60.0
"""Seconds a fetch may take under a loaded machine (it is an event, not a timing)."""


def local_program() -> dict[str, torch.Tensor]:
    a = torch.arange(12.0).reshape(3, 4)
    b = torch.ones(4, 2) * 0.5
    c = a @ b
    d = torch.full((3, 4), 2.0)
    d.mul_(a).add_(1)
    e = d[1:, ::2]
    e.sub_(100)  # through a view: d changes too
    f = torch.zeros(3, 4, dtype=torch.int64)
    f[0] = 7
    return {
        "c": c,
        "d": d,
        "e": e,
        "sum": d.sum(),
        "mean0": a.mean(dim=0),
        "max": torch.max(a, dim=1).values,
        "f": f,
        "where": torch.where(a > 5, a, -a),
        "cat": torch.cat([a, a], dim=1),
    }


def test_a_program_runs_on_every_proc_as_it_does_locally(procs: ProcMesh) -> None:
    expected = local_program()
    with procs.activate():
        got = local_program()
    for name, tensor in got.items():
        assert isinstance(tensor, Tensor), name
        assert tensor.shape == expected[name].shape and tensor.dtype == expected[name].dtype
        for rank in (0, 1):
            value = fetch_shard(tensor, gpus=rank).get(timeout=WAIT)
            assert not isinstance(value, Tensor)
            torch.testing.assert_close(value, expected[name], msg=f"{name} on rank {rank}")


def test_shapes_and_errors_are_known_at_the_call_without_waiting(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.zeros(2, 3)
        assert t.shape == (2, 3) and t.dim() == 2 and t.numel() == 6
        described = "monarch.Tensor(shape=(2, 3), dtype=torch.float32, mesh={'gpus': 2})"
        assert str(t) == repr(t) == described
        assert t.dtype == torch.float32 and t.device == torch.device("cpu")
        assert (t @ torch.zeros(3, 5)).shape == (2, 5)
        with pytest.raises(RuntimeError, match="same reduction dim"):
            t @ torch.zeros(2, 5)
        with pytest.raises(RuntimeError):
            t.item()
        # an error raised here sent nothing: the tensor is still good
        u = t + 1
    assert torch.equal(inspect(u), torch.ones(2, 3))


def test_each_proc_holds_its_own_shard(procs: ProcMesh) -> None:
    with procs.activate():
        ranks = rank_tensors()
        assert set(ranks) == {"gpus"}
        t = torch.ones(2) * rank_tensor("gpus") + 10
    assert torch.equal(fetch_shard(t).get(timeout=WAIT), torch.tensor([10.0, 10.0]))
    assert torch.equal(fetch_shard(t, {"gpus": 1}).get(timeout=WAIT), torch.tensor([11.0, 11.0]))
    assert inspect(ranks["gpus"], gpus=1).item() == 1
    with pytest.raises(IndexError):
        fetch_shard(t, gpus=2)
    with pytest.raises(ValueError, match="unknown mesh dimensions"):
        fetch_shard(t, hosts=0)


def test_pytrees_fetch_in_one_call(procs: ProcMesh) -> None:
    with procs.activate():
        a, b = torch.ones(2), torch.zeros(3)
    got = fetch_shard({"a": a, "pair": (b, 5)}, gpus=1).get(timeout=WAIT)
    assert torch.equal(got["a"], torch.ones(2)) and got["pair"][1] == 5
    assert torch.equal(got["pair"][0], torch.zeros(3))


def test_ops_on_mesh_tensors_outside_activate_still_go_to_their_mesh(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.ones(3)
        assert get_active_mesh() is procs
        with no_mesh.activate():
            assert get_active_mesh() is None
            local = torch.ones(3)
            assert not isinstance(local, Tensor)
    assert get_active_mesh() is None
    u = t * 3
    assert isinstance(u, Tensor)
    assert torch.equal(inspect(u, gpus=1), torch.full((3,), 3.0))


def test_local_tensors_are_sent_as_constants(procs: ProcMesh) -> None:
    weights = torch.arange(3.0)
    with procs.activate():
        t = torch.ones(3) + weights
    assert torch.equal(inspect(t), weights + 1)


def test_remote_functions_run_on_every_proc(procs: ProcMesh) -> None:
    scale = remote(programs.scaled)
    halves = remote(programs.split_halves, propagate=programs.split_halves)

    @remote(propagate=lambda t: torch.empty_like(t))
    def negate(t: torch.Tensor) -> torch.Tensor:
        return -t

    with procs.activate():
        t = torch.arange(4.0) + rank_tensor("gpus")
        s = scale(t, 2.0)
        lo, hi = halves(t)
        n = negate(t)
        assert isinstance(s, Tensor) and lo.shape == (2,)
    assert torch.equal(inspect(s, gpus=1), (torch.arange(4.0) + 1) * 2)
    assert torch.equal(inspect(hi, gpus=0), torch.tensor([2.0, 3.0]))
    assert torch.equal(inspect(n, gpus=1), -(torch.arange(4.0) + 1))
    fetched = call_on_shard_and_fetch(scale, t, 3.0, shard={"gpus": 1}).get(timeout=WAIT)
    assert torch.equal(fetched, (torch.arange(4.0) + 1) * 3)


def test_a_result_shaped_by_the_values_comes_from_the_first_procs_run(procs: ProcMesh) -> None:
    """upstream's "cached" propagation: ``fn`` runs on the first proc's shards once per
    signature to say its results' shapes; ours by default too where meta tensors cannot."""
    default = remote(programs.positives)
    cached = remote(programs.positives_and_count, propagate="cached")
    with procs.activate():
        t = torch.tensor([-1.0, 2.0, -3.0, 4.0]) * (rank_tensor("gpus") + 1)
        p = default(t)
        p2 = default(t)  # known to need the values: probed at once, no meta run tried
        q, count = cached(t)
        q2, _ = cached(t)  # the same signature: the shapes remembered
        assert p.shape == (2,) and q.shape == q2.shape == (2,) and count == 2
        with pytest.raises(NotImplementedError):  # other ops still run on meta tensors
            torch.nonzero(t)
    assert torch.equal(inspect(p, gpus=1), torch.tensor([4.0, 8.0]))
    assert torch.equal(inspect(q2, gpus=0), torch.tensor([2.0, 4.0]))
    assert len(cached._probed) == 1
    assert len(default._needs_data) == 1 and len(default._probed) == 1
    assert torch.equal(inspect(p2, gpus=1), torch.tensor([4.0, 8.0]))


def test_a_cached_result_shaped_otherwise_on_another_proc_fails_there(procs: ProcMesh) -> None:
    """The first proc's run says the shapes; a proc whose result differs poisons its own
    result (the controller's tensor would be wrong there), naming both shapes."""
    sized = remote(programs.rank_sized, propagate="cached")
    positives = remote(programs.positives)
    with procs.activate():
        r = sized(torch.zeros(1))
        after = r * 2
        p = positives(torch.tensor([1.0, -1.0]) * (rank_tensor("gpus") * 2 - 1))
        assert r.shape == (1,) and p.shape == (1,)
    assert torch.equal(inspect(after, gpus=0), torch.full((1,), 2.0))
    with pytest.raises(RemoteException, match=r"float32\[2\] here but float32\[1\] on the first"):
        inspect(after, gpus=1)
    assert torch.equal(inspect(p, gpus=1), torch.tensor([1.0]))  # the same shape: fine


def test_inspect_propagation_runs_for_effects_and_returns_nothing(procs: ProcMesh) -> None:
    bump = remote(programs.add_in_place, propagate="inspect")
    with procs.activate():
        t = torch.zeros(2)
        assert bump(t) is None
        u = t * 1
    assert torch.equal(inspect(u, gpus=1), torch.ones(2))
    with pytest.raises(NotImplementedError, match="mocked"):
        remote(programs.scaled, propagate="mocked")
    with pytest.raises(ValueError, match="'cached' or 'inspect'"):
        remote(programs.scaled, propagate="guess")  # type: ignore[call-overload]


def test_metadata_from_the_cache_is_what_torch_gives(procs: ProcMesh) -> None:
    """The second op of a signature takes its results' metadata from a cache: the same
    answers, fresh meta tensors, aliases still aliases, autograd still recorded."""
    double = remote(programs.scaled)
    with procs.activate():
        t = torch.ones(2, 3)
        made = [double(t, 2.0), double(t, 2.0), t + 1, t + 1, t.t(), t.t(), t[1:], t[1:]]
        assert t.contiguous() is t and t.contiguous() is t
        w = torch.ones(3, requires_grad=True)
        losses = [(w * 2).sum(), (w * 2).sum()]
    metas = [u._meta for u in made if isinstance(u, Tensor)]
    assert len(metas) == len(made) and len({id(m) for m in metas}) == len(metas)
    assert all(type(m) is torch.Tensor and m.device.type == "meta" for m in metas)
    assert [tuple(m.shape) for m in metas[4:]] == [(3, 2), (3, 2), (1, 3), (1, 3)]
    assert metas[4].stride() == (1, 3)
    assert all(loss.grad_fn is not None for loss in losses)
    assert torch.equal(inspect(made[1], gpus=1), torch.full((2, 3), 2.0))
    assert torch.equal(inspect(made[7], gpus=1), torch.ones(1, 3))


def test_a_failure_poisons_exactly_its_dependents(procs: ProcMesh) -> None:
    fail = remote(programs.fail_on_rank)
    with procs.activate():
        t = torch.ones(2)
        bad = fail(t, 1)
        worse = bad * 2 + t
        fine = t + 1
    # rank 0 ran it without trouble
    assert torch.equal(inspect(worse, gpus=0), torch.full((2,), 3.0))
    with pytest.raises(RemoteException) as raised:
        inspect(worse, gpus=1)
    assert raised.value.rank == 1
    assert raised.value.op.endswith("fail_on_rank")
    assert "refused on rank 1" in str(raised.value)
    assert torch.equal(inspect(fine, gpus=1), torch.full((2,), 2.0))
    with procs.activate():
        later = t * 5  # independent work after the failure keeps working
        still = worse + 1
    assert torch.equal(inspect(later, gpus=1), torch.full((2,), 5.0))
    with pytest.raises(RemoteException):
        inspect(still, gpus=1)


def test_a_function_the_workers_cannot_import_poisons_only_its_outputs(
    procs: ProcMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "only_on_the_controller"
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=f"/nonexistent/{name}.py")
    module.__file__ = f"/nonexistent/{name}.py"
    exec("def twice(t):\n    return t * 2\n", module.__dict__)
    monkeypatch.setitem(sys.modules, name, module)
    with procs.activate():
        t = torch.ones(2)
        u = remote(module.twice)(t)
        v = t + 1
    with pytest.raises(RemoteException, match=f"No module named '{name}'") as raised:
        inspect(u, gpus=1)
    assert raised.value.op == "twice" and raised.value.rank == 1
    assert torch.equal(inspect(v, gpus=1), torch.full((2,), 2.0))


def test_bad_input_is_a_clear_error(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.ones(2)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(t)
        with pytest.raises(RuntimeError, match="needs an active mesh"), no_mesh.activate():
            rank_tensor("gpus")
        with pytest.raises(ValueError, match="not a dimension"):
            rank_tensor("hosts")
    with pytest.raises(IndexError, match="out of range"):
        fetch_shard(t, gpus="1")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="no active mesh"):
        remote(programs.scaled)(torch.ones(1), 2.0)


def live_ids(procs: ProcMesh) -> set[int]:
    """The ids both workers hold (the same on each), after the batches sent so far."""
    counts = client_for(procs).workers().live_ids.call().get(timeout=WAIT)
    sets = [set(ids) for _, ids in counts.items()]
    assert sets[0] == sets[1]
    return sets[0]


def test_dropped_tensors_are_freed_on_the_workers(procs: ProcMesh) -> None:
    """Freed ids ride with the next batch; with none coming (here: nothing more is recorded),
    they are sent alone a moment later."""
    with procs.activate():
        keep = torch.ones(2)
        temps = [keep + i for i in range(20)]
    ids = {t._ref for t in temps if isinstance(t, Tensor)}
    assert len(ids) == len(temps)
    assert ids <= live_ids(procs)
    del temps
    gc.collect()
    with procs.activate():
        pass  # leaving sends nothing: no batch to carry the deletions
    wait_until(lambda: not ids & live_ids(procs), WAIT, "the dropped tensors' deletion")
    assert isinstance(keep, Tensor) and keep._ref in live_ids(procs)


def test_freed_ids_never_overtake_the_commands_that_read_them(procs: ProcMesh) -> None:
    """A deletion sent on its own (``_freeing``'s thread) while commands are buffered waits
    for them: they may read the freed id."""
    with procs.activate():
        a = torch.arange(4.0)
    inspect(a)
    b = a * 2  # outside activate(): buffered until a fetch
    gone = a._ref if isinstance(a, Tensor) else -1
    del a
    gc.collect()
    client_for(procs).send_freed()  # as the thread would: the buffered op still reads it
    assert gone in live_ids(procs)  # not deleted: the op is not sent yet
    assert torch.equal(inspect(b, gpus=1), torch.arange(4.0) * 2)


def test_top_level_names_are_upstreams() -> None:
    names: dict[str, Any] = {
        "Tensor": Tensor,
        "fetch_shard": fetch_shard,
        "inspect": inspect,
        "remote": remote,
        "no_mesh": no_mesh,
        "get_active_mesh": get_active_mesh,
        "RemoteException": RemoteException,
        "call_on_shard_and_fetch": call_on_shard_and_fetch,
        "show": monarch.tensor.show,
        "reduce": monarch.tensor.reduce,
        "reduce_": monarch.tensor.reduce_,
    }
    for name, value in names.items():
        assert getattr(monarch, name) is value, name
