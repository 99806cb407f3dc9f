"""Replies gathered up the cast tree (``_runtime._combine``): complete, in rank order, and
failing as flat replies do.

A gathered call to more procs than ``max_cast_fanout`` is relayed down a tree, and each
relay sends its subtree's replies up as one message. These tests compare what the caller
gets through the tree with what it gets from flat replies (a fan-out as large as the mesh:
every proc answers the caller itself), for values, an error and a proc killed mid-call.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tree_members import Member

from monarch.actor import (
    MeshFailure,
    ProcMesh,
    SupervisionError,
    this_host,
)
from monarch.config import configured
from monarch.core import current_runtime
from monarch.core._runtime._messages import PortBatch
from monarch.core.testing import wait_until

PROCS = 64
FANOUT = 4
"""64 procs at a fan-out of 4: the caller, then relays at two levels below it."""


@pytest.fixture(scope="module")
def tree() -> Iterator[ProcMesh]:
    with configured(max_cast_fanout=FANOUT):
        mesh = this_host().spawn_procs(per_host={"hosts": 4, "gpus": PROCS // 4})
        yield mesh
        mesh.stop().get(timeout=60)


def test_a_gathered_call_comes_back_complete_and_in_rank_order(tree: ProcMesh) -> None:
    members = tree.spawn("ranks", Member)
    with configured(max_cast_fanout=FANOUT):
        assert members.rank.call().get(timeout=60).values() == list(range(PROCS))
        sliced = members.slice(gpus=slice(3, 13, 2))
        expected = [h * 16 + g for h in range(4) for g in range(3, 13, 2)]
        assert sliced.rank.call().get(timeout=60).values() == expected


def test_the_caller_reads_one_message_per_subtree(tree: ProcMesh) -> None:
    """The replies reach the caller's port as FANOUT messages, not PROCS."""
    members = tree.spawn("count", Member)
    runtime = current_runtime()
    seen: list[int] = []
    deliver = runtime._deliver

    def counting(envelope: Any, body: Any, payload: Any) -> str:
        if isinstance(body, PortBatch):  # the replies: other ports get no batches
            seen.append(sum(len(ranks) for ranks, _, _ in body.groups))
        return deliver(envelope, body, payload)

    with configured(max_cast_fanout=FANOUT):
        members.rank.call().get(timeout=60)
        runtime._deliver = counting  # type: ignore[method-assign]
        try:
            assert members.rank.call().get(timeout=60).values() == list(range(PROCS))
        finally:
            del runtime._deliver
    assert len(seen) == FANOUT
    assert sum(seen) == PROCS


def _flat_and_tree(run: Callable[[int], str]) -> tuple[str, str]:
    """What ``run`` says at a fan-out of the mesh's size (flat) and at FANOUT."""
    with configured(max_cast_fanout=PROCS):
        flat = run(PROCS)
    with configured(max_cast_fanout=FANOUT):
        through = run(FANOUT)
    return flat, through


def test_an_error_in_one_subtree_fails_the_call_as_flat_replies_do(tree: ProcMesh) -> None:
    members = tree.spawn("errors", Member)

    def run(_: int) -> str:
        with pytest.raises(Exception, match="rank 37 says no") as info:
            members.fail_on.call(37).get(timeout=60)
        return f"{type(info.value).__name__}: {info.value}"

    flat, through = _flat_and_tree(run)
    assert through == flat


def test_a_proc_killed_under_a_relay_fails_the_call_as_flat_replies_do(
    unhandled_failures: list[MeshFailure], tmp_path: Path
) -> None:
    """Proc 21 is a relay two levels down (16 heads 17..31, which it splits 17/21/25/29):
    killed mid-call, its subtree's replies are lost with it, and the caller reports it in
    the same words as when every proc answers it directly."""

    def run(fanout: int) -> str:
        with configured(max_cast_fanout=fanout):
            procs = this_host().spawn_procs(per_host={"gpus": PROCS})
            members = procs.spawn("victims", Member)
            pids = members.pid.call().get(timeout=60).values()
            mark = tmp_path / f"in-{fanout}"
            call = members.hang_on.call(21, str(mark))
            wait_until(mark.exists, 60, "rank 21 in the call")
            os.kill(pids[21], signal.SIGKILL)
            with pytest.raises(SupervisionError) as info:
                call.get(timeout=60)
            procs.stop().get(timeout=60)
        # The address of the dead proc differs from run to run.
        return re.sub(r"unix://@\w+", "<address>", str(info.value))

    flat, through = _flat_and_tree(run)
    assert "Killed(sig=9)" in flat
    assert through == flat


shapes = st.tuples(
    st.integers(0, 3), st.integers(1, 4), st.integers(0, 15), st.integers(1, 16), st.integers(1, 3)
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=shapes, fanout=st.integers(1, 6), modulus=st.integers(1, 70))
def test_gathered_through_any_tree_equals_flat(
    tree: ProcMesh, shape: tuple[int, int, int, int, int], fanout: int, modulus: int
) -> None:
    """For any slice of the mesh (hosts x gpus, with steps) and any fan-out of the caller,
    the values gathered through the tree are the flat ones: each rank's own, in rank order.
    (The relays below split at the fan-out they were spawned with, FANOUT.)"""
    host0, hosts, gpu0, gpus, step = shape
    members = _members(tree)
    sliced = members.slice(
        hosts=slice(host0, min(4, host0 + hosts)), gpus=slice(gpu0, min(16, gpu0 + gpus), step)
    )
    gpu_range = range(gpu0, min(16, gpu0 + gpus), step)
    ranks = [h * 16 + g for h in range(host0, min(4, host0 + hosts)) for g in gpu_range]
    with configured(max_cast_fanout=fanout):
        got = sliced.value.call(modulus).get(timeout=60).values()
    assert got == [(r % modulus, "x" * (r % modulus)) for r in ranks]


_spawned: dict[int, Any] = {}


def _members(tree: ProcMesh) -> Any:
    """One actor mesh for every example (hypothesis calls the test many times)."""
    members = _spawned.get(id(tree))
    if members is None:
        members = _spawned[id(tree)] = tree.spawn("values", Member)
    return members
