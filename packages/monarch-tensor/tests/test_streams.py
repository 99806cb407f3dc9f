"""Streams and borrows: upstream's rules (a tensor is used on its own stream, another
stream borrows it, for reading or mutably, until ``drop()``); the values are right."""

from __future__ import annotations

import pytest
import torch

import monarch
from monarch.actor import ProcMesh
from monarch.tensor import Stream, Tensor, get_active_stream, inspect, rank_tensor


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
