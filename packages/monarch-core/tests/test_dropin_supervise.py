"""Drop-in ``__supervise__``, as upstream's: one that raises fails the owner, and a later call to it
raises ``SupervisionError`` whose report names the supervise exception, then the failure it
was handling (sync and async owners); an exception from a broadcast reaches it as a MeshFailure.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0 (upstream notices a dead proc by polling: every second here).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from monarch.actor import Actor, MeshFailure, ProcMesh, endpoint, this_host

os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")


class Child(Actor):
    @endpoint
    def die(self) -> None:
        os._exit(3)


class SyncOwner(Actor):
    def __supervise__(self, failure: MeshFailure) -> bool:
        raise ValueError("supervise says no")

    @endpoint
    def start(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.procs.spawn("child", Child).die.broadcast()

    @endpoint
    def ping(self) -> int:
        return 1


class AsyncOwner(Actor):
    async def __supervise__(self, failure: MeshFailure) -> bool:
        raise ValueError("supervise says no")

    @endpoint
    async def start(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.procs.spawn("child", Child).die.broadcast()

    @endpoint
    async def ping(self) -> int:
        return 1


def _failure_of(owner: Any) -> str:
    """The SupervisionError text of the first call to ``owner`` that fails (it hears of its
    child's death asynchronously, so calls succeed until then)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            owner.ping.call_one().get(timeout=60)
        except RuntimeError as error:
            failed: RuntimeError = error
            break
        time.sleep(0.05)  # a poll, not a spin
    else:
        pytest.fail("the owner never failed")
    assert type(failed).__name__ == "SupervisionError"
    return str(failed)


@pytest.mark.parametrize("cls", [SyncOwner, AsyncOwner], ids=["sync", "async"])
def test_a_raising_supervise_fails_the_owner_naming_its_exception(
    cls: type, unhandled_failures: list[MeshFailure]
) -> None:
    procs: ProcMesh = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner: Any = procs.spawn("owner", cls)
        owner.start.call_one().get(timeout=60)
        text = _failure_of(owner)
        actor = f"<root>.<{cls.__module__}.{cls.__qualname__} owner{{'gpus': 0/1}}>"
        assert text.startswith(
            f"Endpoint call owner.ping() failed, The actor {actor} and all its descendants "
            "have failed:\n  ValueError: supervise says no\n"
            "This error occurred while handling another failure:\n  The actor "
        )
        assert text.endswith(
            "and all its descendants have failed:\n"
            "    the process this actor was running on exited with non-zero code 3"
        )
    finally:
        procs.stop().get(timeout=60)


class Raising(Actor):
    @endpoint
    def boom(self) -> None:
        raise ValueError("child boom")


class Handling(Actor):
    def __init__(self) -> None:
        self.failures: list[MeshFailure] = []

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure)
        return True

    @endpoint
    def start(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.procs.spawn("child", Raising).boom.broadcast()

    @endpoint
    def seen(self) -> list[tuple[str, str]]:
        return [(type(f).__name__, f.report()) for f in self.failures]


def test_an_exception_from_a_broadcast_reaches_supervise_as_a_mesh_failure() -> None:
    procs: ProcMesh = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner: Any = procs.spawn("owner", Handling)
        owner.start.call_one().get(timeout=60)
        deadline = time.monotonic() + 60
        while not (seen := owner.seen.call_one().get(timeout=60)):
            assert time.monotonic() < deadline, "__supervise__ was never called"
            time.sleep(0.05)  # a poll: supervision is asynchronous
        kind, report = seen[0]
        assert kind == "MeshFailure"
        owner_name = f"<root>.<{Handling.__module__}.Handling owner{{'gpus': 0/1}}>"
        child = f"{owner_name}.<{Raising.__module__}.Raising child{{'gpus': 0/1}}>"
        assert report.startswith(
            f"The actor {child} and all its descendants have failed:\n"
            "  actor explicitly aborted due to: Traceback (most recent call last):\n"
        )
        assert "ValueError: child boom" in report
        assert owner.seen.call_one().get(timeout=60)  # handled: the owner lives on
    finally:
        procs.stop().get(timeout=60)
