"""Supervision: failures reach owners' __supervise__, climb when unhandled, end at the hook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from monarch.actor import (
    Actor,
    MeshFailure,
    SupervisionError,
    endpoint,
    this_host,
)
from monarch.core.testing import alive, wait_until


class Worker(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()

    @endpoint
    def explode(self) -> None:
        raise RuntimeError("worker exploded")

    @endpoint
    def crash(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class Manager(Actor):
    """Owns a worker mesh; restarts it when told the failure is handled."""

    def __init__(self, handle: bool) -> None:
        self.handle = handle
        self.procs = this_host().spawn_procs(per_host={"w": 2})
        self.workers = self.procs.spawn("workers", Worker)
        self.failures: list[str] = []
        self.restarts = 0

    @endpoint
    def worker_pids(self) -> list[int]:
        pids: list[int] = self.workers.ping.call().get().values()
        return pids

    @endpoint
    def break_a_worker(self) -> None:
        self.workers.slice(w=1).explode.broadcast()

    @endpoint
    def seen(self) -> tuple[list[str], int]:
        return self.failures, self.restarts

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(str(failure))
        if self.handle:
            self.workers = self.procs.spawn(f"workers{self.restarts}", Worker)
            self.restarts += 1
        return self.handle


class AsyncManager(Actor):
    def __init__(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"w": 1})
        self.workers = self.procs.spawn("workers", Worker)
        self.failures: list[MeshFailure] = []

    @endpoint
    async def break_a_worker(self) -> None:
        self.workers.explode.broadcast()

    @endpoint
    async def seen(self) -> list[int]:
        return [rank for failure in self.failures for rank in failure.crashed_ranks]

    async def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure)
        return True


def _about(failures: list[MeshFailure], *names: str) -> list[MeshFailure]:
    """The failures of the meshes named (upstream's mesh_name: ``<name>-<uid>``)."""
    return [failure for failure in failures if failure.mesh_name.rpartition("-")[0] in names]


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> Any:
    """The first truthy value of ``condition``, polled until the deadline (hostkit's wait)."""
    last: list[Any] = [None]

    def holds() -> bool:
        last[0] = condition()
        return bool(last[0])

    wait_until(holds, timeout, what)
    return last[0]


def test_unhandled_failure_reaches_the_fault_hook(unhandled_failures: list[MeshFailure]) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn("fragile", Worker)
    workers.slice(gpus=1).explode.broadcast()
    failure = wait_for(
        lambda: _about(unhandled_failures, "fragile")[:1], "the failure at the root"
    )[0]
    assert failure.mesh_name.startswith("fragile-") and failure.crashed_ranks == [1]
    assert "worker exploded" in failure.event
    assert f"MeshFailure(mesh_name={failure.mesh_name}, crashed_ranks=[1]" in str(failure)
    assert workers.slice(gpus=0).ping.call_one().get(timeout=30) > 0  # the rest works
    with pytest.raises(SupervisionError, match="worker exploded"):
        workers.ping.call().get(timeout=30)
    procs.stop().get(timeout=30)


def test_a_supervising_owner_handles_and_restarts(unhandled_failures: list[MeshFailure]) -> None:
    host = this_host().spawn_procs(per_host={"m": 1})
    manager = host.spawn("manager", Manager, True)
    assert len(manager.worker_pids.call_one().get(timeout=30)) == 2
    manager.break_a_worker.call_one().get(timeout=30)
    failures, restarts = wait_for(
        lambda: (seen := manager.seen.call_one().get(timeout=30))[1] and seen, "a restart"
    )
    assert restarts == 1 and "worker exploded" in failures[0]
    assert len(manager.worker_pids.call_one().get(timeout=30)) == 2  # the new mesh works
    assert not _about(unhandled_failures, "manager", "workers")  # handled: not at the root
    host.stop().get(timeout=30)


def test_an_unhandled_failure_climbs_with_its_chain(unhandled_failures: list[MeshFailure]) -> None:
    host = this_host().spawn_procs(per_host={"m": 1})
    manager = host.spawn("strict", Manager, False)
    manager.break_a_worker.call_one().get(timeout=30)
    failure = wait_for(lambda: _about(unhandled_failures, "strict")[:1], "the failure at the root")[
        0
    ]
    assert failure.mesh_name.startswith("strict-")
    assert "did not handle" in failure.event and "worker exploded" in failure.event
    with pytest.raises(SupervisionError, match="worker exploded"):
        manager.seen.call_one().get(timeout=30)
    host.stop().get(timeout=30)


def test_async_supervise(unhandled_failures: list[MeshFailure]) -> None:
    host = this_host().spawn_procs(per_host={"m": 1})
    manager = host.spawn("async-manager", AsyncManager)
    manager.break_a_worker.call_one().get(timeout=30)
    assert wait_for(lambda: manager.seen.call_one().get(timeout=30), "supervise") == [0]
    assert not _about(unhandled_failures, "async-manager", "workers")
    host.stop().get(timeout=30)


def test_a_dead_proc_taints_its_mesh_but_not_other_slices(
    unhandled_failures: list[MeshFailure],
) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn("victims", Worker)
    with pytest.raises(SupervisionError):
        workers.slice(gpus=1).crash.call_one().get(timeout=30)
    failure = wait_for(
        lambda: _about(unhandled_failures, "victims")[:1], "the failure at the root"
    )[0]
    assert failure.mesh_name.startswith("victims-") and failure.crashed_ranks == [1]
    assert workers.slice(gpus=0).ping.call_one().get(timeout=30) > 0
    with pytest.raises(SupervisionError, match="Cannot spawn new actors on mesh with"):
        procs.spawn("more", Worker)
    procs.stop().get(timeout=30)


def test_a_deliberate_stop_is_no_failure(unhandled_failures: list[MeshFailure]) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn("quiet", Worker)
    workers.ping.call().get(timeout=30)
    procs.stop().get(timeout=30)
    probe = this_host().spawn_procs(per_host={"gpus": 1})  # a round trip after the stop
    probe.spawn("probe", Worker).ping.call().get(timeout=30)
    probe.stop().get(timeout=30)
    assert not _about(unhandled_failures, "quiet", "probe")


def test_meshes_die_with_their_owner() -> None:
    host = this_host().spawn_procs(per_host={"m": 1})
    manager = host.spawn("owner", Manager, True)
    pids = manager.worker_pids.call_one().get(timeout=30)
    manager.stop().get(timeout=30)  # stops what it owns first
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    host.stop().get(timeout=30)


def test_the_default_hook_ends_the_client() -> None:
    script = textwrap.dedent(
        """
        import threading
        from monarch.actor import Actor, endpoint, this_host

        class Fragile(Actor):
            @endpoint
            def explode(self):
                raise RuntimeError("nobody handles this")

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        procs.spawn("fragile", Fragile).explode.broadcast()
        threading.Event().wait(60)  # the hook interrupts this
        print("not reached")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90
    )
    # Status 1, as upstream's default hook asks (``sys.exit(1)``); test_client_end.py has more.
    assert done.returncode == 1, done.stderr
    assert "Unhandled monarch error on the root actor" in done.stderr
    assert "nobody handles this" in done.stderr
    assert "not reached" not in done.stdout


def test_a_client_exiting_without_stopping_its_procs_stops_them_gracefully(
    tmp_path: Any,
) -> None:
    """At exit the procs are told to stop (they exit normally, their atexit runs) before
    any that remain are killed; their going away reports no failure."""
    script = textwrap.dedent(
        """
        import atexit, os, sys
        from monarch.actor import Actor, endpoint, this_host

        class Armed(Actor):
            @endpoint
            def arm(self, path):
                def bye():
                    with open(path, "a") as f:
                        f.write(f"{os.getpid()}\\n")
                atexit.register(bye)

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        procs.spawn("armed", Armed).arm.call(sys.argv[1]).get(timeout=30)
        print("exiting")
        """
    )
    path = tmp_path / "exits"
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "exiting\n"
    # The client waits for its procs to exit before it does.
    assert len(path.read_text().split()) == 2
    assert "Traceback" not in done.stderr and "Unhandled" not in done.stderr, done.stderr


def test_supervision_error_lives_where_upstream_has_it() -> None:
    from monarch._rust_bindings.monarch_hyperactor.supervision import (
        MeshFailure as CompatFailure,
    )
    from monarch._rust_bindings.monarch_hyperactor.supervision import (
        SupervisionError as CompatError,
    )

    assert CompatError is SupervisionError and CompatFailure is MeshFailure
    assert issubclass(SupervisionError, RuntimeError)


def test_a_peer_declared_failed_is_cut_off_for_good(
    unhandled_failures: list[MeshFailure],
) -> None:
    """As when a frozen host comes back after its heartbeat deadline: it is not re-admitted."""
    from monarch.core import PeerLost, current_runtime, run_on

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    workers = procs.spawn("declared", Worker)
    pid = workers.ping.call_one().get(timeout=30)
    runtime = current_runtime()
    address = procs._procs.result()[0]  # type: ignore[union-attr]

    async def declare() -> None:
        runtime._peer_failed(address, PeerLost("declared failed by the test"))

    run_on(runtime, declare()).get(timeout=10)
    with pytest.raises(SupervisionError, match="declared failed by the test"):
        workers.ping.call_one().get(timeout=30)
    # Cut off from its parent, the proc stops: no half-alive process remains.
    wait_for(lambda: not alive(pid), f"proc {pid} to exit")
    wait_for(lambda: _about(unhandled_failures, "declared"), "the failure at the root")


class SelfStopping(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()

    @endpoint
    def stop_myself(self) -> str:
        from monarch.actor import context

        context().actor_instance.stop("done with this")
        return "stopping"

    @endpoint
    def abort_myself(self) -> None:
        from monarch.actor import context

        context().actor_instance.abort("gave up")


def test_an_actor_can_stop_or_abort_itself(unhandled_failures: list[MeshFailure]) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    actors = procs.spawn("selfish", SelfStopping)
    assert actors.slice(gpus=0).stop_myself.call_one().get(timeout=30) == "stopping"
    with pytest.raises(SupervisionError, match="done with this"):
        actors.slice(gpus=0).ping.call_one().get(timeout=30)
    actors.slice(gpus=1).abort_myself.call_one().get(timeout=30)
    with pytest.raises(SupervisionError, match="gave up"):
        actors.slice(gpus=1).ping.call_one().get(timeout=30)
    failure = wait_for(lambda: _about(unhandled_failures, "selfish")[:1], "the abort at the root")
    assert failure[0].crashed_ranks == [1] and "gave up" in failure[0].event
    procs.stop().get(timeout=30)


def test_a_call_after_the_reply_to_a_self_stop_is_refused() -> None:
    """The stop is queued before the reply goes out, not later by the proc's loop: the
    next call always finds the actor stopped (repeated: the old race lost about 1 in 10)."""
    for _ in range(16):  # a fresh proc each time: its loop is busy with the spawn still
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        actor = procs.spawn("selfish", SelfStopping).slice(gpus=0)
        assert actor.stop_myself.call_one().get(timeout=30) == "stopping"
        with pytest.raises(SupervisionError, match="done with this"):
            actor.ping.call_one().get(timeout=30)
        procs.stop().get(timeout=30)


def test_the_client_instance_cannot_stop_itself() -> None:
    from monarch.actor import context

    with pytest.raises(RuntimeError, match="shutdown_context"):
        context().actor_instance.stop()
