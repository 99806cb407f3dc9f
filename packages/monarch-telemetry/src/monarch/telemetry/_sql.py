"""Job telemetry by SQL: tables of meshes, actors, their status changes and the messages
they handle, at the client, queried with DuckDB (upstream's ``enable_telemetry`` and
``query_engine_client.query``; its table and column names).

DuckDB: embedded (no server to run), one pip wheel, and a full SQL dialect with joins and
window functions over columnar tables, which suits "messages per actor per second" queries
over millions of rows; the rows are appended in batches, where it is fastest.

Rows come from the instrumentation: the client's own go straight in; a proc's are batched
and sent to a port of the client's store every ``SHIP_EVERY`` seconds (and when it stops),
through the ``telemetry_sink`` configuration key that procs inherit. The owner of a mesh
writes the ``Failed`` rows of its actors lost with a proc (``LOST``); the snapshot tables
are the client's (``_snapshots``).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import itertools
import json
import os
import pickle
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from monarch.config import configure
from monarch.core import (
    ROOT,
    Point,
    PortRef,
    PortValue,
    Runtime,
    actor_name,
    current_config,
    current_runtime,
    install_hint,
    running_runtime,
)
from monarch.transport import Buffer

from ._observed import OBSERVED_SCHEMA, PROC_LOST, VIEWS

SHIP_EVERY: Final = 0.2
"""Seconds between a proc's batches of rows."""
RETAIN_EVERY: Final = 1.0
"""Seconds between two applications of the retention limit."""

SCHEMA: Final = {
    "meshes": (
        "id BIGINT, given_name VARCHAR, class VARCHAR, full_name VARCHAR, "
        "parent_mesh_id BIGINT, shape_json VARCHAR, timestamp_us BIGINT, "
        "parent_view_json VARCHAR"
    ),
    "actors": (
        "id BIGINT, mesh_id BIGINT, rank BIGINT, full_name VARCHAR, display_name VARCHAR, "
        "timestamp_us BIGINT, is_system BOOLEAN, upstream_name VARCHAR"
    ),
    "actor_status_events": (
        "id BIGINT, actor_id BIGINT, new_status VARCHAR, reason VARCHAR, timestamp_us BIGINT"
    ),
    "messages": (
        "id BIGINT, from_actor_id BIGINT, to_actor_id BIGINT, endpoint VARCHAR, "
        "port_index BIGINT, timestamp_us BIGINT"
    ),
    "message_status_events": ("id BIGINT, message_id BIGINT, status VARCHAR, timestamp_us BIGINT"),
    "sent_messages": (
        "id BIGINT, sender_actor_id BIGINT, actor_mesh_id BIGINT, view_json VARCHAR, "
        "shape_json VARCHAR, timestamp_us BIGINT"
    ),
}
"""Upstream's tables (same names and columns; the ids are ours; ``actors`` has two more:
``is_system`` and ``upstream_name``, the name failure reports give the actor)."""

SNAPSHOT_SCHEMA: Final = {
    "snapshots": "snapshot_id VARCHAR, snapshot_ts BIGINT",
    "nodes": "snapshot_id VARCHAR, node_id VARCHAR, node_kind VARCHAR, as_of BIGINT",
    "children": (
        "snapshot_id VARCHAR, parent_id VARCHAR, child_id VARCHAR, child_sort_key BIGINT, "
        "is_system BOOLEAN, is_stopped BOOLEAN"
    ),
    "root_nodes": (
        "snapshot_id VARCHAR, node_id VARCHAR, num_hosts BIGINT, started_at BIGINT, "
        "started_by VARCHAR"
    ),
    "host_nodes": "snapshot_id VARCHAR, node_id VARCHAR, addr VARCHAR, host_num_procs BIGINT",
    "proc_nodes": (
        "snapshot_id VARCHAR, node_id VARCHAR, proc_name VARCHAR, num_actors BIGINT, "
        "is_poisoned BOOLEAN, failed_actor_count BIGINT"
    ),
    "actor_nodes": (
        "snapshot_id VARCHAR, node_id VARCHAR, actor_status VARCHAR, actor_type VARCHAR, "
        "messages_processed BIGINT, created_at BIGINT, last_message_handler VARCHAR, "
        "queue_depth BIGINT, is_system BOOLEAN"
    ),
    "actor_failures": (
        "snapshot_id VARCHAR, node_id VARCHAR, failure_error_message VARCHAR, "
        "failure_occurred_at BIGINT"
    ),
    "resolution_errors": (
        "snapshot_id VARCHAR, node_id VARCHAR, error_code VARCHAR, error_message VARCHAR"
    ),
}
"""Upstream 0.7.0's snapshot tables (``_snapshots``), with the columns our snapshots fill
(upstream's names; its others are left out, see the README)."""

LOST: Final = "lost"
"""Rows ``(actor id, reason, timestamp_us)`` of actors lost with their proc: each becomes a
``Failed`` row of ``actor_status_events`` unless the actor already has a terminal one."""
_TERMINAL: Final = "('Failed', 'Stopped')"

CLIENT: Final = ROOT
"""The name the client's actor is known by (the owner of the meshes it spawns)."""

Row = tuple[str, tuple[Any, ...]]
"""(table, values in its column order)."""
_TABLES: Final = {*SCHEMA, *SNAPSHOT_SCHEMA, *OBSERVED_SCHEMA, LOST, PROC_LOST}


class TelemetryQueryError(ValueError):
    """A query the engine could not run (bad SQL, an unknown table or column)."""


@dataclass
class TelemetryConfig:
    """Upstream's: how long rows are kept (``retention_secs``; 0: for ever); on a job
    (monarch-jobs), ``include_dashboard`` serves monarch-admin's dashboard page at
    ``dashboard_port`` (its ``state.dashboard_url``); a snapshot of the job's procs and
    actors every ``snapshot_interval_secs`` (0: none)."""

    retention_secs: int = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0

    def __post_init__(self) -> None:
        secs = self.retention_secs
        if isinstance(secs, bool) or not isinstance(secs, int):
            raise TypeError(f"retention_secs is a number of seconds, not {secs!r}")
        if secs < 0:
            raise ValueError(f"retention_secs must be 0 (keep all) or more, not {secs}")
        every = self.snapshot_interval_secs
        if isinstance(every, bool) or not isinstance(every, int | float):
            raise TypeError(f"snapshot_interval_secs is a number of seconds, not {every!r}")
        if not every >= 0:  # NaN too
            raise ValueError(f"snapshot_interval_secs must be 0 (off) or more, not {every}")


def key(name: str) -> int:
    """A stable 63-bit id for a name (a mesh, ``mesh[rank]`` for an actor)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") >> 1


def now_us() -> int:
    return time.time_ns() // 1000


class _Ids:
    """Row ids unique across the job without a system call each (``secrets`` reads the
    kernel's random source per id): a random 63-bit base per process, drawn again in a
    forked child, plus a counter."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self.base = secrets.randbits(63)
        self.count = itertools.count()


_MASK: Final = (1 << 63) - 1
_ids: Final = _Ids()


def event_id() -> int:
    return (_ids.base + next(_ids.count)) & _MASK


# -- rows, from the hooks --------------------------------------------------------------------


_COMPACT: Final = (",", ":")
"""JSON as upstream's (serde's) spells it: no spaces."""


def view_json(view: Any) -> str:
    """A ``Shape`` as upstream's ``view_json`` spells it (labels, and the slice of the mesh
    it covers)."""
    ndslice = view.ndslice
    sliced = {"offset": ndslice.offset, "sizes": ndslice.sizes, "strides": ndslice.strides}
    return json.dumps({"labels": list(view.labels), "slice": sliced}, separators=_COMPACT)


def shape_json(view: Any) -> str:
    """A ``Shape``'s extent as upstream's ``shape_json`` spells it."""
    inner = {"labels": list(view.labels), "sizes": view.ndslice.sizes}
    return json.dumps({"inner": inner}, separators=_COMPACT)


def procs_row(mesh: str, name: str, shape: Any) -> Row:
    """A proc mesh, as upstream's ``meshes`` has it: class ``Proc`` (its parent, the host
    mesh, is not known to the spawner here)."""
    values = (key(mesh), name, "Proc", mesh, None, shape_json(shape), now_us(), None)
    return ("meshes", values)


SYSTEM_MODULES: Final = ("monarch.",)
"""Where the classes of Monarch's own actors live (a mesh's setup actors, controllers, the
debugger's, code sync's, the tensor engine's workers): system actors, as upstream's are."""


def mesh_rows(
    mesh: str, name: str, cls: str, shape: Any, procs: str, owner: str = ROOT
) -> list[Row]:
    """An actor mesh, on the procs of proc mesh ``procs`` ("" if unknown), and its actors,
    Created; ``owner``: the owner's name in failure reports (each actor's ``upstream_name``
    is its own there: ``<root>.<module.Class name{'gpus': 0/2}>``)."""
    stamp, mesh_id = now_us(), key(mesh)
    system = cls.startswith(SYSTEM_MODULES)
    extent = shape.extent
    parent = key(procs) if procs else None
    view = view_json(shape) if procs else None
    rows: list[Row] = [
        ("meshes", (mesh_id, name, cls, mesh, parent, shape_json(shape), stamp, view))
    ]
    for rank in range(len(shape.ndslice)):
        actor = key(f"{mesh}[{rank}]")
        shown = actor_name(owner, cls, name, Point(rank, extent))
        values = (actor, mesh_id, rank, f"{mesh}[{rank}]", f"{name}[{rank}]", stamp, system, shown)
        rows.append(("actors", values))
        rows.append(("actor_status_events", (event_id(), actor, "Created", None, stamp)))
    return rows


def system_actor_rows(address: str, client: bool, stamp: int) -> list[Row]:
    """The runtime's own actors in a process, Running: its proc agent (what answers the
    proc's control messages: spawn, stop, introspection; ``proc_agent@ADDRESS``) and, in
    the client, the root client actor (``<root>``, the sender of the client's calls)."""
    agent = f"proc_agent@{address}"
    named: list[tuple[int, str, str, str | None]] = [(key(agent), agent, agent, None)]
    if client:
        named.append((key(CLIENT), CLIENT, CLIENT, CLIENT))
    rows: list[Row] = []
    for actor, full, shown, upstream in named:
        rows.append(("actors", (actor, None, 0, full, shown, stamp, True, upstream)))
        rows.append(("actor_status_events", (event_id(), actor, "Running", None, stamp)))
    return rows


def system_stopped_row(address: str, stamp: int) -> Row:
    """The proc agent of a process that ends cleanly."""
    actor = key(f"proc_agent@{address}")
    return ("actor_status_events", (event_id(), actor, "Stopped", None, stamp))


def status_row(mesh: str, rank: int, status: str, reason: str) -> Row:
    actor = key(f"{mesh}[{rank}]")
    return ("actor_status_events", (event_id(), actor, status, reason or None, now_us()))


@functools.lru_cache(maxsize=4096)
def actor_key(mesh: str, rank: int) -> int:
    """``key`` of an actor (asked per message: remembered, a hash each otherwise)."""
    return key(f"{mesh}[{rank}]")


def split_actor_id(actor_id: str) -> tuple[str, str]:
    """An actor id's ``(full_name, address)``: ``MESH_ID[RANK]`` (the ``actors`` table's
    ``full_name``) and its proc's address (which may hold ``@`` itself)."""
    name, _, address = actor_id.partition("]@")
    return f"{name}]", address


def lost_row(actor_id: str, report: str) -> Row:
    """The actor ``actor_id`` (``MESH_ID[RANK]@ADDRESS``) was lost with its proc."""
    return (LOST, (key(split_actor_id(actor_id)[0]), report or None, now_us()))


def message_row(message: int, sender: int | None, actor: int, endpoint: str, stamp: int) -> Row:
    return ("messages", (message, sender, actor, endpoint, None, stamp))


def message_status_row(message: int, status: str, stamp: int) -> Row:
    """Upstream's statuses: ``queued``, ``active``, ``complete`` (ours: the last two)."""
    return ("message_status_events", (event_id(), message, status, stamp))


def sent_row(sender: int, mesh: int, seen: str, stamp: int) -> Row:
    """A cast from ``sender`` to a view of mesh ``mesh`` (its key), ``seen``: the view as
    upstream's ``view_json`` and ``shape_json`` spell it (0.7.0: both the view, in one
    spelling: ``view_json``)."""
    return ("sent_messages", (event_id(), sender, mesh, seen, seen, stamp))


# -- where rows go ---------------------------------------------------------------------------


class TelemetryStore:
    """The tables, in an in-memory DuckDB database of the client."""

    def __init__(self, config: TelemetryConfig) -> None:
        try:
            import duckdb  # the "sql" extra: only a client with job telemetry loads it
            import numpy  # noqa: F401 - the extra's too: batches reach DuckDB as arrays
        except ImportError as exc:
            raise ImportError(
                "the job's telemetry tables need DuckDB and NumPy (monarch-telemetry's sql "
                "extra): " + install_hint("monarch-telemetry", "sql")
            ) from exc

        self.config = config
        self._db = duckdb.connect(":memory:")
        self._lock = threading.Lock()
        self._pending: list[Row] = []
        self._queue_lock = threading.Lock()
        self._retained = time.monotonic()
        for table, columns in (SCHEMA | SNAPSHOT_SCHEMA | OBSERVED_SCHEMA).items():
            self._db.execute(f"CREATE TABLE {table} ({columns})")
        for view, sql in VIEWS.items():
            self._db.execute(f"CREATE VIEW {view} AS {sql}")
        writer = threading.Thread(
            target=_write_while_kept, args=(weakref.ref(self),), name="monarch-telemetry-store"
        )
        writer.daemon = True
        writer.start()
        stop_at_exit(writer, lambda: None)

    def add(self, rows: Sequence[Row]) -> None:
        """Queue ``rows`` (the client's own, on every call it makes: a list append; an
        insert into DuckDB costs a call milliseconds); they are written in batches every
        ``SHIP_EVERY`` seconds, and before any query."""
        with self._queue_lock:
            self._pending.extend(rows)

    def flush(self) -> None:
        """Write the queued rows."""
        with self._lock:
            with self._queue_lock:
                rows, self._pending = self._pending, []
            if rows:
                self._insert(rows)

    def _insert(self, rows: Sequence[Row]) -> None:
        """Write ``rows`` (called with the lock held)."""
        by_table: dict[str, list[tuple[Any, ...]]] = {}
        for table, values in rows:
            if table in _TABLES:
                by_table.setdefault(table, []).append(values)
        lost = by_table.pop(LOST, [])
        procs_lost = by_table.pop(PROC_LOST, [])
        named = "actors" in by_table or "supervision_events" in by_table
        for table, batch in by_table.items():
            self._append(table, batch)
        for events, column, failed in (
            ("actor_status_events", "actor_id", lost),
            ("proc_status_events", "address", procs_lost),
        ):
            for who, reason, stamp in failed:  # Failed, unless it already ended
                self._db.execute(
                    f"INSERT INTO {events} SELECT ?, ?, 'Failed', ?, ? WHERE NOT EXISTS "
                    f"(SELECT 1 FROM {events} WHERE {column} = ? AND new_status IN "
                    f"{_TERMINAL})",
                    [event_id(), who, reason, stamp, who],
                )
        if named:  # a failure's first actor, by the name its report gives it
            self._db.execute(
                "UPDATE supervision_events s SET root_cause_actor_id = a.id FROM actors a "
                "WHERE s.root_cause_actor_id IS NULL AND a.upstream_name = s.root_cause_actor"
            )
        if time.monotonic() - self._retained >= RETAIN_EVERY:
            self.retain()

    def _append(self, table: str, batch: list[tuple[Any, ...]]) -> None:
        """Append ``batch`` to ``table`` in one scan of its columns (DuckDB reads NumPy
        arrays without a row-by-row round trip: ~1 us a row, where ``executemany`` costs
        a statement per row)."""
        import numpy

        transposed = enumerate(zip(*batch, strict=True))  # a table's rows: one length
        columns = {f"c{i}": numpy.array(c, dtype=object) for i, c in transposed}
        appender = self._db.cursor()  # a connection of its own: no result left open on it
        try:
            appender.register("_batch", columns)
            appender.execute(f"INSERT INTO {table} SELECT * FROM _batch").fetchall()
        finally:
            appender.close()

    def retain(self) -> None:
        """Drop rows older than ``retention_secs`` (called with the lock held); 0 keeps
        every row, as upstream's."""
        self._retained = time.monotonic()
        if not self.config.retention_secs:
            return
        oldest = now_us() - int(self.config.retention_secs * 1_000_000)
        for table in SCHEMA | OBSERVED_SCHEMA:
            self._db.execute(f"DELETE FROM {table} WHERE timestamp_us < ?", [oldest])
        (old,) = self._db.execute(  # a snapshot's rows go with it
            "SELECT count(*) FROM snapshots WHERE snapshot_ts < ?", [oldest]
        ).fetchone() or (0,)
        if old:
            self._db.execute("DELETE FROM snapshots WHERE snapshot_ts < ?", [oldest])
            for table in SNAPSHOT_SCHEMA:
                self._db.execute(
                    f"DELETE FROM {table} WHERE snapshot_id NOT IN "
                    "(SELECT snapshot_id FROM snapshots)"
                )

    def query(self, sql: str) -> dict[str, Any]:
        import duckdb

        self.flush()  # what was added before is in the answer
        with self._lock:
            try:
                cursor = self._db.execute(sql)
                columns = [d[0] for d in cursor.description or ()]
                rows = cursor.fetchall() if columns else []
            except duckdb.Error as exc:
                raise TelemetryQueryError(f"SQL error: {exc}") from None
        return {"rows": [dict(zip(columns, row, strict=True)) for row in rows]}


_db_threads: list[tuple[threading.Thread, Callable[[], object]]] = []
_exiting = threading.Event()


def stop_at_exit(thread: threading.Thread, stop: Callable[[], object]) -> None:
    """``thread`` (a daemon) uses DuckDB: before the interpreter ends, ``stop()`` is called
    and the thread waited for. One killed inside DuckDB at exit aborts the process
    ("terminate called after throwing an instance of ''")."""
    _db_threads.append((thread, stop))


@atexit.register
def _stop_db_threads() -> None:
    _exiting.set()
    for _, stop in _db_threads:
        stop()
    for thread, _ in _db_threads:
        thread.join(timeout=10)


def _write_while_kept(store: weakref.ref[TelemetryStore]) -> None:
    """A store's writer: its queued rows every ``SHIP_EVERY`` seconds, until it is gone or
    the process ends."""
    while not _exiting.wait(SHIP_EVERY):
        kept = store()
        if kept is None:
            return
        kept.flush()
        del kept


class RowShipper:
    """A proc's rows, sent to the client's store in batches from a thread of its own."""

    def __init__(self, runtime: Runtime, sink: PortRef) -> None:
        self.runtime = runtime
        self.sink = sink
        self._rows: list[Row] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="monarch-telemetry-rows", daemon=True).start()

    def add(self, rows: Sequence[Row]) -> None:
        with self._lock:
            self._rows.extend(rows)

    def _run(self) -> None:
        while True:
            self._wake.wait(SHIP_EVERY)
            self.flush()

    def flush(self) -> None:
        with self._lock:
            rows, self._rows = self._rows, []
        if rows:
            try:  # plain values: pickled as they are (the core's dumps looks for buffers)
                body = [pickle.dumps(rows, protocol=5)]
                self.runtime.send_to_port(self.sink, PortValue(0), body)
            except RuntimeError:  # the proc's loop is closed: it is gone
                pass


_sink: list[TelemetryStore | RowShipper] = []


_nowhere: list[object] = [None]
"""The configuration for which no sink was found (checked again only after it changes):
a job without tables asks this per call."""


def current_sink() -> TelemetryStore | RowShipper | None:
    """Where this process's rows go: the client's store, a proc's shipper, or nowhere."""
    if _sink:
        return _sink[0]
    config = current_config()
    if _nowhere[0] is config:
        return None
    address = config.telemetry_sink
    runtime = running_runtime()
    if not address or runtime is None:
        if runtime is not None:
            _nowhere[0] = config
        return None
    proc, _, port = address.rpartition("#")
    _sink.append(RowShipper(runtime, PortRef(proc, int(port))))
    return _sink[0]


def job_query() -> Callable[[str], dict[str, Any]] | None:
    """The query of this client's telemetry tables, if ``enable_telemetry()`` made them
    (monarch-admin's ``/v1/query`` asks, so that ``start_admin()`` needs no ``query=``)."""
    if _sink and isinstance(_sink[0], TelemetryStore):
        return _sink[0].query
    return None


def flush_rows() -> None:
    if _sink and isinstance(_sink[0], RowShipper):
        _sink[0].flush()


class QueryEngineClient:
    """Upstream's ``state.query_engine_client``: SQL over the job's telemetry tables."""

    def __init__(self, store: TelemetryStore) -> None:
        self._store = store

    @property
    def store(self) -> TelemetryStore:
        return self._store

    def query(self, sql: str, timeout: float | None = None) -> dict[str, Any]:
        """``{"rows": [{column: value, ...}, ...]}``; TelemetryQueryError for a query that
        cannot run. ``timeout`` is accepted (a query here is local)."""
        if not isinstance(sql, str):
            raise TypeError(f"a query is a str of SQL, not {type(sql).__name__}")
        return self._store.query(sql)


def open_store(config: TelemetryConfig | None = None) -> QueryEngineClient:
    """This process's telemetry store (made once), where its procs send their rows."""
    if _sink and isinstance(_sink[0], TelemetryStore):
        return QueryEngineClient(_sink[0])
    store = TelemetryStore(config or TelemetryConfig())
    runtime = current_runtime()

    def receive(body: Any, payload: Sequence[Buffer]) -> None:
        if isinstance(body, PortValue) and not body.error:
            store.add(pickle.loads(payload[0]))  # a proc's rows: RowShipper.flush

    port = runtime.open_port(receive)
    _sink[:] = [store]
    configure(telemetry_sink=f"{port.proc}#{port.port}")
    return QueryEngineClient(store)
