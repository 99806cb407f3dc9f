"""Where telemetry plugs into the core: one optional object, no cost without it.

A plug-in (monarch-telemetry: OpenTelemetry spans and metrics) installs an
``Instrumentation``; the core then asks it, on the caller's thread, what a call carries
to its callee (``outgoing``: a trace context), and has it ``enter`` each endpoint it runs
(on the thread or task that runs it) and close that scope when the endpoint is done. With
none installed each of those is one test of a module global. Procs load the plug-ins of
the ``monarch.instrumentation`` entry points when ``enable_telemetry`` is set (the
client's plug-in sets it, and procs inherit the configuration).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from monarch.transport import Buffer, plugin_group

log = logging.getLogger("monarch.core")

ENTRY_POINT_GROUP: Final = "monarch.instrumentation"
"""Entry points ``name = "module:install"``: ``install()`` calls ``set_instrumentation``."""


class Scope(Protocol):
    def close(self, error: BaseException | None) -> None:
        """The endpoint is done (``error``: what it raised)."""


class Instrumentation(Protocol):
    def outgoing(self, mesh: str, method: str, mesh_id: str, view: object) -> str:
        """What a call about to be sent to ``mesh`` (its name as given; ``mesh_id``: the
        spawn's id) carries to its callee ("" for nothing); ``view``: the ``Shape`` it is
        cast to."""

    def enter(
        self,
        cls: type,
        method: str,
        actor: str,
        mesh: str,
        rank: int,
        carried: str,
        payload: Sequence[Buffer],
        waiting: Callable[[], int],
    ) -> Scope:
        """Endpoint ``method`` of ``actor`` (its id, an instance of ``cls``; rank ``rank``
        of mesh ``mesh``) starts; ``carried``: what the call carried; ``payload``: its
        arguments' buffers; ``waiting()``: the messages queued behind it. The returned
        scope is current for the endpoint's code (on this thread or task) until closed.
        Called per message: what the plug-in does not record it need not compute (the
        payload's size, the queue's depth, the endpoint's name)."""

    def spawned(
        self, mesh: str, name: str, cls: str, shape: object, procs: str, owner: str
    ) -> None:
        """This process spawns actor mesh ``mesh`` (``name`` as given, of ``cls``, over
        ``shape``, a ``Shape``) on the procs of proc mesh ``procs`` ("" if unknown here);
        ``owner``: the owner's name in failure reports (``<root>``, upstream's spelling)."""

    def procs_spawned(self, mesh: str, name: str, shape: object) -> None:
        """This process spawns proc mesh ``mesh`` (``name`` as given, ``shape``)."""

    def status(self, mesh: str, rank: int, status: str, reason: str) -> None:
        """An actor of this process is now ``status`` ("Running", "Failed", "Stopped")."""

    def supervision(
        self, mesh: str, ranks: int, lost: Sequence[str] = (), report: str = ""
    ) -> None:
        """A supervision event reaches this process, the owner of ``mesh`` (an actor mesh
        or a proc mesh) or the root: ``ranks`` of it failed (a crashed proc's actors too,
        which could not say so themselves: ``lost``, their actor ids, with the failure's
        ``report``)."""

    def begin(self, kind: str, name: str, carried: str = "", to: str = "") -> Scope:
        """Work this process does for the job beside endpoints starts: a cast relay
        (``relay``), an RDMA transfer (``rdma``), a tensor-engine op (``tensor``); the
        scope is closed when it is done. ``carried``: what the message that caused it
        carried (a relay's call), ``to``: the actor id it was sent to."""

    def shutdown(self) -> None:
        """The process is ending: send what is buffered."""


_installed: list[Instrumentation] = []


def set_instrumentation(instrumentation: Instrumentation | None) -> None:
    """Install ``instrumentation`` in this process (``None``: remove it)."""
    _installed[:] = [] if instrumentation is None else [instrumentation]


def current_instrumentation() -> Instrumentation | None:
    return _installed[0] if _installed else None


def instrumented() -> bool:
    """Whether an instrumentation is installed (the one test on the hot paths)."""
    return bool(_installed)


def outgoing(mesh: str, method: str, mesh_id: str, view: object) -> str:
    """What a call carries (see ``Instrumentation.outgoing``); "" without instrumentation."""
    return _installed[0].outgoing(mesh, method, mesh_id, view) if _installed else ""


def load_instrumentation() -> None:
    """Install the plug-ins of ``ENTRY_POINT_GROUP`` (a proc, when telemetry is on)."""
    for entry in plugin_group(ENTRY_POINT_GROUP).entries().values():
        try:
            entry.load()()
        except Exception as exc:  # noqa: BLE001 - telemetry must not stop a proc
            log.warning("instrumentation %s: %s", entry.name, exc)


def shutdown_instrumentation() -> None:
    if _installed:
        try:
            _installed[0].shutdown()
        except Exception as exc:  # noqa: BLE001 - the proc ends anyway
            log.warning("instrumentation shutdown: %s", exc)


def enter(
    cls: type,
    method: str,
    actor: str,
    mesh: str,
    rank: int,
    carried: str,
    payload: Sequence[Buffer],
    waiting: Callable[[], int],
) -> Scope | None:
    """The scope of an endpoint about to run (see ``Instrumentation.enter``); None without
    instrumentation."""
    if not _installed:
        return None
    return _installed[0].enter(cls, method, actor, mesh, rank, carried, payload, waiting)


def spawned(mesh: str, name: str, cls: type, shape: object, procs: str, owner: str) -> None:
    if _installed:
        cls_name = f"{cls.__module__}.{cls.__qualname__}"
        _installed[0].spawned(mesh, name, cls_name, shape, procs, owner)


def procs_spawned(mesh: str, name: str, shape: object) -> None:
    if _installed:
        _installed[0].procs_spawned(mesh, name, shape)


def status(mesh: str, rank: int, status: str, reason: str = "") -> None:
    if _installed:
        _installed[0].status(mesh, rank, status, reason)


def begin_operation(kind: str, name: str, carried: str = "", to: str = "") -> Scope | None:
    """The scope of an operation (see ``Instrumentation.begin``); None without
    instrumentation."""
    return _installed[0].begin(kind, name, carried, to) if _installed else None


def timed(kind: str, name: str, future: Any) -> None:
    """The work behind ``future`` (a Future of this core), from now until it completes, as
    an operation (a plug-in's: an RDMA transfer); one test without instrumentation."""
    if _installed:
        scope = _installed[0].begin(kind, name)
        future._cf.add_done_callback(lambda outcome: scope.close(outcome._error))


def supervision(mesh: str, ranks: int, lost: Sequence[str] = (), report: str = "") -> None:
    if _installed:
        _installed[0].supervision(mesh, ranks, lost, report)
