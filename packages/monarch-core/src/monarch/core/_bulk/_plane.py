"""What a bulk-data plane offers, and the registry that finds the planes.

A *loan* is a region of one process's memory that peers may read (and, if writable,
write) until it is given back: an ``RDMABuffer``, or a large part of an actor message.
A *plane* is one way of moving a loan's bytes between two processes: the same-host
memory read (``_memory_plane``, the core's own), RDMA over ibverbs and a TCP data
server (monarch-rdma's). A plane

- ``lend``s a region: makes it reachable through itself, and says what a peer needs to
  reach it (kept in the loan under the plane's name);
- ``reaches`` a loan from this process, or not; the registry asks the planes in
  ``order`` and the first that does moves that loan's bytes, chosen once per loan;
- ``read``s a loan into a region of ours, ``write``s one of ours into it (``False``: it
  cannot here, the next plane is asked);
- ``release``s what it held for a loan once the loan is dropped.

Planes other than the core's are registered by their wheel through the entry-point group
``monarch.bulk_planes`` (``name = "module:Class"``), read once, lazily, by the one
plug-in loader: adding a kind of plane is one class in one file of its wheel, and one
line in that wheel's ``pyproject.toml``.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol

from monarch.core._errors import PullError
from monarch.transport import MissingPlugin, plugin_group

ENTRY_POINT_GROUP: Final = "monarch.bulk_planes"
BUILTIN: Final = {"memory": "monarch.core._bulk._memory_plane:MemoryPlane"}
"""The core's planes: loaded without reading the entry points."""
PROVIDERS: Final = {"pull": "monarch-rdma", "tcp": "monarch-rdma", "ibverbs": "monarch-rdma"}
"""Planes other wheels provide, named in the error when one is missing."""
CHOICES_MAX: Final = 1 << 16
"""Loans whose plane choice is remembered; beyond, the memory starts again."""


class LoanLost(PullError):
    """The process that lent the region is gone: its memory went with it."""


class LoanDropped(PullError):
    """The region was given back (dropped) before or while it was read."""


class PlaneError(LookupError):
    """A plane is missing, registered twice, or not a ``Plane``."""


class Loan(Protocol):
    """Where a lent region is and how to tell it is still lent (what a plane reads)."""

    @property
    def pid(self) -> int: ...
    @property
    def token(self) -> int:
        """The lender process's token: a process that reused its pid has another."""

    @property
    def identity(self) -> int:
        """Where the lender holds (magic, token): reading it proves the pid is the lender."""

    @property
    def cell(self) -> int:
        """Where the lender holds (token, id), the id zeroed once the loan is dropped."""

    @property
    def buffer_id(self) -> int: ...
    @property
    def address(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def writable(self) -> bool: ...
    @property
    def gate(self) -> int:
        """The lender's write-gate file (``_write_gate``), -1 if none: a peer of its host
        then writes by asking the lender to pull the bytes."""

    def reach(self, plane: str) -> tuple[Any, ...] | None:
        """What ``plane`` said a peer needs to reach the region (None: it did not lend it)."""


@dataclass(frozen=True, slots=True)
class Lent:
    """A ``Loan`` as a plain value: a transport's frame part lent over one connection
    (monarch-rdma's ``_link``), a test's. No process of this host vouches for it (pid,
    token and cells 0, no write gate): only the plane it names reaches it."""

    buffer_id: int
    """The lender's key for it."""
    address: int
    size: int
    planes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """What each plane that lent it said the borrower needs, by the plane's name."""
    writable: bool = False
    pid: int = 0
    token: int = 0
    identity: int = 0
    cell: int = 0
    gate: int = -1

    def reach(self, plane: str) -> tuple[Any, ...] | None:
        for name, reach in self.planes:
            if name == plane:
                return reach
        return None


class Plane(abc.ABC):
    """One way of moving a loan's bytes (see the module docstring)."""

    name: ClassVar[str]
    order: ClassVar[int]
    """Lower is asked first: the fastest plane that reaches a loan moves it."""
    reads_alone: ClassVar[bool] = False
    """Whether a read is a copy this thread makes alone (no owner, no socket): made on
    the caller's thread, and copies of this kind are not run side by side."""

    def writes_alone(self, loan: Loan) -> bool:
        """Whether a write to ``loan`` is such a copy too (as ``reads_alone``)."""
        return False

    def lend(self, buffer_id: int, address: int, size: int) -> tuple[Any, ...] | None:
        """Make ``size`` bytes at ``address`` reachable through this plane; what a peer
        needs to reach them (None: nothing, or this plane cannot lend here)."""
        return None

    def release(self, buffer_id: int) -> None:
        """The loan ``buffer_id`` was dropped: let go of what ``lend`` took for it."""
        return None

    @abc.abstractmethod
    def reaches(self, loan: Loan) -> bool:
        """Whether this plane moves ``loan``'s bytes between its lender and us."""

    @abc.abstractmethod
    def read(self, loan: Loan, into: int, deadline: float) -> None:
        """Copy the whole loan to ``into`` (an address of ours with ``loan.size`` bytes)."""

    @abc.abstractmethod
    def write(self, loan: Loan, source: int, size: int, deadline: float) -> bool:
        """Copy ``size`` bytes at ``source`` (ours) to the start of the loan; False if this
        plane cannot here (the next one that reaches the loan is asked)."""


class Planes:
    """The planes of one entry-point group, each made once, on first use."""

    def __init__(
        self, group: str = ENTRY_POINT_GROUP, builtin: dict[str, str] | None = None
    ) -> None:
        self.group = plugin_group(group, PROVIDERS)
        self._builtin = dict(BUILTIN if builtin is None else builtin)
        self._lock = threading.RLock()
        self._made: dict[str, Plane] = {}
        self._all: tuple[Plane, ...] | None = None
        self._choices: dict[Loan, Plane] = {}

    def get(self, name: str) -> Plane:
        """The plane ``name``: ``MissingPlugin`` (with the wheel to install) if none is
        installed, ``PluginConflict`` if two wheels register it, ``PlaneError`` if what
        it names is not a ``Plane`` of that name."""
        made = self._made.get(name)
        if made is not None:
            return made
        with self._lock:
            if name not in self._made:
                self._made[name] = self._make(name)
            return self._made[name]

    def _make(self, name: str) -> Plane:
        path = self._builtin.get(name)
        if path is not None:
            module, _, attr = path.partition(":")
            import importlib

            kind: Any = getattr(importlib.import_module(module), attr)
        else:
            kind = self.group.load(name, f"the bulk-data plane {name!r}")
        if not (isinstance(kind, type) and issubclass(kind, Plane)):
            raise PlaneError(f"the bulk-data plane {name!r} ({kind!r}) is not a Plane class")
        if kind.name != name:
            raise PlaneError(
                f"the entry point {name!r} of {self.group.group} names the plane "
                f"{kind.name!r} ({kind.__module__}.{kind.__qualname__})"
            )
        return kind()

    def all(self) -> tuple[Plane, ...]:
        """Every installed plane, in ``order`` (reads the entry points, once)."""
        found = self._all
        if found is not None:
            return found
        with self._lock:
            if self._all is None:
                names = dict.fromkeys([*self._builtin, *self.group.entries()])
                self._all = tuple(sorted(map(self.get, names), key=lambda p: p.order))
            return self._all

    def lend(self, buffer_id: int, address: int, size: int) -> tuple[tuple[str, Any], ...]:
        """Lend a region through every plane: what each said a peer needs, by name."""
        out: list[tuple[str, Any]] = []
        for plane in self.all():
            reach = plane.lend(buffer_id, address, size)
            if reach is not None:
                out.append((plane.name, reach))
        return tuple(out)

    def release(self, buffer_id: int) -> None:
        for plane in self.all():
            plane.release(buffer_id)

    def choose(self, loan: Loan) -> Plane:
        """The plane that moves ``loan``'s bytes from here: chosen on first use, kept."""
        plane = self._choices.get(loan)
        if plane is not None:
            return plane
        for plane in self.all():
            if plane.reaches(loan):
                if len(self._choices) >= CHOICES_MAX:
                    self._choices.clear()
                self._choices[loan] = plane
                return plane
        names = ", ".join(p.name for p in self.all())
        raise PlaneError(f"no bulk-data plane reaches the loan of process {loan.pid} ({names})")

    def forget(self, loan: Loan) -> None:
        """``loan`` was dropped: its choice is not needed again."""
        self._choices.pop(loan, None)

    def write(self, loan: Loan, source: int, size: int, deadline: float) -> Plane:
        """Write through the chosen plane, else the next that reaches the loan and can;
        the plane that did."""
        first = self.choose(loan)
        candidates: Sequence[Plane] = [first] + [
            p for p in self.all() if p is not first and p.order > first.order
        ]
        for plane in candidates:
            reaches = plane is first or plane.reaches(loan)
            if reaches and plane.write(loan, source, size, deadline):
                return plane
        raise PlaneError(f"no bulk-data plane can write the loan of process {loan.pid}")


_planes: Planes | None = None
_planes_lock = threading.Lock()


def bulk_planes() -> Planes:
    """This process's planes (``monarch.bulk_planes``)."""
    global _planes
    if _planes is None:
        with _planes_lock:
            if _planes is None:
                _planes = Planes()
    return _planes


__all__ = [
    "ENTRY_POINT_GROUP",
    "Lent",
    "Loan",
    "LoanDropped",
    "LoanLost",
    "MissingPlugin",
    "Plane",
    "PlaneError",
    "Planes",
    "bulk_planes",
]
