"""Streams and borrows: upstream's rules (a tensor is used on its own stream, another
stream borrows it, for reading or mutably, until ``drop()``); the values are right; the
streams of a worker run at once, ordered only where a borrow says."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import programs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import monarch
from monarch.actor import ProcMesh, as_endpoint
from monarch.tensor import (
    Stream,
    Tensor,
    fetch_shard,
    get_active_stream,
    inspect,
    rank_tensor,
    remote,
)

WAIT = 60.0


def mesh(t: torch.Tensor) -> Tensor:
    assert isinstance(t, Tensor)
    return t


def test_a_tensor_is_used_on_its_own_stream(procs: ProcMesh) -> None:
    comms = Stream("comms")
    assert get_active_stream().name == "main" and monarch.get_active_stream() is get_active_stream()
    with procs.activate():
        t = torch.ones(2)
        with comms.activate():
            assert get_active_stream() is comms
            with pytest.raises(RuntimeError, match="WRONG_STREAM"):
                t + 1
            assert t.shape == (2,) and t.dim() == 1  # metadata is free to read
            own = torch.zeros(2) + 5  # made here: comms's
        with pytest.raises(RuntimeError, match="WRONG_STREAM"):
            own * 2
    assert get_active_stream().name == "main"
    assert torch.equal(inspect(own, gpus=1), torch.full((2,), 5.0))


def test_a_read_borrow_shares_the_value_and_forbids_writes(procs: ProcMesh) -> None:
    comms = Stream("comms")
    with procs.activate():
        t = mesh(torch.arange(3.0) + rank_tensor("gpus"))
        view = t[1:]
        b, borrow = comms.borrow(t)
        with comms.activate():
            doubled = b * 2  # reads the lender's shard itself
            with pytest.raises(RuntimeError, match="borrowed for reading"):
                b.add_(1)
            reduced = b.reduce("gpus")  # a collective on the borrowing stream
        after = t + 0  # the lender may still read
        with pytest.raises(RuntimeError, match="borrowed for reading"):
            view.mul_(2)  # nor write, through a view either
        borrow.drop()
        t.add_(10)  # its own again
        with comms.activate(), pytest.raises(RuntimeError, match=r"after its borrow.drop\(\)"):
            b + 1
    assert torch.equal(inspect(doubled, gpus=1), (torch.arange(3.0) + 1) * 2)
    assert torch.equal(inspect(reduced, gpus=0), torch.arange(3.0) * 2 + 1)
    assert torch.equal(inspect(after, gpus=0), torch.arange(3.0))
    assert torch.equal(inspect(t, gpus=0), torch.arange(3.0) + 10)


def test_a_mutable_borrow_takes_the_tensor_until_dropped(procs: ProcMesh) -> None:
    comms = Stream("comms")
    with procs.activate():
        t = torch.zeros(2)
        with comms.borrow(t, mutable=True)[1] as borrow:
            pass  # a borrow is a context manager too
        b, borrow = comms.borrow(t, mutable=True)
        with comms.activate():
            b.add_(7)  # writes the lender's shard
        with pytest.raises(RuntimeError, match="lent mutably"):
            t + 1
        with pytest.raises(RuntimeError, match="lent mutably"):
            comms.borrow(t)
        borrow.drop()
        u = t * 2
        _, reading = comms.borrow(u)
        with pytest.raises(RuntimeError, match="already being borrowed non-mutably"):
            comms.borrow(u, mutable=True)
        reading.drop()
        comms.borrow(u, mutable=True)[1].drop()  # once the reader is done
    assert torch.equal(inspect(u, gpus=1), torch.full((2,), 14.0))


def test_a_long_op_on_one_stream_does_not_delay_another(procs: ProcMesh, tmp_path: Path) -> None:
    side = Stream("side")
    gate = tmp_path / "gate"
    hold = remote(programs.held_until)
    try:
        with procs.activate():
            held = hold(torch.ones(2), str(gate))  # main runs this until the gate opens
            after = held * 3  # main's: waits for it
            with side.activate():
                quick = mesh(torch.arange(3.0) * 2)
                reduced = quick.reduce("gpus")  # a collective of side's, while main's waits
            value = fetch_shard(quick, gpus=1).result(timeout=WAIT)
            total = fetch_shard(reduced, gpus=0).result(timeout=WAIT)
            assert not fetch_shard(after).done()  # main is still held
    finally:
        gate.touch()
    assert torch.equal(value, torch.arange(3.0) * 2)
    assert torch.equal(total, torch.arange(3.0) * 4)
    assert torch.equal(inspect(after, gpus=1), torch.full((2,), 3.0))


def test_a_borrow_orders_the_streams_around_it(procs: ProcMesh) -> None:
    side = Stream("side")
    slow = remote(programs.slow_copy)
    with procs.activate():
        t = torch.zeros(2)
        b, borrow = side.borrow(t, mutable=True)
        with side.activate():
            slow(b, 0.2)  # side is busy a while before it writes
            b.add_(5)
        borrow.drop()
        after = t + 1  # main waits for side's write
        u = torch.ones(2)
        r, reading = side.borrow(u)
        with side.activate():
            seen = slow(r, 0.2)  # side reads late
        reading.drop()
        u.mul_(10)  # main's write waits for side's read
    assert torch.equal(inspect(after, gpus=1), torch.full((2,), 6.0))
    assert torch.equal(inspect(seen, gpus=1), torch.ones(2))
    assert torch.equal(inspect(u, gpus=0), torch.full((2,), 10.0))


step = st.one_of(
    st.tuples(st.just("main"), st.integers(0, 1), st.integers(1, 3)),
    st.tuples(st.just("main_"), st.integers(0, 1), st.integers(1, 3)),
    st.tuples(st.just("side"), st.integers(0, 1), st.integers(1, 3)),
    st.tuples(st.just("read"), st.integers(0, 1), st.integers(1, 3)),
    st.tuples(st.just("write"), st.integers(0, 1), st.integers(1, 3)),
    st.tuples(st.just("sum"), st.integers(0, 2), st.just(1)),
)


def two_streams(steps: list[tuple[str, int, int]], side: Stream | None) -> list[Any]:
    """A program over tensors of ``main`` (``m``) and of ``side`` (``x``), with borrows
    between them and collectives on both; with ``side`` None, the same program on one
    stream of local tensors (the reference)."""
    slow = remote(programs.slow_copy) if side else programs.slow_copy

    def on_side() -> AbstractContextManager[Any]:
        return side.activate() if side else nullcontext()

    def borrow(t: Any, mutable: bool) -> tuple[Any, Any]:
        if side is None:
            return t, None
        return side.borrow(t, mutable=mutable)

    def summed(t: Any) -> Any:  # over the 2 procs, which hold the same values
        return t.reduce("gpus") if side else t * 2

    m = [torch.arange(2.0), torch.ones(2)]
    with on_side():
        x = torch.zeros(2)
    for kind, i, k in steps:
        if kind == "main":
            m[i] = m[i] * k + 1
        elif kind == "main_":
            m[i].mul_(k)
        elif kind == "side":
            with on_side():
                x = x * k - 1
        elif kind == "sum":  # a collective, on main (m[0], m[1]) or on side (x)
            if i < 2:
                m[i] = summed(m[i])
            else:
                with on_side():
                    x = summed(x)
        elif kind == "read":  # side reads m[i] late, main reads it meanwhile, then writes it
            b, lent = borrow(m[i], mutable=False)
            with on_side():
                x = x + slow(b, 0.01) * k
            m[1 - i] = m[1 - i] + m[i]
            if lent:
                lent.drop()
            m[i].add_(k)
        else:  # side writes m[i] late; main reads it after the drop
            b, lent = borrow(m[i], mutable=True)
            with on_side():
                slow(b, 0.01)
                b.mul_(k)
            if lent:
                lent.drop()
            m[1 - i] = m[1 - i] - m[i]
    return [*m, x]


@settings(max_examples=12, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=6))
def test_two_streams_give_what_one_does(procs: ProcMesh, steps: list[tuple[str, int, int]]) -> None:
    expected = two_streams(steps, None)
    with procs.activate():
        got = two_streams(steps, Stream("side"))
    fetched = fetch_shard(got, gpus=1).result(timeout=WAIT)
    for have, want in zip(fetched, expected, strict=True):
        assert torch.equal(have, want), (steps, fetched, expected)


def test_a_call_lending_a_shard_waits_for_the_rref_calls_before_it(procs: ProcMesh) -> None:
    """Once the workers route streams, a user's call that lends an actor a shard still
    reaches the actor after the workers' ``rref`` calls to it: the actor, waiting for the
    shard, would otherwise hold up the worker's call, which the shard is behind (both
    waiting out ``LENT_WAIT``)."""
    with procs.activate():
        actors = procs.spawn("weighted_streams", programs.Weighted, torch.zeros(4))
        with Stream("lend_after_rref").activate():
            torch.ones(1) + 1  # from here on each worker routes its streams
    for step in range(8):  # the race, run a few times
        with procs.activate():
            y = torch.arange(4.0) * (rank_tensor("gpus") + step)
            r = as_endpoint(actors.scaled, propagate=lambda v: v.clone()).rref(y)
            got = actors.forward.call(y).get(timeout=WAIT)
        for gpu in (0, 1):
            local = torch.arange(4.0) * (gpu + step)
            assert torch.equal(got.item(gpus=gpu), local * 2)
            assert torch.equal(inspect(r, gpus=gpu), local * 3)
