"""A proc that dies fails the fetches of its shards through supervision (never a hang), and
only those."""

from __future__ import annotations

import programs
import pytest
import torch

from monarch.actor import MeshFailure, this_host
from monarch.core import SupervisionError
from monarch.tensor import fetch_shard, remote

WAIT = 60.0


def test_the_worker_starts_while_an_actor_imports_torch() -> None:
    """A fresh proc imports torch for a user's actor on one thread while the tensor worker
    arrives on another: both imports must succeed (a submodule of a half-imported torch
    was a deadlock that failed one of them)."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        makers = procs.spawn("makers", programs.Maker)
        with procs.activate():
            t = torch.ones(3)
        assert torch.equal(fetch_shard(t, gpus=1).get(timeout=WAIT), torch.ones(3))
        made = makers.make.call(2).get(timeout=WAIT)
        assert torch.equal(made.item(gpus=1), torch.arange(2.0))
    finally:
        procs.stop().get(timeout=WAIT)


def test_a_dead_proc_fails_the_fetch(unhandled_failures: list[MeshFailure]) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        crash = remote(programs.exit_on_rank)
        with procs.activate():
            t = torch.ones(2)
            u = crash(t, 1)
        with pytest.raises(SupervisionError):
            fetch_shard(u, gpus=1).get(timeout=WAIT)
        # the living proc's shards still come (a fetch asks its worker alone)
        assert torch.equal(fetch_shard(t, gpus=0).get(timeout=WAIT), torch.ones(2))
        with pytest.raises(SupervisionError):
            fetch_shard(t, gpus=1).get(timeout=WAIT)
    finally:
        procs.stop().get(timeout=WAIT)
