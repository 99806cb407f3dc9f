"""Upstream's error texts where users match them: mixed sync/async endpoints, a stopped
``ProcMesh``, a shut-down ``HostMesh``, constructing a ``Future``, a mesh whose owner died
ungracefully.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0 to show the expectations are upstream's.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import Actor, Future, MeshFailure, context, endpoint, this_host


class Mixed(Actor):
    @endpoint
    def a(self) -> int:
        return 1

    @endpoint
    async def b(self) -> int:
        return 2


class Plain(Actor):
    @endpoint
    def one(self) -> int:
        return 1

    @endpoint
    def abort(self) -> None:
        context().actor_instance.abort()


def test_mixed_endpoints_text() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        with pytest.raises(ValueError, match="mixes both async and sync endpoints") as raised:
            procs.spawn("mixed", Mixed)
        assert str(raised.value) == (
            f"{Mixed} mixes both async and sync endpoints.Synchronous endpoints cannot be "
            "mixed with async endpoints because they can cause the asyncio loop to deadlock "
            "if they wait.sync: ['a'] async: ['b']"
        )
    finally:
        procs.stop().get(timeout=60)


def test_stopped_proc_mesh_text() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    assert procs.spawn("plain", Plain).one.call_one().get(timeout=60) == 1
    procs.stop().get(timeout=60)
    with pytest.raises(RuntimeError, match=r"^`ProcMesh` has already been stopped$"):
        procs.spawn("again", Plain)

    async def enter() -> None:
        async with procs:
            pass

    with pytest.raises(RuntimeError, match=r"^`ProcMesh` has already been stopped$"):
        asyncio.run(enter())


def test_future_construction_text() -> None:
    with pytest.raises(TypeError, match=r"^Future objects are returned by Monarch operations"):
        Future()


_SHUT_DOWN_CLIENT = """if True:
    import asyncio, sys
    from monarch.actor import attach_to_workers

    hosts = attach_to_workers(workers=[sys.argv[1]], ca="trust_all_connections")

    async def use() -> None:
        async with hosts:
            pass

    asyncio.run(use())
    for what, call in (
        ("spawn_procs", lambda: hosts.spawn_procs(per_host={"gpus": 1})),
        ("shutdown", lambda: hosts.shutdown().get(timeout=60)),
    ):
        try:
            call()
            print(what, "no error")
        except RuntimeError as error:
            print(what, str(error))
    sys.stdout.flush()
"""


def _secret_env() -> dict[str, str]:
    try:
        from monarch.core import job_secret  # ours; upstream has no job secret
    except ImportError:
        return {}
    return {"MONARCH_JOB_SECRET": job_secret().hex()}


def test_shut_down_host_mesh_text(tmp_path: Path) -> None:
    path = tmp_path / "worker.sock"
    env = {**os.environ, **_secret_env()}
    code = (
        "from monarch.actor import run_worker_loop_forever; "
        f"run_worker_loop_forever(address='ipc://{path}', ca='trust_all_connections')"
    )
    worker = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 60
        while not path.exists():  # listening
            assert time.monotonic() < deadline, "the worker did not listen"
            time.sleep(0.02)  # a poll, not a spin: the worker starting needs the CPU
        done = subprocess.run(
            [sys.executable, "-c", _SHUT_DOWN_CLIENT, f"ipc://{path}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith(("spawn", "shut"))]
        assert lines == [
            "spawn_procs HostMesh has already been shut down",
            "shutdown HostMesh has already been shut down",
        ], done.stderr
    finally:
        worker.kill()
        worker.wait()


def test_abort_without_a_reason_text(unhandled_failures: list[MeshFailure]) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        actor = procs.spawn("quitter", Plain)
        actor.abort.call_one().get(timeout=60)
        with pytest.raises(RuntimeError) as raised:
            actor.one.call_one().get(timeout=60)
        assert type(raised.value).__name__ == "SupervisionError"
        assert str(raised.value).startswith("Endpoint call quitter.one() failed, The actor ")
        assert str(raised.value).endswith(
            "and all its descendants have failed:\n"
            "  actor explicitly aborted due to: (no reason provided)"
        )
    finally:
        procs.stop().get(timeout=60)


class Child(Actor):
    @endpoint
    def ping(self) -> int:
        return 7

    @endpoint
    def die(self) -> None:
        os._exit(6)


class Owner(Actor):
    @endpoint
    def make(self) -> Any:  # the child mesh (typed ActorMesh[Child] here, Child upstream)
        self.procs = this_host().spawn_procs(per_host={"x": 1})
        self.child = self.procs.spawn("child", Child)
        self.child.ping.call().get(timeout=60)
        return self.child

    @endpoint
    def die(self) -> None:
        os._exit(5)


@pytest.mark.timeout(300)  # upstream's own timeout comes after ~2 minutes
def test_a_mesh_whose_owner_died_ungracefully_cannot_reach_its_controller(
    unhandled_failures: list[MeshFailure],
) -> None:
    """The owner's process exits without stopping what it spawned; once a proc of the
    mesh it handed out is lost too, calls to it say the controller cannot be reached
    (upstream: after its own timeout, ~2 min; ours: at once, the child's procs having died
    with their owner)."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = procs.spawn("owner", Owner)
        child = owner.make.call_one().get(timeout=60)
        assert child.ping.call_one().get(timeout=60) == 7
        with pytest.raises(RuntimeError):
            owner.die.call_one().get(timeout=60)
        with pytest.raises((TimeoutError, RuntimeError)):  # upstream: a timeout; ours: below
            child.die.call_one().get(timeout=100)
        with pytest.raises(RuntimeError) as raised:
            child.ping.call_one().get(timeout=100)
        assert type(raised.value).__name__ == "SupervisionError"
        text = str(raised.value)
        assert re.fullmatch(
            r"Endpoint call child\.ping\(\) failed, The actor (\S+.*) and all its descendants "
            r"have failed:\n  timed out reaching controller \1 for mesh child-[0-9A-Za-z]{11}\. "
            r"Assuming controller's proc is dead",
            text,
        ), text
    finally:
        procs.stop().get(timeout=60)
