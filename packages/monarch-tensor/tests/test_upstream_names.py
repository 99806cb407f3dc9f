"""Upstream's other top-level names: ``OpaqueRef``, ``grad_generator``, ``grad_function``,
``timer``, ``builtins``, ``set_meta``, and those of parts this project does not have
(``Simulator``, ``world_mesh``, ``Pipe``), which say why."""

from __future__ import annotations

import logging

import programs
import pytest
import torch

import monarch
from monarch.actor import ProcMesh
from monarch.tensor import inspect, rank_tensor, remote


def test_an_opaque_ref_keeps_an_object_on_each_worker(procs: ProcMesh) -> None:
    make = remote(programs.make_linear)
    apply = remote(programs.apply_linear)
    scale = remote(programs.scale_linear_, propagate="inspect")
    with procs.activate():
        ref = make(5)
        assert isinstance(ref, monarch.OpaqueRef)
        x = torch.ones(4, 3)
        before = apply(ref, x)
        scale(ref, 0.0)  # changes the worker's object itself
        after = apply(ref, x)
    torch.manual_seed(5)
    local = torch.nn.Linear(3, 2)
    expected = local(torch.ones(4, 3)).detach()
    assert torch.allclose(inspect(before, gpus=1), expected)
    assert torch.allclose(inspect(after, gpus=0), local.bias.detach().expand(4, 2))
    with pytest.raises(RuntimeError, match="only a remote function"):
        ref.value
    with pytest.raises(RuntimeError, match="only a remote function"):
        monarch.OpaqueRef(local)


def test_grad_generator_gives_the_gradients_in_order(procs: ProcMesh) -> None:
    def program() -> tuple[torch.Tensor, ...]:
        w1 = torch.arange(6.0).reshape(3, 2).requires_grad_()
        w2 = torch.full((2,), 0.5, requires_grad=True)
        unused = torch.ones(2, requires_grad=True)
        loss = ((torch.ones(4, 3) @ w1) * w2).pow(2).sum()
        return loss, w2, unused, w1

    loss, *wrt = program()
    expected = torch.autograd.grad([loss], wrt, allow_unused=True, retain_graph=True)
    local = list(monarch.grad_generator(loss, wrt))
    assert local[1] is None
    assert all(torch.equal(a, b) for a, b in zip(local[::2], expected[::2], strict=True))
    with procs.activate():
        loss, *wrt = program()
        grads = monarch.grad_generator(loss, wrt, [torch.tensor(1.0)])
        g2 = next(grads)
        rest = list(grads)
    assert rest[0] is None
    assert torch.equal(inspect(g2, gpus=1), expected[0])
    assert torch.equal(inspect(rest[1], gpus=0), expected[2])


def test_grad_function_backward_is_its_own(procs: ProcMesh) -> None:
    square = monarch.grad_function(programs.square_with_own_backward)
    x = torch.arange(3.0, requires_grad=True)
    square(x).sum().backward()
    assert x.grad is not None and torch.equal(x.grad, 4 * torch.arange(3.0))
    with procs.activate():
        x = torch.arange(3.0).requires_grad_()
        y = square(x)
        y.sum().backward()
        grad = x.grad
    assert torch.equal(inspect(y, gpus=1), torch.arange(3.0) ** 2)
    assert torch.equal(inspect(grad, gpus=1), 4 * torch.arange(3.0))


def test_the_timer_measures_on_the_workers(procs: ProcMesh) -> None:
    from monarch.timer import ExecutionTimer
    from monarch.timer import remote_execution_timer as timed

    assert monarch.timer is __import__("monarch.timer").timer
    with ExecutionTimer.time("here", use_cpu=True):
        pass
    assert ExecutionTimer.summary()["here"]["count"] == 1
    with pytest.raises(RuntimeError, match="without a start"):
        ExecutionTimer.stop("never")
    with procs.activate():
        timed.reset()
        t0 = timed.get_time_perfcounter()
        for _ in range(2):
            timed.execution_timer_start("mm")
            torch.rand(64, 64) @ torch.rand(64, 64)
            timed.execution_timer_stop("mm")
        elapsed = timed.get_time_perfcounter() - t0
        mean = timed.get_execution_timer_average_ms("mm")
        latest = timed.get_latest_timer_measurement("mm")
        missing = timed.get_execution_timer_average_ms("nothing")
    assert 0 < float(inspect(mean, gpus=1)) <= float(inspect(elapsed, gpus=1)) * 1000
    assert float(inspect(latest, gpus=0)) > 0
    with pytest.raises(monarch.RemoteException, match="no measurement of 'nothing'"):
        inspect(missing)


def test_a_remote_function_by_its_path_and_the_resolvers(procs: ProcMesh) -> None:
    add = remote("torch.add")
    now = remote(
        "monarch.timer.remote_execution_timer.get_time_perfcounter",  # upstream's example's
        propagate=lambda: torch.tensor(0.0, dtype=torch.float64),
    )
    monarch.function_resolvers.append(lambda name: torch.mul if name == "times" else None)
    try:
        times = remote("times")
    finally:
        monarch.function_resolvers.pop()
    with procs.activate():
        total = add(torch.ones(2), rank_tensor("gpus"))
        twice = times(total, 2)
        t = now()
    assert torch.equal(inspect(twice, gpus=1), torch.full((2,), 4.0))
    assert float(inspect(t, gpus=0)) > 0
    with pytest.raises(TypeError, match="dotted path"):
        remote("times")


def test_builtins_seed_and_log_on_the_workers(procs: ProcMesh) -> None:
    from monarch.builtins import log_remote, set_logging_level_remote
    from monarch.builtins.random import (
        get_rng_state_remote,
        set_manual_seed_remote,
        set_rng_state_remote,
    )

    assert monarch.builtins.log_remote is log_remote
    torch.manual_seed(11)
    expected_state = torch.get_rng_state()
    expected = torch.rand(3)
    with procs.activate():
        set_logging_level_remote(logging.INFO)
        log_remote("seeding %s", 11, level=logging.INFO)
        set_manual_seed_remote(11)
        state = get_rng_state_remote()
        first = torch.rand(3)
        set_rng_state_remote(state)  # back to just after the seed
        again = torch.rand(3)
    assert torch.equal(inspect(state, gpus=1), expected_state)
    assert torch.equal(inspect(first, gpus=1), expected)
    assert torch.equal(inspect(again, gpus=0), expected)


def test_set_meta_labels_and_changes_nothing() -> None:
    from monarch.tensor._unsupported import current_meta

    with monarch.set_meta("forward"):
        with monarch.set_meta("inner"):
            assert current_meta() == "inner"
        assert current_meta() == "forward"
    assert current_meta() is None


def test_a_pipe_feeds_each_proc_its_generators_values(procs: ProcMesh) -> None:
    from monarch.tensor import create_pipe, remote_generator

    loader = remote(programs.loader, propagate=programs.loader_shapes)
    with procs.activate():
        pipe = create_pipe(loader, 3, max_messages=1)
        first, second = pipe.recv(), pipe.recv()
        assert first["n"] == 0 and first["x"].shape == (3, 2)
        pipe.send(rank_tensor("gpus") + torch.ones(2))
        echoed = pipe.recv()
        assert echoed["x"].shape == (2,)
        with pytest.raises(ValueError, match="propagate generator ended"):
            pipe.recv()  # the controller's generator has no more: refused here
    assert torch.equal(inspect(second["x"], gpus=1), torch.full((3, 2), 11.0))
    assert torch.equal(inspect(first["x"], gpus=0), torch.zeros(3, 2))
    assert torch.equal(inspect(echoed["x"], gpus=1), torch.full((2,), 4.0))

    failing = remote_generator(programs.failing_loader)(programs.one_shape)
    with procs.activate():
        pipe = failing()
        ok, broken, after = pipe.recv(), pipe.recv(), pipe.recv()
        with pytest.raises(TypeError, match=r"monarch\.remote function"):
            monarch.create_pipe(programs.loader, 1)
        with pytest.raises(ValueError, match="references"):
            monarch.create_pipe(loader, torch.ones(1))
    assert torch.equal(inspect(ok), torch.zeros(1))
    for failed in (broken, after):
        with pytest.raises(monarch.RemoteException, match="the loader broke"):
            inspect(failed, gpus=1)
    with pytest.raises(ValueError, match="active device mesh"):
        monarch.create_pipe(loader, 1)


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (lambda: monarch.Simulator(1, 2), "model of CUDA kernels"),
        (lambda: monarch.world_mesh(None, [], 2), "monarch_supervisor"),
        (lambda: monarch.tensor.python_local_mesh(gpus=2), "monarch_supervisor"),
    ],
)
def test_what_is_not_here_says_why(call: object, why: str) -> None:
    with pytest.raises(NotImplementedError, match=why):
        call()  # type: ignore[operator]
