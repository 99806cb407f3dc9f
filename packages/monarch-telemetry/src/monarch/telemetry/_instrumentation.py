"""The core's instrumentation (``monarch.core`` hooks) on OpenTelemetry.

A call made in a span carries the W3C ``traceparent`` of a short "send" span, a child of
that span; the endpoint it reaches runs in a span that continues that trace, so a client's
span, each send and each actor's endpoint (and the spans and calls in it) form one trace,
across casts too. A call made outside any span carries nothing (no send span: a call costs
less) and its endpoint's span starts a trace of its own. The built-in metrics count calls
and errors and time endpoints.
"""

from __future__ import annotations

import contextvars
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from opentelemetry import context, metrics, trace
from opentelemetry.metrics import _internal as _metrics
from opentelemetry.metrics._internal import _ProxyMeterProvider as _PROXY_METER_PROVIDER
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from monarch.config import configure
from monarch.core import current_instrumentation, running_runtime, set_instrumentation
from monarch.transport import Buffer

from ._export import configure_export, shutdown_export
from ._instruments import instruments, tracer
from ._observed import (
    PROC_LOST,
    endpoint_span_row,
    message_key,
    operation_span_row,
    proc_rows,
    proc_status_row,
    send_rows,
    supervision_row,
)
from ._snapshots import remember_lost, start_snapshots
from ._sql import (
    CLIENT,
    QueryEngineClient,
    RowShipper,
    TelemetryConfig,
    TelemetryStore,
    actor_key,
    current_sink,
    event_id,
    flush_rows,
    key,
    lost_row,
    mesh_rows,
    message_row,
    message_status_row,
    now_us,
    open_store,
    procs_row,
    sent_row,
    split_actor_id,
    status_row,
    system_actor_rows,
    system_stopped_row,
    view_json,
)

_propagator: Final = TraceContextTextMapPropagator()
_CLIENT_KEY: Final = key(CLIENT)
_current: contextvars.ContextVar[tuple[int, int | None]] = contextvars.ContextVar(
    "monarch_telemetry_current", default=(_CLIENT_KEY, None)
)
"""The actor whose endpoint runs here (its key in the tables: the sender of its calls) and
the ``send`` span of that endpoint's message (where its call carried one: the parent of
the operations it does, a tensor engine's ops). One variable: one set per endpoint."""
_bases: dict[str, Any] = {}
"""The slice of its proc mesh that each actor mesh spawned here covers, by mesh id: a
send's destination ranks are positions in it (elsewhere: the proc mesh's whole)."""
_in_proc = False
"""Whether this process is a proc (not the client): set by ``install()``."""
_SENDER: Final = "|"
"""What a call carries: ``TRACEPARENT|SENDER`` where the job keeps tables (the sender's key
fills ``messages.from_actor_id``), else the traceparent alone."""


class Rows:
    """A handled message's rows: ``active`` when it starts, ``complete`` and its endpoint
    span when done (also the endpoint's whole scope where only the job's tables record:
    no SDK). Its id is the one its sender's ``send`` span has, where the call carried it."""

    __slots__ = ("actor", "endpoint", "message", "parent", "sink", "start", "token")

    def __init__(
        self, sink: TelemetryStore | RowShipper, actor: int, endpoint: str, sender: str
    ) -> None:
        self.sink = sink
        self.actor = actor
        self.endpoint = endpoint
        sender, _, carried = sender.partition(_SENDER)
        self.parent = message_key(int(carried), actor) if carried.isdigit() else None
        self.message = self.parent if self.parent is not None else event_id()
        origin = int(sender) if sender.isdigit() else None
        self.start = start = now_us()
        sink.add(
            [
                message_row(self.message, origin, actor, endpoint, start),
                message_status_row(self.message, "active", start),
            ]
        )
        self.token = _current.set((actor, self.parent))

    def close(self, error: BaseException | None = None) -> None:
        end = now_us()
        span = endpoint_span_row(
            event_id(),
            self.parent,
            self.endpoint,
            here(),
            self.actor,
            self.start,
            end,
            error is None,
        )
        self.sink.add([message_status_row(self.message, "complete", end), span])
        _current.reset(self.token)


class EndpointScope:
    """An endpoint's span, current on its thread or task until closed."""

    __slots__ = ("attributes", "endpoint", "rows", "span", "start", "token")

    def __init__(
        self,
        endpoint: str,
        actor: str,
        rank: int,
        carried: str,
        size: int,
        waiting: int,
        rows: Rows | None,
    ) -> None:
        self.rows, self.endpoint = rows, endpoint
        parent = _propagator.extract({"traceparent": carried}) if carried else None
        self.attributes = _attributes.get(endpoint) or _attributes.setdefault(
            endpoint, {"monarch.endpoint": endpoint}
        )
        measured = instruments()
        measured.payload.record(size, self.attributes)
        measured.queue_depth.set(actor, waiting)
        self.span = tracer().start_span(
            endpoint,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={"monarch.actor": actor, "monarch.rank": rank, **self.attributes},
        )
        self.token = context.attach(trace.set_span_in_context(self.span))
        self.start = time.perf_counter()

    def close(self, error: BaseException | None) -> None:
        measured = instruments()
        measured.duration.record(time.perf_counter() - self.start, self.attributes)
        measured.handled.add(self.endpoint)
        if error is not None:
            measured.errors.add(self.endpoint)
            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.span.end()
        context.detach(self.token)
        if self.rows is not None:
            self.rows.close(error)


_attributes: dict[str, dict[str, str]] = {}
"""Each endpoint's metric attributes, made once (the SDK reads, never changes them)."""


class Operation:
    """An operation's span (a cast relay, an RDMA transfer, a tensor-engine op), written
    when it is done, on the track of the actor that did it."""

    __slots__ = ("actor", "kind", "name", "parent", "sink", "start")

    def __init__(
        self,
        sink: TelemetryStore | RowShipper,
        kind: str,
        name: str,
        actor: int,
        parent: int | None,
    ) -> None:
        self.sink, self.kind, self.name, self.actor = sink, kind, name, actor
        self.parent = parent
        self.start = time.time_ns()

    def close(self, error: BaseException | None) -> None:
        end, ok = time.time_ns(), error is None
        row = operation_span_row(
            event_id(), self.kind, self.name, here(), self.actor, self.start, end, ok, self.parent
        )
        self.sink.add([row])


class _Idle:
    """The scope of an endpoint when nothing records (see ``idle``)."""

    __slots__ = ()

    def close(self, error: BaseException | None) -> None:
        pass


IDLE: Final = _Idle()


def idle() -> bool:
    """Whether no SDK is installed to record spans or metrics in this process: then the
    hooks do nothing (OpenTelemetry's no-op API would still cost a call its span, context
    and instrument calls). Checked per call: an application may install one later."""
    if trace._TRACER_PROVIDER is None and _metrics._METER_PROVIDER is None and not _FROM_ENV:
        return True  # none set (what the getters would find out, at ~10x the cost)
    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) and isinstance(
        metrics.get_meter_provider(), _PROXY_METER_PROVIDER
    )


_FROM_ENV: Final = any(
    name in os.environ for name in ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")
)
"""Providers named in the environment, which the getters load on first use."""


class OpenTelemetry:
    """Spans and metrics through OpenTelemetry; rows for the job's SQL tables where they
    are kept (``_sql``)."""

    def outgoing(self, mesh: str, method: str, mesh_id: str = "", view: Any = None) -> str:
        sink = current_sink()
        if sink is None:
            return "" if idle() else self._traceparent(mesh, method)
        sender = _current.get()[0]
        message = event_id()
        if view is not None:
            actors, seen, mesh_key = _destinations(mesh_id, view)
            stamp = now_us()
            sends = send_rows(message, sender, here(), f"send {mesh}.{method}", actors, stamp)
            sends.append(sent_row(sender, mesh_key, seen, stamp))
            sink.add(sends)
        carried = "" if idle() else self._traceparent(mesh, method)
        return f"{carried}{_SENDER}{sender}{_SENDER}{message}"

    def _traceparent(self, mesh: str, method: str) -> str:
        instruments().sent.add(f"{mesh}.{method}")
        if not trace.get_current_span().get_span_context().is_valid:
            return ""  # no trace to continue: the endpoint's span starts its own
        send = tracer().start_span(f"send {mesh}.{method}", kind=SpanKind.PRODUCER)
        carrier: dict[str, str] = {}
        _propagator.inject(carrier, trace.set_span_in_context(send))
        send.end()
        return carrier.get("traceparent", "")

    def enter(
        self,
        cls: type,
        method: str,
        actor: str,
        mesh: str,
        rank: int,
        carried: str,
        payload: Sequence[Buffer],
        waiting: Callable[[], int],
    ) -> EndpointScope | Rows | _Idle:
        sink = current_sink()
        nothing_records = idle()
        if sink is None and nothing_records:
            return IDLE  # the defaults: nothing computed
        endpoint = f"{cls.__name__}.{method}"
        carried, _, sender = carried.partition(_SENDER)
        rows = None if sink is None else Rows(sink, actor_key(mesh, rank), endpoint, sender)
        if nothing_records:
            return IDLE if rows is None else rows
        size = sum(memoryview(part).nbytes for part in payload)
        return EndpointScope(endpoint, actor, rank, carried, size, waiting(), rows)

    def spawned(
        self, mesh: str, name: str, cls: str, shape: Any, procs: str, owner: str = CLIENT
    ) -> None:
        sink = current_sink()
        if sink is not None:
            sink.add(mesh_rows(mesh, name, cls, shape, procs, owner))
            _bases[mesh] = shape.ndslice

    def procs_spawned(self, mesh: str, name: str, shape: Any) -> None:
        sink = current_sink()
        if sink is not None:
            sink.add([procs_row(mesh, name, shape)])

    def status(self, mesh: str, rank: int, status: str, reason: str) -> None:
        _local_ranks[mesh] = rank
        sink = current_sink()
        if sink is not None:
            sink.add([status_row(mesh, rank, status, reason)])

    def supervision(
        self, mesh: str, ranks: int, lost: Sequence[str] = (), report: str = ""
    ) -> None:
        if not idle():
            instruments().supervision.add(ranks, {"monarch.mesh": mesh})
        sink = current_sink()
        if sink is not None:
            stamp = now_us()
            sink.add([supervision_row(mesh, ranks, report, here(), stamp, event_id())])
        if lost:  # actors lost with their proc: they could not send their Failed rows
            remember_lost(lost, report)
            if sink is not None:
                sink.add([lost_row(actor, report) for actor in lost])
                dead = {split_actor_id(actor)[1] for actor in lost}
                sink.add([(PROC_LOST, (address, report or None, now_us())) for address in dead])

    def begin(self, kind: str, name: str, carried: str = "", to: str = "") -> Operation | _Idle:
        sink = current_sink()
        if sink is None:
            return IDLE
        actor, within = _current.get()  # the actor whose endpoint does it, else the agent
        if kind == "relay" or (actor == _CLIENT_KEY and _in_proc):
            actor = key(f"proc_agent@{here()}")
        return Operation(sink, kind, name, actor, _cause(carried, to, within))

    def shutdown(self) -> None:
        sink = current_sink()
        if sink is not None:
            stamp = now_us()
            stopped = proc_status_row(here(), "Stopped", None, stamp, event_id())
            sink.add([stopped, system_stopped_row(here(), stamp)])
        flush_rows()
        shutdown_export()


def _cause(carried: str, to: str, within: int | None) -> int | None:
    """The ``send`` span an operation follows from: that of the message it passes on (a
    relay: the call's message to actor ``to``, the relaying proc's own), else that of the
    endpoint it runs in (a tensor engine's op), where the call carried a message id."""
    message = carried.rpartition(_SENDER)[2] if to else ""
    if message.isdigit():  # ``to``: a cast's actor mesh (its actor here), or an actor
        rank = _local_ranks.get(to)
        actor = actor_key(to, rank) if rank is not None else key(split_actor_id(to)[0])
        return message_key(int(message), actor)
    return within


_local_ranks: dict[str, int] = {}
"""The rank of an actor of each actor mesh in this process, by mesh id (a cast is
addressed to the mesh), known once it runs (``status``): a relay of a call that comes
before (the first after a spawn, which waits in the actors' queues while they start) has
no cause."""


_destined: dict[tuple[str, int], tuple[Any, list[int], str, int]] = {}
"""Per actor mesh and view cast to (by identity: a mesh casts with the same ``Shape``
each time), what its send rows need: the view (kept, so that its id is not reused), the
destination actors' keys, its ``view_json`` and the mesh's key."""


def _destinations(mesh_id: str, view: Any) -> tuple[list[int], str, int]:
    """The keys of the actors a cast of mesh ``mesh_id`` to ``view`` reaches, the view's
    ``view_json`` and the mesh's key: computed once per mesh and view, not per call."""
    known = _destined.get((mesh_id, id(view)))
    if known is not None and known[0] is view:
        return known[1], known[2], known[3]
    base = _bases.get(mesh_id)  # a view's ranks are its proc mesh's: the actors'
    ranks = [base.index(r) for r in view.ndslice] if base else view.ndslice
    actors = [actor_key(mesh_id, rank) for rank in ranks]
    if len(_destined) >= 1024:
        _destined.clear()
    known = _destined[mesh_id, id(view)] = (view, actors, view_json(view), key(mesh_id))
    return known[1], known[2], known[3]


def enable_telemetry(config: TelemetryConfig | None = None) -> QueryEngineClient:
    """Keep this job's telemetry tables here (the client), filled by this process and by
    every proc spawned from now on (instrumented), and its snapshots (every
    ``snapshot_interval_secs``); returns the client to query them."""
    install()
    first = current_sink() is None
    engine = open_store(config)
    if first:
        stamp = now_us()
        engine.store.add(proc_rows(here(), "client", stamp, event_id()))
        engine.store.add(system_actor_rows(here(), True, stamp))
    start_snapshots(engine.store)
    return engine


def install() -> None:
    """Instrument this process (once); procs spawned from it afterwards load it too (the
    ``enable_telemetry`` configuration key, which they inherit). Importing
    ``monarch.telemetry`` does not: using it does (``span``, ``traced``, ``get_meter``,
    ``enable_telemetry``, or asking ``monarch.actor`` for one of those)."""
    if isinstance(current_instrumentation(), OpenTelemetry):
        return
    runtime = running_runtime()
    in_proc = runtime is not None and bool(runtime.root) and runtime.root != runtime.address
    global _in_proc
    _in_proc = in_proc
    configure_export("monarch-proc" if in_proc else "monarch-client")
    set_instrumentation(OpenTelemetry())
    configure(enable_telemetry=True)
    sink = current_sink() if in_proc else None
    if sink is not None:  # a proc of a job that keeps its tables: it runs
        stamp = now_us()
        sink.add(proc_rows(here(), "proc", stamp, event_id()))
        sink.add(system_actor_rows(here(), False, stamp))


def here() -> str:
    """This process's address (the ``proc`` of its rows; forgotten in a forked child: a
    zygote's forks are other procs)."""
    if _address:
        return _address[0]
    runtime = running_runtime()
    if runtime is None:
        return ""
    _address.append(runtime.address)
    return _address[0]


_address: list[str] = []
os.register_at_fork(after_in_child=_address.clear)
