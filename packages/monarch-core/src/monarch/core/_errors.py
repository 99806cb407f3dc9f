"""The exceptions of monarch-core, one tree under :class:`MonarchError`, and what carries a
remote exception back to its caller.

Each class also derives from the built-in exception that upstream Monarch raises for the
same mistake (``RuntimeError``, ``KeyError``...), so ``except`` clauses written against
upstream keep working.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any

from ._payload._serialize import dumps


class MonarchError(Exception):
    """Base class of every error monarch-core raises."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """How IPython shows one (a notebook cell's value): the class and the text users
        read, not the constructor's arguments."""
        text = str(self)
        name = type(self).__name__
        printer.text(text if text.startswith(f"{name}(") else f"{name}: {text}")


# -- calls -------------------------------------------------------------------------------


class ActorError(MonarchError):
    """An endpoint raised: the original exception and the remote traceback.

    Its text is upstream's: the message (``Actor call mesh.method failed.``), then the
    traceback headed ``Traceback of where the remote call failed``.
    """

    def __init__(
        self, exception: BaseException, message: str = "A remote actor call has failed."
    ) -> None:
        self.exception = exception
        self.message = message
        self.exception_formatted = remote_traceback(exception)
        super().__init__(exception, message)

    def __str__(self) -> str:
        return f"{self.message}\n {self.exception_formatted}"


def remote_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as upstream shows one from another process."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines).replace(
        "Traceback (most recent call last):",
        "Traceback of where the remote call failed (most recent call last):",
    )


class SupervisionError(MonarchError, RuntimeError):
    """The target actor or its proc has failed (or stopped); the call cannot complete.

    As upstream's: ``endpoint`` names the call (``mesh.method()``) when one failed, and the
    text is then ``Endpoint call mesh.method() failed, <what happened>``.
    """

    def __init__(self, message: str, endpoint: str | None = None) -> None:
        if endpoint is None:
            super().__init__(message)
        else:
            super().__init__(message, endpoint)
        self.endpoint = endpoint

    def __str__(self) -> str:
        message = str(self.args[0]) if self.args else ""
        if self.endpoint is None:
            return message
        return f"Endpoint call {self.endpoint} failed, {message}"

    def __repr__(self) -> str:
        if self.endpoint is None:
            return f"SupervisionError({str(self)!r})"
        return f"SupervisionError(endpoint={self.endpoint!r}, {self.args[0]!r})"


class MeshFailure(MonarchError):
    """What failed: which mesh, which of its ranks, and why (with the chain below it).

    Handed to the owner's ``__supervise__`` (see ``_supervision``), and to
    ``unhandled_fault_hook`` at the root. ``event`` and ``report()`` are upstream's texts
    (see ``_reports``): the event says what happened to which actor, the report names the
    failure at the bottom of the chain.
    """

    def __init__(
        self,
        mesh_name: str,
        crashed_ranks: Sequence[int],
        event: str,
        mesh: Any = None,
        report: str | None = None,
    ) -> None:
        super().__init__(mesh_name, list(crashed_ranks), event)
        self.mesh_name = mesh_name
        self.crashed_ranks = list(crashed_ranks)
        self.event = event
        self.mesh = mesh
        self._report = report

    def report(self) -> str:
        if self._report is not None:
            return self._report
        ranks = ", ".join(map(str, self.crashed_ranks)) or "none"
        return f"mesh {self.mesh_name!r} (ranks {ranks}) failed: {self.event}"

    def __str__(self) -> str:
        return (
            f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks={self.crashed_ranks}, "
            f"event={self.event})"
        )

    def __reduce__(self) -> Any:
        return (MeshFailure, (self.mesh_name, self.crashed_ranks, self.event, None, self._report))


class RemoteFailure:
    """What travels back when remote code raises: the exception and its traceback text.

    Not an exception itself: the receiving side turns it into one (``to_error``).
    """

    def __init__(self, exception: BaseException, formatted: str, message: str) -> None:
        self.exception = exception
        self.formatted = formatted
        self.message = message

    @classmethod
    def of(cls, exc: BaseException, message: str) -> RemoteFailure:
        formatted = remote_traceback(exc)
        try:
            dumps(exc)
        except Exception:  # noqa: BLE001 - an unpicklable exception travels as text
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        return cls(exc, formatted, message)

    def to_error(self) -> Exception:
        if isinstance(self.exception, SupervisionError):
            return self.exception
        error = ActorError(self.exception, self.message)
        error.exception_formatted = self.formatted
        return error


# -- processes ----------------------------------------------------------------------------


class PeerLost(MonarchError, ConnectionError):
    """A peer process stopped answering (exited, was killed, or the link broke)."""


class PullError(MonarchError, OSError):
    """A lent buffer could not be read (the lender is gone, or reading is not allowed)."""


class WorkerConfigError(MonarchError, RuntimeError):
    """A worker cannot start: no usable job secret, or an unsupported address or security."""


class WorkspaceSyncError(MonarchError, RuntimeError):
    """``sync_workspace`` failed on some hosts (the others were synced).

    ``failures``: host rank (in the mesh synced) -> what went wrong there. A host cut off
    mid-sync keeps whole files only, old or new (see ``_workspace``).
    """

    def __init__(self, failures: dict[int, tuple[str, BaseException]], hosts: int) -> None:
        self.failures = {rank: error for rank, (_, error) in failures.items()}
        lines = [
            f"  host {rank} ({address}): {_first_line(error)}"
            for rank, (address, error) in sorted(failures.items())
        ]
        super().__init__(
            f"sync_workspace failed on {len(failures)} of {hosts} hosts:\n" + "\n".join(lines)
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# -- meshes -------------------------------------------------------------------------------


class DimensionError(MonarchError, KeyError, ValueError, TypeError):
    """A dimension label that the shape, extent or mesh does not have.

    Upstream raises ``TypeError`` (``slice``), ``KeyError`` (``size``) or ``ValueError``
    (``extent[...]``, ``point[...]``) for this one mistake; being all three keeps any of those
    ``except`` clauses working, and being a ``KeyError`` lets ``label in point`` answer False.
    """

    def __str__(self) -> str:
        # KeyError would repr() the message; show it as written.
        return str(self.args[0]) if self.args else ""


class MeshIndexError(MonarchError, IndexError, ValueError):
    """An index or range outside a dimension (upstream: IndexError for ints, ValueError else)."""


class NegativeIndexError(MeshIndexError, OverflowError):
    """A negative index or rank: upstream's (unsigned) arguments refuse it with OverflowError,
    so this is one too, besides an index error like any other out of range."""
