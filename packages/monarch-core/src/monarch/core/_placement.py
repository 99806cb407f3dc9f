"""A process's messaging threads kept on one CPU: the runtime's loop follows the thread it serves.

A round trip involves two threads per process (the caller or an actor's thread, and the
runtime's loop) and the GIL between them. On one CPU, a hand-off is a switch the waiting
thread asked for; across CPUs it is a wake-up of the other CPU, and the GIL goes back and
forth between two spinning threads (bench:placement: 57-62 us against 160-290 us on a
2-CPU VM; the scheduler picks either at random). So a thread about to wait for the
runtime (an idle actor thread, a thread blocked on a Future) notes its CPU
(``note_waiting``), and the loop, as it ends a batch of messages, pins itself there
(``follow``) and does not spin after messages (``following``): the waiter is then the only
runnable thread on its CPU, and the load balancer leaves the two together.

A pinned thread hands its mask to whatever it starts. So every thread the layers start
from the loop calls ``unpin_this_thread`` first (the actors' pool threads and async
actors' loops, the bulk executor, the loop's default executor, ...); user code that runs
on the loop (``hosting``: a ``Future.then`` function, an accumulator's ``combine``, an
``async`` endpoint of a sync actor) runs with the loop unpinned, for the threads it starts
and the pools torch starts at its first parallel op; and a process that imports the core
takes back its spawner's mask when it has exactly the CPU the spawner's loop was pinned to
(the environment says which, ``MASK_ENV``: a child the user restricted otherwise keeps its
mask). Only while waiters spin (``wait_spin`` on: few processes per CPU) and where the
process may use 2 CPUs or more.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from typing import Final

from monarch.core._config import current_config

MASK_ENV: Final = "MONARCH_PINNED_LOOP"
"""``CPU:CPUS`` once this process's loop was pinned: the CPU it is pinned to now (-1: none)
and the CPUs of the process (comma-separated), for the processes started meanwhile."""


def _pin(cpus: frozenset[int], thread: int = 0) -> bool:
    try:
        os.sched_setaffinity(thread, cpus)
    except (AttributeError, OSError):  # not Linux, or a CPU gone (hotplug, cpuset)
        return False
    return True


def _initial_mask() -> frozenset[int]:
    """This process's CPUs; its spawner's, where it inherited the spawner's pinned loop's."""
    try:
        mask = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return frozenset()
    pinned, _, cpus = os.environ.pop(MASK_ENV, "").partition(":")
    try:
        inherited = frozenset({int(pinned)})
        spawners = frozenset(int(cpu) for cpu in cpus.split(","))
    except ValueError:
        return mask
    if mask == inherited and spawners and _pin(spawners):
        return spawners
    return mask


PROCESS_MASK: Final = _initial_mask()
"""The CPUs this process may use, as it started: what unpinned threads get back."""

_MASK_TEXT: Final = ",".join(map(str, sorted(PROCESS_MASK)))
"""``PROCESS_MASK`` as ``MASK_ENV`` writes it."""


def _bind_getcpu() -> object | None:
    try:
        getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):  # not glibc
        return None
    getcpu.restype = ctypes.c_int
    return getcpu


_getcpu = _bind_getcpu()


class _Placement:
    waiter = -1
    """The CPU of the last thread that began to wait for the runtime."""
    pinned = -1
    """The CPU the loop thread is pinned to (-1: not pinned)."""
    loop = 0
    """The loop thread's native id, once it was pinned (any thread may unpin it)."""
    ever = False
    """Whether the loop was ever pinned in this process (threads it started then may be)."""
    hosting = 0
    """User code running on the loop now (``hosting``): the loop stays unpinned meanwhile."""


_state = _Placement()
_hosting_lock = threading.Lock()


def following() -> bool:
    """Whether the loop follows its waiters now (and then does not spin itself)."""
    config = current_config()
    return (
        _getcpu is not None
        and len(PROCESS_MASK) >= 2
        and config.wait_spin > 0
        and config.loop_follows_waiter
    )


def note_waiting() -> None:
    """The calling thread is about to wait for the runtime: the loop should come to its CPU
    (not the loop itself, awaiting a Future in a task of its own). Nothing where the loop
    does not follow (a crowded process's waiters, per message: the foreign call costs more
    than the check)."""
    if _getcpu is not None and following() and threading.get_native_id() != _state.loop:
        _state.waiter = _getcpu()  # type: ignore[operator]


def follow(spin: float) -> bool:
    """On the loop thread, at the end of a batch: be on the CPU of the thread that waits;
    whether the loop follows its waiter (it then does not spin itself). ``spin``: how long
    waiters spin now (0 while the machine has no CPU to spare: then the loop is unpinned,
    for the scheduler to run it wherever a CPU is free)."""
    if spin <= 0 or _state.hosting or not following():
        _unpin_loop()
        return False
    me = threading.get_native_id()
    if me != _state.loop:  # a loop thread started since the last one (which may be gone)
        _unpin_loop()
    cpu = _state.waiter
    if cpu >= 0 and cpu != _state.pinned and cpu in PROCESS_MASK and _pin(frozenset({cpu})):
        _state.loop = me
        _state.pinned = cpu
        _state.ever = True
        _announce(cpu)
    return True


def _unpin_loop() -> None:
    if _state.pinned >= 0:
        loop = _state.loop
        # The thread may have ended since (its runtime stopped), and its id be another
        # process's thread now: only one of this process's is given its CPUs back.
        if loop == threading.get_native_id() or os.path.exists(f"/proc/self/task/{loop}"):
            _pin(PROCESS_MASK, loop)
        _state.pinned = -1
        _announce(-1)


@contextlib.contextmanager
def hosting() -> Iterator[None]:
    """Around user code that runs on the loop (a ``Future.then`` function, an
    accumulator's ``combine``, an ``async`` endpoint of a sync actor): the loop is unpinned
    while it runs, so the threads and processes it starts get the process's CPUs, as do
    the pools torch starts at its first parallel op."""
    with _hosting_lock:
        _state.hosting += 1
    try:
        _unpin_loop()
        yield
    finally:
        with _hosting_lock:
            _state.hosting -= 1


def unpin_this_thread() -> None:
    """First thing in a thread the layers start: the process's CPUs, not the loop's one
    (a thread inherits the mask of the thread that started it)."""
    if _state.ever:
        _pin(PROCESS_MASK)


def _announce(cpu: int) -> None:
    """Say in the environment whether (and where) the loop is pinned, to the processes
    started meanwhile (set, never removed: a variable that comes and goes would have the
    C library grow the environment while other threads may read it)."""
    os.environ[MASK_ENV] = f"{cpu}:{_MASK_TEXT}"
