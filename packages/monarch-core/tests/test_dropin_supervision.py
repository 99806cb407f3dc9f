"""Drop-in failures, as upstream's: the texts of ActorError, SupervisionError and MeshFailure
(users grep logs and match them), an exception through a port, an explicit-port endpoint that
raises, actors that abort.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0 (set ``HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY=1s`` there: upstream
notices a dead proc by polling, every 10 s by default).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from monarch.actor import (
    Actor,
    ActorError,
    Channel,
    MeshFailure,
    Port,
    ProcMesh,
    concurrent_endpoint,
    context,
    endpoint,
    get_or_spawn_controller,
    this_host,
    this_proc,
)

os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")


class Oops(Exception):
    pass


class Faulty(Actor):
    @endpoint
    def ok(self) -> int:
        return os.getpid()

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom")

    @endpoint
    def exit(self, code: int) -> None:
        if context().actor_instance.rank.rank == 0:
            os._exit(code)

    @endpoint
    def kill(self, signum: int) -> None:
        os.kill(os.getpid(), signum)

    @endpoint
    def segfault(self) -> None:
        ctypes.string_at(0)

    @endpoint
    def interrupt(self) -> None:
        raise KeyboardInterrupt("interrupted")

    @endpoint
    def abort(self) -> None:
        os.abort()

    @endpoint(explicit_response_port=True)
    def raise_explicit(self, port: Port[int]) -> None:
        raise Oops("explicit")

    @endpoint(explicit_response_port=True)
    def send_exception(self, port: Port[int]) -> None:
        port.exception(Oops("through the port"))


class AsyncFaulty(Actor):
    @endpoint
    async def ok(self) -> int:
        return os.getpid()

    @endpoint
    async def interrupt(self) -> None:
        raise KeyboardInterrupt("interrupted")

    @endpoint
    async def abort(self) -> None:
        os.abort()

    @endpoint(explicit_response_port=True)
    async def raise_explicit(self, port: Port[int]) -> None:
        raise Oops("explicit")

    @concurrent_endpoint(explicit_response_port=True)
    async def raise_concurrent(self, port: Port[int]) -> None:
        raise Oops("concurrent")


def name_of(cls: type, mesh: str, coords: str, owner: str = "<root>") -> str:
    """Upstream's name of an actor in supervision texts."""
    return f"{owner}.<{cls.__module__}.{cls.__qualname__} {mesh}{coords}>"


def failed(actor: str, reason: str) -> str:
    return f"The actor {actor} and all its descendants have failed:\n  {reason}"


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    yield mesh
    mesh.stop().get(timeout=60)


def wait_for(failures: list[MeshFailure], mesh: str) -> MeshFailure:
    """The failure of the mesh named ``mesh`` that reached the fault hook (upstream's
    mesh_name: the name lower-cased, ``-``, an id of 11 letters and digits)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for failure in list(failures):
            if failure.mesh_name.startswith(f"{mesh}-"):
                assert re.fullmatch(rf"{mesh}-[0-9A-Za-z]{{11}}", failure.mesh_name)
                return failure
        time.sleep(0.05)
    raise AssertionError(f"no failure of {mesh!r} reached the fault hook: {failures}")


def supervision_error(call: Callable[[], Any]) -> Any:
    with pytest.raises(RuntimeError) as info:
        call()
    assert type(info.value).__name__ == "SupervisionError"
    assert isinstance(info.value, RuntimeError)
    return info.value


# -- ActorError -----------------------------------------------------------------------------


def test_an_endpoint_that_raises_gives_upstreams_actor_error(procs: ProcMesh) -> None:
    mesh = procs.spawn("faulty", Faulty)
    with pytest.raises(ActorError) as info:
        mesh.boom.call().get(timeout=60)
    error = info.value
    assert error.message == "Actor call faulty.boom failed."
    assert isinstance(error.exception, ValueError) and str(error.exception) == "boom"
    assert error.exception_formatted.startswith(
        "Traceback of where the remote call failed (most recent call last):\n"
    )
    assert error.exception_formatted.endswith("ValueError: boom\n")
    assert str(error) == f"{error.message}\n {error.exception_formatted}"
    assert mesh.ok.call_one().get(timeout=60) > 0  # the actor lives on


# -- a dead proc ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "fault", "reason"),
    [
        (
            "exit",
            lambda mesh: mesh.exit.call(3),
            "the process this actor was running on exited with non-zero code 3",
        ),
        (
            "kill",
            lambda mesh: mesh.kill.call(signal.SIGKILL),
            "the process this actor was running on failed: Killed(sig=9)",
        ),
        (
            "segfault",
            lambda mesh: mesh.segfault.call(),
            "the process this actor was running on failed: Killed(sig=11)",
        ),
    ],
    ids=["exit", "sigkill", "segfault"],
)
def test_a_dead_proc_is_reported_in_upstreams_words(
    procs: ProcMesh,
    unhandled_failures: list[MeshFailure],
    method: str,
    fault: Callable[[Any], Any],
    reason: str,
) -> None:
    mesh = procs.spawn("Dying_Mesh", Faulty)
    mesh.ok.call().get(timeout=60)
    actor = name_of(Faulty, "Dying_Mesh", "{'gpus': 0/1}")
    error = supervision_error(lambda: fault(mesh).get(timeout=60))
    assert str(error) == f"Endpoint call Dying_Mesh.{method}() failed, " + failed(actor, reason)
    assert error.endpoint == f"Dying_Mesh.{method}()" if hasattr(error, "endpoint") else True
    later = supervision_error(lambda: mesh.ok.call().get(timeout=60))
    assert str(later) == "Endpoint call Dying_Mesh.ok() failed, " + failed(actor, reason)
    failure = wait_for(unhandled_failures, "dying_mesh")
    assert failure.report() == failed(actor, reason)
    assert str(failure) == (
        f"MeshFailure(mesh_name={failure.mesh_name}, crashed_ranks=[0], "
        f"event=Supervision event: actor {actor} failed:\n  {reason})"
    )


def test_a_clean_exit_is_a_stop_not_a_failure(unhandled_failures: list[MeshFailure]) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("quitter", Faulty)
    mesh.ok.call().get(timeout=60)
    error = supervision_error(lambda: mesh.exit.call(0).get(timeout=60))
    actor = name_of(Faulty, "quitter", "{'gpus': 0/2}")
    assert str(error) == (
        "Endpoint call quitter.exit() failed, Supervision event: actor "
        f"{actor} has status:\n  stopped: process exited cleanly"
    )
    assert mesh.slice(gpus=1).ok.call_one().get(timeout=60) > 0
    procs.stop().get(timeout=60)
    assert not [f for f in unhandled_failures if f.mesh_name.startswith("quitter-")]


# -- actors that abort --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [Faulty, AsyncFaulty], ids=["sync", "async"])
def test_a_base_exception_aborts_the_actor_and_reaches_the_fault_hook(
    procs: ProcMesh, unhandled_failures: list[MeshFailure], cls: type
) -> None:
    mesh: Any = procs.spawn("interrupted", cls)
    pid = mesh.ok.call_one().get(timeout=60)
    error = supervision_error(lambda: mesh.interrupt.call_one().get(timeout=60))
    actor = name_of(cls, "interrupted", "{'gpus': 0/1}")
    head = (
        "Endpoint call interrupted.interrupt() failed, The actor "
        f"{actor} and all its descendants have failed:\n"
        "  actor explicitly aborted due to: Traceback (most recent call last):\n"
    )
    assert str(error).startswith(head)
    assert str(error).endswith("  KeyboardInterrupt: interrupted\n")
    report = wait_for(unhandled_failures, "interrupted").report()
    assert report.startswith(f"The actor {actor} and all its descendants have failed:\n")
    assert "KeyboardInterrupt: interrupted" in report
    os.kill(pid, 0)  # the actor failed; its proc lives on


@pytest.mark.parametrize("cls", [Faulty, AsyncFaulty], ids=["sync", "async"])
def test_os_abort_reaches_the_fault_hook_naming_the_actor(
    procs: ProcMesh, unhandled_failures: list[MeshFailure], cls: type
) -> None:
    mesh: Any = procs.spawn("aborting", cls)
    mesh.ok.call_one().get(timeout=60)
    reason = "the process this actor was running on failed: Killed(sig=6)"
    actor = name_of(cls, "aborting", "{'gpus': 0/1}")
    error = supervision_error(lambda: mesh.abort.call_one().get(timeout=60))
    assert str(error) == "Endpoint call aborting.abort() failed, " + failed(actor, reason)
    assert wait_for(unhandled_failures, "aborting").report() == failed(actor, reason)


# -- explicit response ports ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "method", "message"),
    [
        (Faulty, "raise_explicit", "explicit"),
        (AsyncFaulty, "raise_explicit", "explicit"),
        (AsyncFaulty, "raise_concurrent", "concurrent"),
    ],
    ids=["sync", "async", "concurrent"],
)
def test_an_explicit_port_endpoint_that_raises_fails_its_actor(
    procs: ProcMesh, unhandled_failures: list[MeshFailure], cls: type, method: str, message: str
) -> None:
    mesh: Any = procs.spawn("explicit", cls)
    mesh.ok.call_one().get(timeout=60)
    error = supervision_error(lambda: getattr(mesh, method).call_one().get(timeout=60))
    actor = name_of(cls, "explicit", "{'gpus': 0/1}")
    assert str(error).startswith(
        f"Endpoint call explicit.{method}() failed, The actor {actor} and all its "
        "descendants have failed:\n  actor explicitly aborted due to: Traceback"
    )
    assert str(error).endswith(f"  {__name__}.Oops: {message}\n") or str(error).endswith(
        f"  Oops: {message}\n"
    )
    later = supervision_error(lambda: mesh.ok.call_one().get(timeout=60))
    assert str(later).startswith(f"Endpoint call explicit.ok() failed, The actor {actor}")
    wait_for(unhandled_failures, "explicit")


def test_port_exception_raises_that_exception(procs: ProcMesh) -> None:
    port, receiver = Channel[int].open()
    port.exception(Oops("direct"))
    with pytest.raises(Oops, match="direct"):
        receiver.recv().get(timeout=60)
    mesh = procs.spawn("sender", Faulty)
    with pytest.raises(Oops, match="through the port"):
        mesh.send_exception.call_one().get(timeout=60)
    assert mesh.ok.call_one().get(timeout=60) > 0  # the actor lives on


# -- stopped meshes ----------------------------------------------------------------------------


def test_a_call_to_a_stopped_mesh_is_told_so(procs: ProcMesh) -> None:
    mesh = procs.spawn("stopped", Faulty)
    mesh.ok.call_one().get(timeout=60)
    mesh.stop().get(timeout=60)
    error = supervision_error(lambda: mesh.ok.call_one().get(timeout=60))
    assert str(error).startswith("Endpoint call stopped.ok() failed, Supervision event: actor ")
    assert str(error).endswith(
        " has status:\n  stopped: ActorMeshController received explicit stop request"
    )


def test_a_call_to_an_actor_of_a_stopped_proc_mesh_names_it() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("gone", Faulty)
    mesh.ok.call_one().get(timeout=60)
    procs.stop("done with it").get(timeout=60)
    error = supervision_error(lambda: mesh.ok.call_one().get(timeout=60))
    actor = name_of(Faulty, "gone", "{'gpus': 0/1}")
    assert str(error) == (
        f"Endpoint call gone.ok() failed, Supervision event: actor {actor} has status:\n"
        "  stopped: done with it"
    )


# -- the ownership tree ---------------------------------------------------------------------------


class Owner(Actor):
    def __init__(self, handle: bool) -> None:
        self.handle = handle
        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        self.children = self.procs.spawn("child", Faulty)
        self.children.ok.call().get()
        self.reports: list[str] = []

    @endpoint
    def break_child(self) -> str:
        try:
            self.children.exit.call(5).get()
        except RuntimeError as error:  # a SupervisionError
            return str(error)
        return "no error"

    @endpoint
    def reports_seen(self) -> list[str]:
        return self.reports

    def __supervise__(self, failure: MeshFailure) -> bool:
        if failure.mesh_name.startswith("child-"):
            self.reports.append(failure.report())
        return self.handle


def test_a_nested_actor_is_named_by_its_owners(unhandled_failures: list[MeshFailure]) -> None:
    procs = this_host().spawn_procs(per_host={"x": 1})
    owner = procs.spawn("owner", Owner, False)
    child = name_of(Faulty, "child", "{'gpus': 0/2}", name_of(Owner, "owner", "{'x': 0/1}"))
    reason = "the process this actor was running on exited with non-zero code 5"
    assert owner.break_child.call_one().get(timeout=60) == (
        "Endpoint call child.exit() failed, " + failed(child, reason)
    )
    failure = wait_for(unhandled_failures, "owner")
    # The failure at the bottom of the chain (upstream may name its log-forwarding actor there).
    assert failure.report().endswith(f" and all its descendants have failed:\n  {reason}")
    owner_name = name_of(Owner, "owner", "{'x': 0/1}")
    assert str(failure).startswith(
        f"MeshFailure(mesh_name={failure.mesh_name}, crashed_ranks=[0], event=Supervision "
        f"event: actor {owner_name} failed because it did not handle a supervision event "
        "from its child. The child's event was:\n  "
    )
    procs.stop().get(timeout=60)


def test_an_owner_sees_upstreams_report(unhandled_failures: list[MeshFailure]) -> None:
    procs = this_host().spawn_procs(per_host={"x": 1})
    owner = procs.spawn("carer", Owner, True)
    owner.break_child.call_one().get(timeout=60)
    child = name_of(Faulty, "child", "{'gpus': 0/2}", name_of(Owner, "carer", "{'x': 0/1}"))
    reason = "the process this actor was running on exited with non-zero code 5"
    deadline = time.monotonic() + 60
    while not (reports := owner.reports_seen.call_one().get(timeout=60)):
        assert time.monotonic() < deadline, "no failure reached __supervise__"
    assert reports == [failed(child, reason)]
    procs.stop().get(timeout=60)


class HandedOwner(Actor):
    """Owns an actor mesh it spawned on procs it was handed: the client spawned those."""

    def __init__(self, procs: ProcMesh) -> None:
        self.workers = procs.spawn("handed", Faulty)
        self.workers.ok.call().get()
        self.reports: list[str] = []

    @endpoint
    def kill_one(self) -> str:
        self.workers.slice(gpus=0).kill.broadcast(signal.SIGKILL)
        try:
            self.workers.ok.call().get(timeout=60)
        except RuntimeError as error:  # a SupervisionError
            return str(error)
        return "no error"

    @endpoint
    def reports_seen(self) -> list[str]:
        return self.reports

    def __supervise__(self, failure: MeshFailure) -> bool:
        if failure.mesh_name.startswith("handed-"):
            self.reports.append(failure.report())
        return True


def test_an_owner_of_actors_on_procs_it_was_handed_names_the_exit(
    unhandled_failures: list[MeshFailure],
) -> None:
    workers = this_host().spawn_procs(per_host={"gpus": 2})
    home = this_host().spawn_procs(per_host={"x": 1})
    owner = home.spawn("handed_owner", HandedOwner, workers)
    owner_name = name_of(HandedOwner, "handed_owner", "{'x': 0/1}")
    actor = name_of(Faulty, "handed", "{'gpus': 0/2}", owner_name)
    reason = "the process this actor was running on failed: Killed(sig=9)"
    assert owner.kill_one.call_one().get(timeout=60) == (
        "Endpoint call handed.ok() failed, " + failed(actor, reason)
    )
    deadline = time.monotonic() + 60
    while not (reports := owner.reports_seen.call_one().get(timeout=60)):
        assert time.monotonic() < deadline, "no failure reached __supervise__"
    assert reports == [failed(actor, reason)]
    home.stop().get(timeout=60)
    workers.stop().get(timeout=60)


def test_a_dead_proc_fails_its_proc_meshs_logger_for_the_spawner(
    unhandled_failures: list[MeshFailure],
) -> None:
    """Upstream's per-proc log-forwarding actors (``logger-<uid>``) belong to the spawner of
    the proc mesh: a proc that dies fails one, at the root the fault hook hears of it, even
    with no actor of the client left there."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("gone_first", Faulty)
    pid = mesh.ok.call().get(timeout=60).item(gpus=1)
    mesh.stop().get(timeout=60)
    os.kill(pid, signal.SIGUSR2)
    reason = "the process this actor was running on failed: Killed(sig=12)"

    def ours() -> list[MeshFailure]:
        """The loggers' failures of this proc's death: a logger of an earlier test's procs
        (killed otherwise) may fail late, upstream polling every second."""
        return [
            f
            for f in list(unhandled_failures)
            if f.mesh_name.startswith("logger-") and f.report().endswith(reason)
        ]

    deadline = time.monotonic() + 60
    while not ours():
        assert time.monotonic() < deadline, "no failure of the logger reached the fault hook"
        time.sleep(0.05)
    (failure,) = ours()
    assert re.fullmatch(r"logger-[0-9A-Za-z]{11}", failure.mesh_name)
    actor = f"{failure.mesh_name}{{'gpus': 1/2}}"
    assert failure.report() == failed(actor, reason)
    assert str(failure) == (
        f"MeshFailure(mesh_name={failure.mesh_name}, crashed_ranks=[1], "
        f"event=Supervision event: actor {actor} failed:\n  {reason})"
    )
    procs.stop().get(timeout=60)


CONTROLLERS = "<root>.<monarch._src.actor.proc_mesh._ControllerController controller_controller>"


class Controller(Actor):
    """A job singleton (``get_or_spawn_controller``) that owns a mesh whose proc dies."""

    def __init__(self) -> None:
        self.reports: list[str] = []

    @endpoint
    def shown(self) -> str:
        return repr(context().actor_instance)

    @endpoint
    def child_dies(self) -> str:
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.children = self.procs.spawn("ctl_child", Faulty)
        self.children.ok.call().get()
        try:
            self.children.exit.call_one(4).get(timeout=60)
        except RuntimeError as error:  # a SupervisionError
            return str(error)
        return "no error"

    @endpoint
    def reports_seen(self) -> list[str]:
        return self.reports

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.reports.append(failure.report())
        return True


def test_a_controllers_actors_are_named_down_upstreams_controller_path(
    unhandled_failures: list[MeshFailure],
) -> None:
    controller = get_or_spawn_controller("named_ctl", Controller).get(timeout=60)
    me = f"{CONTROLLERS}.<{Controller.__module__}.Controller named_ctl>"
    assert controller.shown.call_one().get(timeout=60) == me  # no coords: no dimensions
    child = name_of(Faulty, "ctl_child", "{'gpus': 0/1}", me)
    reason = "the process this actor was running on exited with non-zero code 4"
    assert controller.child_dies.call_one().get(timeout=60) == (
        "Endpoint call ctl_child.exit() failed, " + failed(child, reason)
    )
    deadline = time.monotonic() + 60
    while len(reports := controller.reports_seen.call_one().get(timeout=60)) < 2:
        assert time.monotonic() < deadline, "the failures did not reach __supervise__"
    logger = [report for report in reports if report.startswith("The actor logger-")]
    assert len(logger) == 1  # the proc mesh's logger (see the test above), then the child
    expected = re.escape(failed("logger-@{'gpus': 0/1}", reason)).replace("@", r"\w{11}")
    assert re.fullmatch(expected, logger[0])
    assert sorted(reports) == sorted([*logger, failed(child, reason)])


def test_an_actor_on_this_proc_is_named_without_coords() -> None:
    local = this_proc().spawn("here", Controller)
    assert local.shown.call_one().get(timeout=60) == (
        f"<root>.<{Controller.__module__}.Controller here>"
    )
    local.stop().get(timeout=60)


# -- codec_max_frame_length ---------------------------------------------------------------------


class Sizes(Actor):
    @endpoint
    def length(self, data: bytes) -> int:
        return len(data)

    @endpoint
    def large(self, size: int) -> bytes:
        return b"x" * size


@pytest.mark.ours_only  # upstream's link to the proc breaks: the call never answers
def test_a_message_over_codec_max_frame_length_fails_with_a_supervision_error() -> None:
    from monarch.config import configured

    with configured(codec_max_frame_length=10_000):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        sizes = procs.spawn("sizes", Sizes)
        assert sizes.length.call_one(b"x" * 100).get(timeout=60) == 100
        error = supervision_error(lambda: sizes.length.call_one(b"x" * 20_000).get(timeout=60))
        assert "rejecting oversize frame: len=" in str(error)
        assert "> max=10000; increase CODEC_MAX_FRAME_LENGTH to allow." in str(error)
        assert "configure(codec_max_frame_length=...)" in str(error)
        assert "HYPERACTOR_CODEC_MAX_FRAME_LENGTH" in str(error)
        assert sizes.length.call_one(b"x").get(timeout=60) == 1  # the link is fine
        with pytest.raises(RuntimeError, match="rejecting oversize frame"):
            sizes.length.broadcast(b"x" * 20_000)
        # A reply too large fails its actor, as upstream's.
        error = supervision_error(lambda: sizes.large.call_one(20_000).get(timeout=60))
        assert str(error).startswith("Endpoint call sizes.large() failed, The actor ")
        assert "rejecting oversize frame" in str(error)
        supervision_error(lambda: sizes.length.call_one(b"x").get(timeout=60))
        procs.stop().get(timeout=60)


# -- BaseExceptions in hooks ----------------------------------------------------------------------


class Interrupting(Actor):
    """Owns a mesh whose failure its ``__supervise__`` meets with a KeyboardInterrupt."""

    def __init__(self) -> None:
        self.children = this_host().spawn_procs(per_host={"g": 1}).spawn("victim", Faulty)
        self.children.ok.call().get()

    @endpoint
    def break_child(self) -> None:
        self.children.exit.broadcast(9)

    @endpoint
    def ok(self) -> int:
        return os.getpid()

    def __supervise__(self, failure: MeshFailure) -> bool:
        raise KeyboardInterrupt("in __supervise__")


def test_a_supervise_that_raises_a_base_exception_fails_its_actor(
    unhandled_failures: list[MeshFailure],
) -> None:
    procs = this_host().spawn_procs(per_host={"x": 1})
    owner = procs.spawn("interrupting", Interrupting)
    owner.ok.call_one().get(timeout=60)
    owner.break_child.call_one().get(timeout=60)
    report = wait_for(unhandled_failures, "interrupting").report()
    actor = name_of(Interrupting, "interrupting", "{'x': 0/1}")
    assert report.startswith(
        f"The actor {actor} and all its descendants have failed:\n"
        "  actor explicitly aborted due to: Traceback (most recent call last):\n"
    )
    assert "KeyboardInterrupt: in __supervise__" in report
    later = supervision_error(lambda: owner.ok.call_one().get(timeout=60))  # no hang
    assert str(later).startswith(f"Endpoint call interrupting.ok() failed, The actor {actor}")
    procs.stop().get(timeout=60)


class CleanupInterrupts(Actor):
    @endpoint
    async def ok(self) -> int:
        return os.getpid()

    async def __cleanup__(self, exc: Exception | None) -> None:
        raise KeyboardInterrupt("in __cleanup__")


def test_a_cleanup_that_raises_a_base_exception_still_stops(procs: ProcMesh) -> None:
    mesh = procs.spawn("cleanup", CleanupInterrupts)
    pid = mesh.ok.call_one().get(timeout=60)
    mesh.stop().get(timeout=60)
    os.kill(pid, 0)  # its proc lives on
