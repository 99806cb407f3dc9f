"""What every actor runner does, sync or async: routing, replies, failure, stop.

A runner hosts one actor in its proc and handles its messages one at a time, in order
(``_local`` hands them over). Two kinds run actor code: ``SyncRunner`` (an actor of
``def`` endpoints, on the process's pool of threads, ``_pool``) and ``AsyncRunner``
(``async def`` endpoints, on an event loop of its own, on its thread); this base class
holds what they share.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from monarch.core._config import current_config
from monarch.core._debugger import post_mortem
from monarch.core._errors import MeshFailure, RemoteFailure, SupervisionError
from monarch.core._layout._shape import Point
from monarch.core._mesh._endpoint import EndpointProperty, endpoints_of
from monarch.core._mesh._future import wait_outcome
from monarch.core._mesh._port import Port
from monarch.core._mesh._reports import (
    aborted,
    aborted_by,
    actor_call_failed,
    actor_name,
    endpoint,
    failed_event,
    failed_report,
    oversize,
    status_event,
    supervise_raised_report,
    unhandled_event,
)
from monarch.core._payload._filling import any_pending as any_pending_fills
from monarch.core._payload._filling import deferred_fills
from monarch.core._payload._serialize import dumps, loads, loads_arguments, size_of
from monarch.core._runner._context import Context, Instance
from monarch.core._runtime import Runtime
from monarch.core._runtime._actor_logs import install_actor_log_prefix
from monarch.core._runtime._instrument import Scope, enter, instrumented, status
from monarch.core._runtime._messages import (
    STOP_METHOD,
    TO_PROC,
    ActorFailed,
    Call,
    PortRef,
    PortValue,
    ShapeSpec,
    SpawnActor,
    shape_of,
)
from monarch.transport import Buffer

log = logging.getLogger("monarch.actor")

STOP = "stop"
CALL = "call"
SUPERVISE = "supervise"
EXIT = "exit"
Item = tuple[str, Any, Sequence[Buffer]]
"""A message for the actor: its kind (``CALL``, ``STOP``, ``SUPERVISE``, ``EXIT``) and content."""


class ActorRunner:
    """Runs one actor inside its proc: its messages one at a time, in order."""

    def __init__(self, runtime: Runtime, spawn: SpawnActor, cls: type | None) -> None:
        """``cls``: the actor's class (``None`` when it could not be unpickled)."""
        install_actor_log_prefix()  # once per process
        self.cls = cls
        self.runtime = runtime
        self.spawn = spawn
        self.failure: BaseException | None = None
        self.stopped: str | None = None
        self.instance: Any = None
        self.endpoints: dict[str, EndpointProperty[Any]] = {}
        shape = shape_of(spawn.shape)
        self.rank = Point(shape.ndslice.index(spawn.rank), shape.extent)
        # As upstream's: unique per actor, starting with the mesh's name (see id_name).
        actor_id = f"{spawn.mesh}[{self.rank.rank}]@{runtime.address}"
        self.info = Instance(
            self.rank, spawn.name, None, actor_id, runtime.address, spawn.reply.proc
        )
        if cls is not None:
            class_name = f"{cls.__module__}.{cls.__name__}"
            self.info = dataclasses.replace(self.info, class_name=class_name)
            self.endpoints = endpoints_of(cls)
        self.actor_name = actor_name(spawn.owner, cls, spawn.name, self.rank)
        """Its name in supervision texts, as upstream's (see ``_reports``)."""
        self.info = dataclasses.replace(self.info, shown=self.actor_name)
        self.failure_report = ""
        """Once failed: what calls to it are told (``MeshFailure.report()``)."""
        self._contexts: dict[ShapeSpec, Context] = {}
        self.owned: list[Any] = []
        """Meshes this actor spawned: they are stopped before it, and die with it."""
        # What introspection reports (see ``_introspect``): plain fields, set once per
        # message by the thread or task that runs it, read by the loop when asked.
        self.handled = 0
        """Messages it has begun to handle."""
        self.current = ""
        """The endpoint it runs now ("" when idle)."""
        self.began = 0.0
        """When (``time.monotonic``) its last message began (0: none yet)."""
        self.thread: threading.Thread | None = None
        """The thread the actor's code runs on (an async actor's, ``start`` makes it)."""
        self.thread_id = 0
        """``threading.get_ident()`` of the thread running its code (a sync actor's: the
        pool thread handling its messages now, 0 between them)."""

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Make the actor (``cls(*args, **kwargs)``) where its code runs, then serve."""
        raise NotImplementedError

    # -- routing -----------------------------------------------------------------------

    def _put(self, item: Item) -> None:
        """Queue a message for the actor's code (the loop thread, or the actor's own)."""
        raise NotImplementedError

    def _on_own_thread(self) -> bool:
        """Whether the caller runs the actor's code (is the actor's thread)."""
        return threading.get_ident() == self.thread_id

    def request_stop(self, reason: str) -> None:
        """Stop once the messages queued so far are handled (from any thread).

        From the actor's own code the stop is queued at once, before the reply to the
        message being handled goes out: a call sent after that reply is refused."""
        stop = (STOP, Call(self.spawn.mesh, STOP_METHOD, self.spawn.shape), dumps(reason))
        if self.runtime.on_loop() or self._on_own_thread():
            self._put(stop)
        else:
            self.runtime.call_soon(self._put, stop)

    def release(self) -> None:
        """The proc is stopping cleanly: after the messages queued so far, the actor's
        code stops running and its object is let go (from the loop). Nothing here then
        holds its class, so its module's globals are finalized at exit (their ``__del__``
        runs, as upstream's do)."""
        self._put((EXIT, None, ()))

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a released actor's code to have stopped."""
        if self.thread is not None:
            self.thread.join(timeout)

    def queued(self) -> int:
        """How many messages wait for the actor's code."""
        return 0

    def enqueue(self, call: Call, payload: Sequence[Buffer]) -> None:
        """A call for this actor, in order (see ``_local``)."""
        # A stop is queued like any message: it drains what came before it.
        self._put((STOP if call.method == STOP_METHOD else CALL, call, payload))

    def supervise(self, failure: MeshFailure) -> None:
        """A mesh this actor owns failed: ``__supervise__`` runs between messages."""
        self._put((SUPERVISE, failure, ()))

    def request_abort(self, reason: str) -> None:
        """Fail now (from any thread): as if an endpoint had raised with nobody to tell."""
        self._fail(RuntimeError(reason), aborted(reason))

    def _scope(self, call: Call, parts: Sequence[Buffer]) -> Scope | None:
        """The instrumentation's scope of the endpoint ``call`` runs, on the thread or task
        that runs it (see ``_instrument``); None without instrumentation."""
        if not instrumented():
            return None
        return enter(
            type(self.instance),
            call.method,
            self.info.actor_id,
            call.mesh,
            self.rank.rank,
            call.trace,
            parts,
            self.queued,
        )

    def _context_for(self, call: Call) -> Context:
        """The context of a message: this actor's rank within the shape it was cast to
        (cached per shape)."""
        context = self._contexts.get(call.shape)
        if context is None:
            if len(self._contexts) >= 64:
                self._contexts.clear()
            shape = shape_of(call.shape)
            point = Point(shape.ndslice.index(self.spawn.rank), shape.extent)
            context = self._contexts[call.shape] = Context(self.info, point)
        return context

    def _endpoint(self, call: Call) -> EndpointProperty[Any] | None:
        prop = self.endpoints.get(call.method)
        if prop is None and not call.method.startswith("_"):
            # A plain method called through as_endpoint().
            method = getattr(type(self.instance), call.method, None)
            if callable(method):
                prop = EndpointProperty(method, explicit_response_port=call.explicit)
        return prop

    def _prepare(
        self, call: Call, parts: Sequence[Buffer], context: Context
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        """The function to run for a call, and its arguments."""
        args, kwargs = loads_arguments(parts)
        prop = self._endpoint(call)
        if prop is None:
            raise AttributeError(f"{type(self.instance).__name__} has no endpoint {call.method!r}")
        if prop._explicit_response_port:
            reply = call.reply
            rank = context.message_rank.rank
            port: Port[Any] | _DropPort = Port(reply, rank) if reply is not None else _DropPort()
            return _no_result(prop._method), (self.instance, port, *args), kwargs
        return prop._method, (self.instance, *args), kwargs

    def _conclude(
        self,
        call: Call,
        context: Context,
        result: Any,
        exc: BaseException | None,
        batch: list[Any] | None = None,
    ) -> None:
        """Reply with what a call returned or raised; what cannot go back fails the actor."""
        reply = call.reply
        rank = context.message_rank.rank
        if exc is None:
            if reply is not None and result is not _NO_RESULT:
                self._reply(reply, result, rank=rank, batch=batch, method=call.method)
            return
        post_mortem(exc)  # a session first, if a breakpoint stopped in this endpoint
        if reply is not None and isinstance(exc, Exception) and not call.explicit:
            self._reply(reply, exc, error=True, rank=rank, batch=batch, method=call.method)
            return
        # As upstream's, the actor fails: a BaseException (SystemExit...), an exception
        # with nobody to tell (broadcast), or one that an endpoint answering through its
        # own port let escape. Its caller, if any, is told so.
        self._fail(exc, aborted_by(exc))
        if reply is not None:
            self._refuse(call, batch)

    def _refuse(self, call: Call, batch: list[Any] | None = None) -> None:
        if call.reply is None:
            return
        if self.stopped is not None:
            why = status_event(self.actor_name, self.stopped)
        else:
            why = self.failure_report
        error = SupervisionError(why, endpoint(self.spawn.name, call.method))
        rank = self._context_for(call).message_rank.rank
        self._reply(call.reply, error, error=True, rank=rank, batch=batch)

    def _supervise_handler(
        self, failure: MeshFailure
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        if self.failure is not None or self.stopped is not None:
            raise NoHandler
        handler = getattr(type(self.instance), "__supervise__", None)
        if handler is None:
            self._fail_unhandled(failure)
            raise NoHandler
        return handler, (self.instance, failure), {}

    def _supervised(self, failure: MeshFailure, handled: Any) -> None:
        """What ``__supervise__`` returned (or raised): a falsy value fails the actor."""
        if isinstance(handled, BaseException) and not isinstance(handled, Exception):
            self._fail(handled, aborted_by(handled))  # a KeyboardInterrupt: its traceback
        elif isinstance(handled, Exception):
            name = self.actor_name
            event = failed_event(name, aborted_by(handled))  # the traceback, for the logs
            report = supervise_raised_report(name, handled, failure.report())
            self._failed(handled, event, report)
        elif not handled:
            self._fail_unhandled(failure)

    def _constructed(self, failure: BaseException | None) -> None:
        """``__init__`` ended (raising ``failure``, if not None): tell whoever waits for the
        spawn (the spawner, or the host agent that relayed it: ``SpawnActor.ack``); a
        failure fails the actor."""
        spawn = self.spawn
        reply = spawn.ack or spawn.reply
        if failure is not None:
            self._reply(reply, failure, error=True, method="__init__")
            self._fail(failure, aborted_by(failure))
        else:
            status(spawn.mesh, self.rank.rank, "Running")
            self._reply(reply, None)

    def _fail(self, exc: BaseException, reason: str) -> None:
        """The actor has failed (from any thread) for ``reason`` (see ``_reports``)."""
        name = self.actor_name
        self._failed(exc, failed_event(name, reason), failed_report(name, reason))

    def _fail_unhandled(self, failure: MeshFailure) -> None:
        """The actor has failed: a mesh it owns failed, and it did not handle that."""
        event = unhandled_event(self.actor_name, failure.event)
        self._failed(failure, event, failure.report())

    def _failed(self, exc: BaseException, event: str, report: str) -> None:
        """The actor has failed: it answers every later call with a SupervisionError
        (``report``), its owner hears of it (``event``), and its meshes die with it."""
        if self.failure is not None:
            return
        self.failure = exc
        self.failure_report = report
        log.error("%s", event)  # the event holds the traceback
        status(self.spawn.mesh, self.rank.rank, "Failed", report)
        failed = ActorFailed(self.spawn.mesh, self.spawn.rank, event, report)
        self.runtime.post(self.spawn.reply.proc, TO_PROC, "", failed)
        if self.owned:
            self.runtime.call_soon(
                self.runtime.spawn_task, self._stop_owned(f"owner {self.info.actor_id} failed")
            )

    async def _stop_owned(self, reason: str) -> None:
        owned, self.owned = self.owned, []
        for mesh in reversed(owned):
            try:
                await wait_outcome(mesh.stop(reason)._cf)
            except Exception:
                log.exception("stopping %r owned by %s failed", mesh, self.info.actor_id)

    def _reply_stopped(self, stop: Call) -> None:
        status(self.spawn.mesh, self.rank.rank, "Stopped", self.stopped or "")
        if stop.reply is not None:
            self._reply(stop.reply, None, rank=self._context_for(stop).message_rank.rank)

    def _reply(
        self,
        port: PortRef,
        value: Any,
        *,
        error: bool = False,
        rank: int = 0,
        batch: list[Any] | None = None,
        method: str = "",
    ) -> None:
        """Send a value or an error to a port (from any thread; see ``Runtime.post``);
        ``method``: the endpoint whose call raised the error."""
        if error:
            value = RemoteFailure.of(value, actor_call_failed(self.spawn.name, method))
        with deferred_fills:  # a large tensor returned is copied as it travels
            self._send_reply(port, value, error, rank, batch, method)

    def _send_reply(
        self,
        port: PortRef,
        value: Any,
        error: bool,
        rank: int,
        batch: list[Any] | None,
        method: str,
    ) -> None:
        try:
            payload = dumps(value)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result fails the call
            problem = TypeError(f"cannot pickle the result of {self.info.actor_id}: {exc}")
            payload = dumps(RemoteFailure.of(problem, actor_call_failed(self.spawn.name, method)))
            error = True
        limit = current_config().codec_max_frame_length
        first = payload[0]
        if not (len(payload) == 1 and type(first) is bytes and len(first) <= limit):
            size = size_of(payload)
            if size > limit:  # not sent: the actor fails, as upstream's does
                reason = oversize(size, limit)
                self._fail(RuntimeError(reason), reason)
                refusal = SupervisionError(self.failure_report, endpoint(self.spawn.name, method))
                message = actor_call_failed(self.spawn.name, method)
                payload = dumps(RemoteFailure.of(refusal, message))
                error = True
        self.runtime.send_to_port(port, PortValue(rank, error), payload, batch)
        if batch and any_pending_fills():
            self.runtime.flush_writes(batch)  # out now: its copy waits for its reader


class NoHandler(Exception):
    """No ``__supervise__`` runs (the actor is done, or has none and has failed)."""


_NO_RESULT: Any = object()
"""What an explicit-response endpoint returns: it replies through its port itself."""


def _no_result(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            await method(*args, **kwargs)
            return _NO_RESULT

        return run_async

    def run(*args: Any, **kwargs: Any) -> Any:
        method(*args, **kwargs)
        return _NO_RESULT

    return run


class _DropPort:
    """The port an explicit-response endpoint gets when the caller wants no reply."""

    def send(self, obj: object) -> None:
        pass

    def exception(self, exc: BaseException) -> None:
        pass


class Unstarted(ActorRunner):
    """An actor whose code cannot run at all, nor its failure be told from a thread of its
    own: none could be started (the process is at its limit of threads). It fails at once,
    from the loop, and answers every call there with that failure."""

    def fail(self, failure: BaseException) -> None:
        self._constructed(failure)

    def _put(self, item: Item) -> None:
        kind, message, parts = item
        if kind == STOP:
            if self.stopped is None:
                self.stopped = str(loads(parts))
            self._reply_stopped(message)
        elif kind == CALL:
            self._refuse(message)
