"""Upstream's words for failures: users grep logs and match error texts, so ours are
upstream's (torchmonarch 0.7.0), assembled here from the same parts.

An actor is named by its place in the ownership tree: ``<root>.<module.Class name{coords}>``
(its owner's name, then its class, mesh name and rank in the mesh it was spawned on). A
failure has a *reason* (``the process this actor was running on exited with non-zero code
3``, ``actor explicitly aborted due to: <traceback>``), told three ways: a supervision
*event* (``MeshFailure`` and its ``str``), a *report* (``MeshFailure.report()``), and the
``SupervisionError`` of a call (``Endpoint call mesh.method() failed, <report>``).
"""

from __future__ import annotations

import os
import re
import secrets
import string
import traceback
from dataclasses import dataclass
from textwrap import dedent, indent
from typing import Final

ROOT = "<root>"
"""The root client, first in every actor's name."""

ACTOR_MESH_STOPPED = "ActorMeshController received explicit stop request"
"""The status of an actor of a mesh stopped with ``ActorMesh.stop()``, as upstream words it."""

EXITED_CLEANLY = "process exited cleanly"
"""The status of an actor whose process exited with code 0: stopped, not failed."""


CONTROLLERS = f"{ROOT}.<monarch._src.actor.proc_mesh._ControllerController controller_controller>"
"""The owner of the actors ``get_or_spawn_controller`` makes, as upstream's names it."""


_UID_CHARS = string.ascii_letters + string.digits


def mesh_uid() -> str:
    """A new mesh's uid as upstream's spells it (11 letters and digits: ``logger-3mcL39Bx1xu``),
    so ``MeshFailure.mesh_name`` (``<name>-<uid>``) matches the patterns users filter on."""
    return "".join(secrets.choice(_UID_CHARS) for _ in range(11))


def actor_name(owner: str, cls: type | str | None, mesh_name: str, point: object) -> str:
    """``<owner>.<module.Class name{coords}>``; ``point`` is the actor's rank (a Point);
    ``cls`` the class or its ``module.Class`` (what telemetry's hooks are given). An actor
    of a mesh with no dimensions (``this_proc()``, a controller) has no coords."""
    if isinstance(cls, str) or cls is None:
        qualname = cls or "?"
    else:
        qualname = f"{cls.__module__}.{cls.__qualname__}"
    coords = repr(point)
    return f"{owner}.<{qualname} {mesh_name}{'' if coords == '{}' else coords}>"


def aborted(why: str) -> str:
    """The reason of an actor that failed in Python (a ``BaseException``, a failed
    ``__init__``, an exception with nobody to tell, ``Instance.abort``)."""
    return f"actor explicitly aborted due to: {why}"


def aborted_by(exc: BaseException) -> str:
    """:func:`aborted`, with the exception's traceback as the why."""
    return aborted("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


_EXIT = re.compile(r"exited with code (-?\d+)")
_SIGNAL = re.compile(r"killed by signal (\d+)")


def process_ended(how: str) -> tuple[str, bool]:
    """The reason for an actor whose process ended as ``how`` says (a host agent's report:
    ``exited with code N``, ``was killed by signal N``, or why the connection was lost),
    and whether that is a clean exit (code 0: the actor stopped, it did not fail)."""
    if (code := _EXIT.search(how)) is not None:
        if int(code.group(1)) == 0:
            return EXITED_CLEANLY, True
        return f"the process this actor was running on exited with non-zero code {code[1]}", False
    if (sig := _SIGNAL.search(how)) is not None:
        return f"the process this actor was running on failed: Killed(sig={sig[1]})", False
    return f"the process this actor was running on failed: {how}", False


def failed_event(actor: str, reason: str) -> str:
    """A supervision event: the actor failed."""
    return f"Supervision event: actor {actor} failed:\n{indent(reason, '  ')}"


def unhandled_event(actor: str, child_event: str) -> str:
    """A supervision event: the actor failed because a failure of a mesh it owns was not
    handled (no ``__supervise__``, or it returned falsy)."""
    return (
        f"Supervision event: actor {actor} failed because it did not handle a supervision "
        f"event from its child. The child's event was:\n{indent(child_event, '  ')}"
    )


def status_event(actor: str, status: str) -> str:
    """A supervision event: the actor stopped (``status`` says why)."""
    return f"Supervision event: actor {actor} has status:\n  stopped: {status}"


def failed_report(actor: str, reason: str) -> str:
    """``MeshFailure.report()``, and what a call to the failed actor is told."""
    return f"The actor {actor} and all its descendants have failed:\n{indent(reason, '  ')}"


def supervise_raised_report(actor: str, exc: BaseException, child_report: str) -> str:
    """What a call to an actor whose ``__supervise__`` raised is told (upstream's form): the
    exception, then the failure it was handling."""
    return (
        failed_report(actor, f"{type(exc).__name__}: {exc}")
        + "\nThis error occurred while handling another failure:\n"
        + indent(child_report, "  ")
    )


def endpoint(mesh_name: str, method: str) -> str:
    """How a SupervisionError names the call that failed (``SupervisionError.endpoint``)."""
    return f"{mesh_name}.{method}()"


def oversize(size: int, limit: int) -> str:
    """Why a message larger than ``codec_max_frame_length`` was not sent: upstream's words,
    then where that limit is really set (upstream's name is no variable a user can find)."""
    return (
        f"rejecting oversize frame: len={size} > max={limit}; increase CODEC_MAX_FRAME_LENGTH "
        "to allow. (The limit is monarch.config's codec_max_frame_length: "
        "configure(codec_max_frame_length=...) or HYPERACTOR_CODEC_MAX_FRAME_LENGTH in the "
        "environment.)"
    )


def undeliverable(mesh_name: str, method: str, adverb: str, why: str) -> str:
    """A call that could not be delivered."""
    return f"undeliverable message for {mesh_name}.{method}() ({adverb}): {why}"


def actor_call_failed(mesh_name: str, method: str) -> str:
    """``ActorError.message`` of an endpoint that raised."""
    return f"Actor call {mesh_name}.{method} failed."


# -- what a failure is, for machines ---------------------------------------------------------

USER: Final = "user"
SYSTEM: Final = "system"
INFRASTRUCTURE: Final = "infrastructure"

_FAILED_AT = re.compile(
    r"(?:The actor (.+?) and all its descendants have failed|Supervision event: actor (.+?) "
    r"failed):\n"
)
_FRAME = re.compile(r'File "([^"]+)"')


@dataclass(frozen=True)
class FailureCause:
    """Where a failure (or a cascade of them) began, and of what kind: ``category`` user
    (the user's code raised), system (Monarch itself) or infrastructure (a process killed
    or lost, a host gone); ``kind`` says which; ``actor`` and ``reason`` are the first
    failure's, as the texts below name it."""

    category: str
    kind: str
    actor: str
    reason: str
    propagated: bool
    """Whether the failure reached this mesh from another actor's (a cascade)."""


def failure_cause(text: str) -> FailureCause:
    """The cause a supervision event or report names (the innermost failure: the texts
    nest each owner's words around its child's)."""
    matches = list(_FAILED_AT.finditer(text))
    if not matches:
        return FailureCause(SYSTEM, "unknown", "", text.strip(), False)
    last = matches[-1]
    actor = last.group(1) or last.group(2) or ""
    reason = dedent(text[last.end() :]).strip()
    propagated = len(matches) > 1 or "did not handle a supervision event" in text
    category, kind = _category(reason)
    return FailureCause(category, kind, actor, reason, propagated)


def _category(reason: str) -> tuple[str, str]:
    if "Killed(sig=" in reason:
        return INFRASTRUCTURE, "killed process"
    if "exited with non-zero code" in reason:
        return INFRASTRUCTURE, "process exited"
    if reason.startswith("the process this actor was running on failed"):
        return INFRASTRUCTURE, "lost process or host"
    if reason.startswith("actor explicitly aborted due to:"):
        frames = _FRAME.findall(reason)
        if frames and f"{os.sep}monarch{os.sep}" in frames[-1]:
            return SYSTEM, "exception in monarch"
        return USER, "exception in user code"
    if "undeliverable" in reason or "oversize frame" in reason:
        return SYSTEM, "undeliverable message"
    return SYSTEM, "other"
