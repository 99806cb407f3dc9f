"""Procs sharing OS processes (``procs_per_process``): many actors, few messages."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from monarch.actor import (
    Actor,
    Channel,
    MeshFailure,
    ProcMesh,
    SupervisionError,
    current_rank,
    endpoint,
    send,
    this_host,
)
from monarch.config import configured
from monarch.core import current_runtime
from monarch.core.testing import wait_until

HOSTS, PER_HOST, TOGETHER = 2, 6, 4  # 12 procs on this host, in 3 processes of 4
PROCESSES = 3


class Member(Actor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def where(self) -> tuple[int, int, int]:
        return current_rank().rank, os.getpid(), id(self)

    @endpoint
    def constant(self) -> str:
        return "same"

    @endpoint
    def note(self, value: int) -> None:
        self.seen.append(value)

    @endpoint
    def notes(self) -> list[int]:
        return self.seen

    @endpoint
    def fail_on(self, rank: int) -> int:
        if current_rank().rank == rank:
            raise ValueError(f"rank {rank} says no")
        return current_rank().rank


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    with configured(procs_per_process=TOGETHER):
        mesh = this_host().spawn_procs(per_host={"hosts": HOSTS, "gpus": PER_HOST})
    yield mesh
    mesh.stop().get(timeout=30)


def test_each_proc_has_its_own_actor_and_processes_are_shared(procs: ProcMesh) -> None:
    members = procs.spawn("where", Member)
    found = members.where.call().get(timeout=30).values()
    assert [rank for rank, _, _ in found] == list(range(HOSTS * PER_HOST))
    assert len({(pid, actor) for _, pid, actor in found}) == HOSTS * PER_HOST  # forks: ids repeat
    pids = [pid for _, pid, _ in found]
    # Ranks in row-major order fill the processes one after the other.
    assert [pids.index(pid) for pid in pids] == [r // TOGETHER * TOGETHER for r in range(12)]
    assert len(set(pids)) == PROCESSES


def test_a_cast_costs_one_message_per_process(procs: ProcMesh) -> None:
    members = procs.spawn("cast", Member)
    members.notes.call().get(timeout=30)
    runtime = current_runtime()
    before = runtime.posted
    for value in range(3):
        members.note.broadcast(value)
    done = members.notes.call().get(timeout=30)
    assert done.values() == [[0, 1, 2]] * (HOSTS * PER_HOST)
    # Three broadcasts and one call; one message per process each (fewer than the fan-out).
    assert runtime.posted - before == 4 * PROCESSES


def test_identical_replies_are_one_object(procs: ProcMesh) -> None:
    members = procs.spawn("same", Member)
    values = members.constant.call().get(timeout=30).values()
    assert values == ["same"] * (HOSTS * PER_HOST)
    # Replies from one process come back as one batch, each distinct value once.
    assert values[0] is values[3] and values[4] is values[7]


def test_a_slice_reaches_only_its_procs(procs: ProcMesh) -> None:
    members = procs.spawn("slice", Member)
    members.slice(gpus=slice(1, 3)).note.broadcast(7)
    assert members.slice(hosts=1, gpus=2).note.call_one(8).get(timeout=30) is None
    seen = members.notes.call().get(timeout=30).values()
    expected: list[list[int]] = [[] for _ in range(HOSTS * PER_HOST)]
    for rank in (1, 2, PER_HOST + 1, PER_HOST + 2):
        expected[rank].append(7)
    expected[PER_HOST + 2].append(8)
    assert seen == expected


def test_an_error_from_one_rank_fails_the_call(procs: ProcMesh) -> None:
    members = procs.spawn("errors", Member)
    with pytest.raises(Exception, match="rank 5 says no"):
        members.fail_on.call(5).get(timeout=30)
    streamed = [f.get(timeout=30) for f in members.slice(gpus=0).fail_on.stream(99)]
    assert sorted(streamed) == [0, 1]  # ranks within the slice


def test_explicit_ports_get_every_value(procs: ProcMesh) -> None:
    members = procs.spawn("ports", Member)
    port, receiver = Channel[Any].open()
    send(members.where, (), {}, port=port)
    ranks = sorted(receiver.recv().get(timeout=30)[0] for _ in range(HOSTS * PER_HOST))
    assert ranks == list(range(HOSTS * PER_HOST))


def test_killing_a_process_fails_every_proc_it_hosts(
    unhandled_failures: list[MeshFailure],
) -> None:
    with configured(procs_per_process=3):
        procs = this_host().spawn_procs(per_host={"gpus": 6})
    members = procs.spawn("victims", Member)
    pids = [pid for _, pid, _ in members.where.call().get(timeout=30).values()]
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(SupervisionError):
        members.slice(gpus=1).where.call_one().get(timeout=30)

    def crashed(prefix: str) -> list[int]:
        failures = [f for f in list(unhandled_failures) if f.mesh_name.startswith(prefix)]
        return sorted(rank for failure in failures for rank in failure.crashed_ranks)

    # The actors' mesh and the proc mesh's logger (upstream's per-proc actor) both fail.
    wait_until(lambda: bool(crashed("victims-") and crashed("logger-")), 30, "failures reported")
    assert crashed("victims-") == [0, 1, 2]
    assert crashed("logger-") == [0, 1, 2]
    survivors = members.slice(gpus=slice(3, 6)).where.call().get(timeout=30).values()
    assert [rank for rank, _, _ in survivors] == [0, 1, 2]
    procs.stop().get(timeout=30)
