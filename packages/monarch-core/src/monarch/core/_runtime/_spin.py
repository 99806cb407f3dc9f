"""The one wait rule of every waiter: yield the CPU a while before going to sleep.

A reply, or the next message, usually comes within a few hundred microseconds; a thread
asleep in a lock or the poller would then be woken for it, and on a VM waking a halted CPU
costs more than the whole message. So every waiter of the process (a thread blocked on a
Future, an idle sync actor's thread, the loop after it handled messages) first yields the
CPU for ``wait_spin`` seconds, asking ``done()`` between yields; ``wait_spin = 0`` turns
all of them off at once. Yielding (``sched_yield``) rather than spinning hot hands the CPU,
and the GIL, to any thread that has work.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

from monarch.core._config import current_config
from monarch.core._placement import PROCESS_MASK

CONTENDED_YIELD: Final = 500e-6
"""A yield that kept its thread off the CPU longer than this (seconds) handed the CPU to
another process for a time slice of its own: the machine has no CPU to spare. (A yield
to nobody takes ~1 us, one to a thread of this process that needs the GIL a few tens.)"""

CONTENDED_PAUSE: Final = 0.1
"""For this long (seconds) after such a yield, every waiter of the process sleeps at once."""

_contended_until = 0.0
"""Until when (``perf_counter``) waiters do not spin (see ``yield_cpu``)."""


def spin_seconds() -> float:
    """How long a waiter yields before it sleeps: the ``wait_spin`` key, in seconds, or 0
    while the machine has shown it has no CPU to spare (see ``yield_cpu``)."""
    spin: float = current_config().wait_spin
    if spin > 0 and _contended_until and time.perf_counter() < _contended_until:
        return 0.0
    return spin


def yield_cpu() -> bool:
    """Yield the CPU once; False if that took longer than ``CONTENDED_YIELD``.

    On a machine whose CPUs all have work, a yield gives the CPU away for another
    process's whole slice (milliseconds), and a reply that came meanwhile waits for it,
    while a thread asleep in a lock is woken with a sleeper's priority: waiting that way
    is then faster (a round trip 1.3-7 ms spinning against 0.21-0.26 ms sleeping, at
    load 60 on 2 CPUs). So waiters sleep at once for ``CONTENDED_PAUSE`` after such a
    yield, then try again.
    """
    global _contended_until
    before = time.perf_counter()
    os.sched_yield()
    after = time.perf_counter()
    if after - before < CONTENDED_YIELD:
        return True
    _contended_until = after + CONTENDED_PAUSE
    return False


def spin(done: Callable[[], object], seconds: float) -> bool:
    """Yield the CPU until ``done()`` is true or ``seconds`` have passed; whether it is
    (at once, after a yield that showed the machine has no CPU to spare)."""
    deadline = time.perf_counter() + seconds
    while not done():
        if time.perf_counter() >= deadline or not yield_cpu():
            return bool(done())
    return True


USABLE_CPUS: Final = len(PROCESS_MASK) or os.cpu_count() or 1
"""CPUs this process may run on: a waiter spins only while others have one to spare."""


class BlockingListener(Protocol):
    """Told when a thread goes to sleep on a Future and when it wakes (the sync actors'
    pool, ``_runner._pool``: a thread asleep on a Future leaves its place to another)."""

    def blocking(self) -> None: ...

    def unblocked(self) -> None: ...


_listener = threading.local()


def set_blocking_listener(listener: BlockingListener | None) -> None:
    """The calling thread's sleeps on a Future are told to ``listener`` from now on."""
    _listener.value = listener


def blocking_listener() -> BlockingListener | None:
    """The calling thread's listener (``None``: most threads)."""
    listener: BlockingListener | None = getattr(_listener, "value", None)
    return listener
