"""How procs ended, as their host agents report it.

A closed connection says that a proc is gone, not how: whether it exited cleanly, with
which code, or which signal killed it. Its host agent knows (it waits on the process) and
tells the process that spawned the proc mesh (``ProcExited``), a moment after the
connection closed. Supervision texts name the exit as upstream's do, so what reports a
lost proc waits here for that word, for ``GRACE`` at most (an agent that died with its
procs says nothing). Another process (one handed the mesh) asks the spawner (``asking``),
and waits ``ASKED_GRACE`` for its answer. Loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

GRACE = 1.0
"""Seconds to wait for a host agent's report once a proc's connection closed."""

ASKED_GRACE = 2 * GRACE
"""Seconds to wait for the spawner's answer: it may itself wait ``GRACE`` for the report."""

_ended: dict[str, str] = {}
"""How each proc that ended did, by address (``exited with code 3``...)."""

_waiting: dict[str, list[Callable[[str | None], None]]] = {}
"""Procs whose end this process will hear of (it spawned them), and who waits for it."""

_asked: set[str] = set()
"""Procs whose end this process asked another about (``asking``): waited ``ASKED_GRACE``."""

_unknown: set[str] = set()
"""Procs whose end nobody could tell this process: not asked about again."""


_stopping: set[str] = set()
"""Workers (host agents) this client is ending on purpose: their end is no error."""


def workers_stopping(addresses: Iterable[str], stopping: bool = True) -> None:
    """Say that the workers at ``addresses`` are about to be ended on purpose (a job's
    ``kill()``; from any thread): losing them is then logged, not warned of as a failure.
    ``stopping=False``: attached again, their end would be news."""
    if stopping:
        _stopping.update(addresses)
    else:
        _stopping.difference_update(addresses)


def worker_stopping(address: str) -> bool:
    """Whether the worker at ``address`` is being ended on purpose (``workers_stopping``)."""
    return address in _stopping


def expect(address: str) -> None:
    """This process will hear how the proc at ``address`` ends (it owns its proc mesh)."""
    if address not in _ended:
        _waiting.setdefault(address, [])


def asking(address: str) -> bool:
    """Whether to ask another process how the proc at ``address`` ended: ``True`` the
    first time (its answer then goes to ``ended`` or ``unknown``), not while an answer is
    awaited, nor once known or found unknowable."""
    if address in _ended or address in _waiting or address in _unknown:
        return False
    _waiting[address] = []
    _asked.add(address)
    return True


def unknown(address: str) -> None:
    """Nobody can tell how the proc at ``address`` ended: whoever waits hears ``None``."""
    _unknown.add(address)
    for then in _waiting.pop(address, ()):
        then(None)


def ended(address: str, how: str) -> None:
    """The proc at ``address`` ended as ``how`` says; tell whoever waits."""
    _ended[address] = how
    for then in _waiting.pop(address, ()):
        then(how)


def when_ended(
    loop: asyncio.AbstractEventLoop, address: str, then: Callable[[str | None], None]
) -> None:
    """Call ``then`` with how the proc at ``address`` ended, or with ``None`` at once if
    nobody will tell this process (or after ``GRACE`` if its host agent does not)."""
    how = _ended.get(address)
    if how is not None:
        then(how)
        return
    waiters = _waiting.get(address)
    if waiters is None:
        then(None)
        return
    waiters.append(then)
    loop.call_later(ASKED_GRACE if address in _asked else GRACE, _give_up, address, then)


def _give_up(address: str, then: Callable[[str | None], None]) -> None:
    waiters = _waiting.get(address)
    if waiters is not None and then in waiters:
        waiters.remove(then)
        then(None)
