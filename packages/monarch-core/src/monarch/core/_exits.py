"""How procs ended, as their host agents report it.

A closed connection says that a proc is gone, not how: whether it exited cleanly, with
which code, or which signal killed it. Its host agent knows (it waits on the process) and
tells the process that spawned the proc mesh (``ProcExited``), a moment after the
connection closed. Supervision texts name the exit as upstream's do, so what reports a
lost proc waits here for that word, for ``GRACE`` at most (an agent that died with its
procs says nothing). Loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

GRACE = 1.0
"""Seconds to wait for a host agent's report once a proc's connection closed."""

_ended: dict[str, str] = {}
"""How each proc that ended did, by address (``exited with code 3``...)."""

_waiting: dict[str, list[Callable[[str | None], None]]] = {}
"""Procs whose end this process will hear of (it spawned them), and who waits for it."""


def expect(address: str) -> None:
    """This process will hear how the proc at ``address`` ends (it owns its proc mesh)."""
    if address not in _ended:
        _waiting.setdefault(address, [])


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
    loop.call_later(GRACE, _give_up, address, then)


def _give_up(address: str, then: Callable[[str | None], None]) -> None:
    waiters = _waiting.get(address)
    if waiters is not None and then in waiters:
        waiters.remove(then)
        then(None)
