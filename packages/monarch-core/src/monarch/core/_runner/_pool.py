"""The threads that run a process's sync actors: a thread each, then one bounded pool.

Upstream gives each sync actor a thread of its own, and user code relies on it: thread-local
state set in ``__init__`` or one endpoint (torch's grad mode, the current CUDA device,
``threading.local``) is seen by the next. At thousands of actors a process (10,000 in issue
34) those threads are most of what the actors hold. So the first ``sync_actor_threads``
sync actors of a process each get a thread of their own (a pool of one, kept for the next
actor when one exits), as upstream; the sync actors beyond them share one pool of at most
``sync_actor_threads`` threads, started as they are needed, where an actor with messages
waits in the ready queue until a thread takes it. The rules:

- An actor's messages run one at a time, in the order they came (one thread at a time
  takes an actor; it handles up to ``BATCH`` of its messages, then the actor goes to the
  back of the queue if it has more, so that a busy actor does not starve the others).
- At most ``size`` threads of a pool run actor code at once. A thread that sleeps on a
  Monarch ``Future`` (an endpoint calling another actor and waiting) does not count
  meanwhile: another thread may start, so actors waiting on each other in one process
  cannot deadlock the pool. A thread blocked on anything else (a lock, a socket,
  ``time.sleep``) counts: with ``size`` such endpoints at once in the shared pool, the
  other actors that share it wait.
- In the shared pool, thread-local state set by one message is not seen by the next, which
  may run on another thread. ``sync_actor_threads = 0``: every sync actor has a thread of
  its own, however many (upstream's model, unbounded).

An idle pool keeps its threads (a thread that exits and another that starts cost more
than one asleep); one thread of the process yields the CPU ``wait_spin`` s before it sleeps
(``_spin``).
"""

from __future__ import annotations

import os
import threading
from _thread import LockType, allocate_lock
from collections import deque
from typing import Protocol

from monarch.core._config import current_config
from monarch.core._placement import note_waiting, unpin_this_thread
from monarch.core._runtime import spin, spin_seconds
from monarch.core._runtime._spin import set_blocking_listener

BATCH = 32
"""Messages of one actor a thread handles before it lets the next ready actor go first."""


class Served(Protocol):
    """An actor the pool runs (``SyncRunner``)."""

    scheduled: bool
    """In the pool's ready queue or on one of its threads (under the pool's lock)."""

    thread_name: str
    """What the pool thread running it is called meanwhile (stacks, py-spy)."""

    def has_work(self) -> bool:
        """Whether it has messages (under the pool's lock)."""
        ...

    def serve(self, batch: int) -> None:
        """Handle up to ``batch`` of its messages, on the calling pool thread."""
        ...


class ActorPool:
    """At most ``size`` threads running the code of the actors given to ``schedule``."""

    def __init__(self, size: int, name: str = "actor-pool") -> None:
        if size < 1:
            raise ValueError(f"an actor pool needs at least one thread, not {size}")
        self.size = size
        self.name = name
        self.lock = threading.Lock()
        self.parked: list[LockType] = []
        """The sleeping threads' own locks, held while they sleep: ``_cover`` releases one
        to wake its thread (a ``Condition`` made a lock per wait and ran a dozen Python
        calls per wait and notify, per message of a crowded process)."""
        self.ready: deque[Served] = deque()
        """Actors with messages that no thread has taken yet."""
        self.threads = 0
        """Threads started (they never end: see the module's doc)."""
        self.sleeping = 0
        """Threads asleep (``parked``), not yet woken."""
        self.coming = 0
        """Threads about to take from ``ready``: starting, notified, spinning, between actors."""
        self.blocked = 0
        """Threads in actor code asleep on a Future: not counted against ``size``."""
        self.own = False
        """A pool of one, the thread of one actor among the process's first (``pool_for_actor``)."""

    def active(self) -> int:
        """Threads that count against ``size`` (under the lock)."""
        return self.threads - self.sleeping - self.blocked

    def schedule(self, actor: Served) -> None:
        """``actor`` has a message and is not scheduled (under the lock): queue it, and
        wake or start a thread for it if the pool has room."""
        actor.scheduled = True
        self.ready.append(actor)
        self._cover()

    def _cover(self) -> None:
        """Get a thread for each ready actor that none is coming for, within ``size``."""
        while len(self.ready) > self.coming and self.active() < self.size:
            self.coming += 1
            if self.sleeping:
                self.sleeping -= 1
                self.parked.pop().release()  # the last to sleep: its memory is warmest
            else:
                self.threads += 1
                try:
                    threading.Thread(target=self._work, name=self.name, daemon=True).start()
                except RuntimeError:  # the process is at its limit of threads
                    self.threads -= 1
                    self.coming -= 1
                    if self.threads:  # those it has serve the queue, one after another
                        return
                    raise  # nothing would: the caller's actor cannot run

    # -- a Future's waiter (see _spin.set_blocking_listener) ---------------------------

    def blocking(self) -> None:
        with self.lock:
            self.blocked += 1
            self._cover()

    def unblocked(self) -> None:
        with self.lock:
            self.blocked -= 1

    # -- a pool thread -----------------------------------------------------------------

    def _work(self) -> None:
        unpin_this_thread()  # started by the loop, which may be pinned (``_placement``)
        _parking.lock = allocate_lock()
        _parking.lock.acquire()  # held: the thread sleeps on it until woken
        set_blocking_listener(self)
        thread = threading.current_thread()
        named = thread.name
        lock = self.lock
        lock.acquire()
        try:
            while True:  # counted in ``coming``, holding the lock
                actor = self._wait_for_work()
                lock.release()
                try:
                    if actor.thread_name is not named:  # a thread of its own: named once
                        thread.name = named = actor.thread_name
                    actor.serve(BATCH)
                finally:
                    if not self.own and named is not self.name:  # idle under its own name
                        thread.name = named = self.name
                    lock.acquire()
                    if actor.has_work():
                        self.ready.append(actor)
                    else:
                        actor.scheduled = False
                    self.coming += 1
                    if self.active() > self.size:  # a thread that slept on a Future woke
                        self.coming -= 1
                        self._sleep()
        finally:
            lock.release()

    def _wait_for_work(self) -> Served:
        """The next ready actor (under the lock, counted in ``coming``, which it leaves)."""
        global _spinning
        note_waiting()  # the loop comes to this CPU (``_placement``)
        while not self.ready:
            if not _spinning and (seconds := spin_seconds()) > 0:
                _spinning = True
                self.lock.release()
                try:
                    spin(lambda: bool(self.ready), seconds)
                finally:
                    self.lock.acquire()
                    _spinning = False
                continue
            self.coming -= 1
            self._sleep()
        self.coming -= 1
        return self.ready.popleft()

    def _sleep(self) -> None:
        """Sleep until ``_cover`` wakes this thread (which counts it in ``coming``); called
        and returns under the lock."""
        park = _parking.lock
        self.sleeping += 1
        self.parked.append(park)
        self.lock.release()
        try:
            park.acquire()
        finally:
            self.lock.acquire()


_spinning = False
"""A thread of the process's pools yields the CPU waiting for work: one at most (with a
thread per actor, ``sync_actor_threads = 0``, as many pools as actors), so that a cast to
many actors of one process does not keep them all spinning. Read and written under some
pool's lock, not all the same: two may spin at once, rarely, and no harm."""

_parking = threading.local()
"""A pool thread's lock to sleep on (``ActorPool._sleep``), made when it starts."""

_shared: ActorPool | None = None
_own: list[ActorPool] = []
"""Pools of one thread whose actor exited, kept for the next sync actor."""
_owned = 0
"""Live sync actors with a thread of their own (at most ``sync_actor_threads``)."""
_shared_lock = threading.Lock()


def pool_for_actor(name: str) -> ActorPool:
    """The pool a new sync actor runs on: a thread of its own while fewer than
    ``sync_actor_threads`` of the process's live sync actors have one (or always, at 0),
    else the shared pool. ``actor_exited`` gives an own thread back for the next."""
    global _shared, _owned
    size = current_config().sync_actor_threads
    with _shared_lock:
        if size == 0 or _owned < size:
            _owned += 1
            pool = _own.pop() if _own else ActorPool(1, "actor-pool")
            pool.own = True
            return pool
        if _shared is None:
            _shared = ActorPool(size)
        return _shared


def actor_exited(pool: ActorPool) -> None:
    """An actor of ``pool`` handled its exit: a thread it had of its own serves the next."""
    global _owned
    if pool.own:
        with _shared_lock:
            pool.own = False
            _owned -= 1
            _own.append(pool)


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it makes its own pools."""
    global _shared, _shared_lock, _owned
    _shared = None
    _own.clear()
    _owned = 0
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)
