"""The actors of one mesh in this process, and how they come to be.

``handle_spawn_actor`` starts a runner per local rank of a ``SpawnActor``; ``LocalMesh``
takes the mesh's calls off the wire in sequence order per origin and hands each to the
local actors its shape covers; their replies go back together (``Combine``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from monarch.core._config import current_config
from monarch.core._errors import RemoteFailure, SupervisionError
from monarch.core._mesh._endpoint import actor_is_async
from monarch.core._payload._serialize import dumps, loads
from monarch.core._placement import unpin_this_thread
from monarch.core._runner._context import running
from monarch.core._runtime import Runtime
from monarch.core._runtime._cast import ReceiveOrder
from monarch.core._runtime._combine import Combine
from monarch.core._runtime._messages import (
    Body,
    Call,
    PortValue,
    ShapeSpec,
    SpawnActor,
    shape_of,
)
from monarch.transport import Buffer

from ._actor_runner import ActorRunner, Unstarted
from ._async import AsyncRunner
from ._sync import SyncRunner

Read = tuple[Any, bool, tuple[Any, ...], dict[str, Any]] | BaseException
"""A spawn's payload unpickled: the class, whether it is async, its arguments; or why
it could not be (also a ``SystemExit`` from the actor's module: upstream fails the actor
with it)."""


def read_spawn(payload: Sequence[Buffer]) -> Read:
    try:
        cls, args, kwargs, mocks = loads(payload)
        if mocks is not None:
            mocks.install()  # patch_actor / patch_tensor_engine of the spawner
        is_async = actor_is_async(cls)  # a non-class fails here, as the spawn's failure
    except BaseException as exc:  # noqa: BLE001 - reported as the spawn's failure
        return exc  # a module's sys.exit() too: the thread reading it would end silently
    return cls, is_async, args, kwargs


def start_actor(runtime: Runtime, spawn: SpawnActor, read: Read) -> ActorRunner:
    """The runner of one actor of a spawn, its ``__init__`` started (sync or async by
    its endpoints); a class that cannot be read fails the actor at once."""
    if isinstance(read, BaseException):
        failed = AsyncRunner(runtime, spawn, None)
        failed.start((), {}, read)
        return failed
    cls, is_async, args, kwargs = read
    runner = (AsyncRunner if is_async else SyncRunner)(runtime, spawn, cls)
    runner.start(args, kwargs)
    return runner


def handle_spawn_actor(
    runtime: Runtime, body: SpawnActor, payload: Sequence[Buffer], sender: str
) -> None:
    """Start the actors of a spawn that live here.

    Their class and arguments are unpickled on a thread of their own: that may import
    the actor's module (torch, say: seconds, tens of them on a busy machine), and the
    loop must go on meanwhile (heartbeats, the other actors here, their calls). Calls
    for this mesh that come meanwhile wait in the router for the actors, in order,
    however long the read takes (``Runtime.spawn_arrived``).
    """
    ranks = body.ranks or (body.rank,)
    runtime.spawn_arrived(body.mesh)

    def read() -> None:
        unpin_this_thread()  # started where the loop may be pinned (``_placement``)
        reads = [read_spawn(payload) for _ in ranks]  # each actor its own arguments
        try:
            runtime.call_soon(start, reads)
        except RuntimeError:  # the proc stopped meanwhile: its loop is closed
            pass

    def start(reads: list[Read]) -> None:
        runners: list[ActorRunner] = []
        for rank, one in zip(ranks, reads, strict=True):
            spawn = body.for_ranks((rank,))
            try:
                runners.append(start_actor(runtime, spawn, one))
            except Exception as exc:  # noqa: BLE001 - no thread to run it: it fails here
                if isinstance(one, BaseException):  # why, rather than the failed runner's
                    unstarted, why = Unstarted(runtime, spawn, None), one
                else:
                    unstarted, why = Unstarted(runtime, spawn, one[0]), exc
                unstarted.fail(why)
                runners.append(unstarted)
        for runner in runners:
            running[runner.info.actor_id] = runner
        runtime.add_actor(body.mesh, LocalMesh(runtime, runners).deliver)

    try:
        threading.Thread(target=read, name=f"spawn {body.mesh}", daemon=True).start()
    except RuntimeError as exc:  # the process is at its limit of threads: the actors fail
        failure = exc
    else:
        return
    start([failure] * len(ranks))


RELEASE_WAIT = 1.0
"""Seconds a stopping proc waits for its actors' threads to end (see ``release_actors``)."""


def release_actors(runtime: Runtime) -> None:
    """The proc stops cleanly: let go of every actor here (see ``ActorRunner.release``)."""
    runners = list(running.values())
    running.clear()
    runtime.actors.clear()
    for runner in runners:
        runner.release()
    deadline = time.monotonic() + RELEASE_WAIT
    for runner in runners:
        runner.join(max(0.0, deadline - time.monotonic()))


def refuse_undeliverable(runtime: Runtime, body: Body, dest: str) -> None:
    """A call for an actor this proc does not have: the caller must not wait forever."""
    if isinstance(body, Call) and body.reply is not None:
        error = SupervisionError(f"no actor {dest!r} on {runtime.address} (never spawned or gone)")
        failure = RemoteFailure.of(error, "undeliverable message")
        runtime.send_to_port(body.reply, PortValue(0, True), dumps(failure))


class LocalMesh:
    """The actors of one mesh that live in this process (several when procs share one).

    Takes the mesh's calls off the wire in sequence order per origin (see ``_cast``) and
    hands each to the local actors its shape covers. When a call gathers replies and
    covers several of them, their replies go back together (``Combine``).
    """

    def __init__(self, runtime: Runtime, hosts: list[ActorRunner]) -> None:
        self.runtime = runtime
        self.hosts = hosts
        self.order = ReceiveOrder(
            self._dispatch,
            runtime.loop.call_later,
            lambda: current_config().message_delivery_timeout,
        )
        self._targets: dict[ShapeSpec, list[ActorRunner]] = {}

    def deliver(self, body: Body, payload: Sequence[Buffer], sender: str) -> None:
        if not isinstance(body, Call):
            return
        seq = body.seqs[0] if body.seqs else 0
        origin = body.origin or sender
        if self.order.is_next(origin, seq):  # the common case, in fewer steps
            self._dispatch((body, payload))
        else:
            self.order.accept(origin, seq, (body, payload))

    def _dispatch(self, item: tuple[Call, Sequence[Buffer]]) -> None:
        call, payload = item
        hosts = self.hosts
        if len(hosts) > 1:
            hosts = self._covered(call.shape)
            if len(hosts) > 1 and call.gather and call.reply is not None:
                combine = Combine(self.runtime, call.reply, len(hosts), fail_fast=call.tree)
                call = msgspec.structs.replace(call, reply=combine.port)
        for host in hosts:
            host.enqueue(call, payload)

    def _covered(self, spec: ShapeSpec) -> list[ActorRunner]:
        covered = self._targets.get(spec)
        if covered is None:
            if len(self._targets) >= 64:
                self._targets.clear()
            ndslice = shape_of(spec).ndslice
            covered = self._targets[spec] = [h for h in self.hosts if h.spawn.rank in ndslice]
        return covered
