"""The job's tables beyond upstream's: procs and their lifecycle, supervision events, spans
(each message's send and its endpoint's run), metric samples, and the views that answer
"what is each message doing" (``message_states``) and "what happened, in order"
(``lifecycle_events``).

Rows are made where things happen, as upstream's tables' are (``_sql``): a sender writes a
``send`` span per destination actor of a call, with the message's id (which the call
carries); the receiving proc writes the ``endpoint`` span of its run under it; each proc
writes its own ``procs`` row and its ``Running``/``Stopped`` events; the owner that hears
a proc died writes its ``Failed`` event; the client's snapshot thread writes the metric
samples. They cost a call only where the job keeps its tables (``enable_telemetry()``).
"""

from __future__ import annotations

import os
import socket
from typing import Any, Final

from monarch.core import failure_cause

MASK: Final = (1 << 63) - 1

OBSERVED_SCHEMA: Final = {
    "procs": "address VARCHAR, pid BIGINT, hostname VARCHAR, role VARCHAR, timestamp_us BIGINT",
    "proc_status_events": (
        "id BIGINT, address VARCHAR, new_status VARCHAR, reason VARCHAR, timestamp_us BIGINT"
    ),
    "supervision_events": (
        "id BIGINT, mesh VARCHAR, ranks BIGINT, report VARCHAR, observer VARCHAR, "
        "category VARCHAR, kind VARCHAR, root_cause_actor VARCHAR, root_cause VARCHAR, "
        "timestamp_us BIGINT, root_cause_actor_id BIGINT"
    ),
    "spans": (
        "span_id BIGINT, parent_span_id BIGINT, kind VARCHAR, name VARCHAR, proc VARCHAR, "
        "actor_id BIGINT, to_actor_id BIGINT, start_us BIGINT, end_us BIGINT, "
        "status VARCHAR, timestamp_us BIGINT"
    ),
    "metric_samples": (
        "name VARCHAR, proc VARCHAR, actor VARCHAR, value DOUBLE, timestamp_us BIGINT"
    ),
}
"""Ours (see the README for what each column holds)."""

VIEWS: Final = {
    "message_states": """
        WITH sent AS (
            SELECT span_id AS id, actor_id, to_actor_id, name, start_us FROM spans
            WHERE kind = 'send'),
        events AS (
            SELECT message_id,
                min(timestamp_us) FILTER (WHERE status = 'active') AS started_us,
                min(timestamp_us) FILTER (WHERE status = 'complete') AS done_us
            FROM message_status_events GROUP BY message_id)
        SELECT coalesce(m.id, s.id) AS message_id,
            coalesce(m.from_actor_id, s.actor_id) AS from_actor_id,
            coalesce(m.to_actor_id, s.to_actor_id) AS to_actor_id,
            coalesce(m.endpoint, s.name) AS endpoint,
            CASE WHEN e.done_us IS NOT NULL THEN 'done'
                 WHEN e.started_us IS NOT NULL THEN 'running' ELSE 'queued' END AS status,
            s.start_us AS queued_us, e.started_us, e.done_us
        FROM messages m FULL OUTER JOIN sent s ON s.id = m.id
        LEFT JOIN events e ON e.message_id = coalesce(m.id, s.id)
    """,
    "lifecycle_events": """
        SELECT e.timestamp_us, 'actor' AS kind, coalesce(a.display_name, CAST(e.actor_id AS
            VARCHAR)) AS subject, e.new_status AS status, e.reason
        FROM actor_status_events e LEFT JOIN actors a ON a.id = e.actor_id
        UNION ALL SELECT timestamp_us, 'proc', address, new_status, reason
            FROM proc_status_events
        UNION ALL SELECT timestamp_us, 'mesh', given_name, 'Created', full_name FROM meshes
        UNION ALL SELECT timestamp_us, 'supervision', mesh, 'Failed: ' || category, report
            FROM supervision_events
    """,
}
"""Views over the tables (queried as tables)."""

Row = tuple[str, tuple[Any, ...]]


def message_key(message: int, actor: int) -> int:
    """The id of a call's message to one actor: the call carries ``message``, each
    destination ``actor`` (its key) derives the same id (ints hash alike in every
    process)."""
    return hash((message, actor)) & MASK


def proc_rows(address: str, role: str, stamp: int, event: int) -> list[Row]:
    """This process (``role``: client or proc), running."""
    return [
        ("procs", (address, os.getpid(), socket.gethostname(), role, stamp)),
        ("proc_status_events", (event, address, "Running", None, stamp)),
    ]


PROC_LOST: Final = "proc_lost"
"""Rows ``(address, reason, timestamp_us)`` of a proc that died: a ``Failed`` event unless
it already has a terminal one (each of its lost actors reports it)."""


def proc_status_row(address: str, status: str, reason: str | None, stamp: int, event: int) -> Row:
    return ("proc_status_events", (event, address, status, reason, stamp))


def supervision_row(
    mesh: str, ranks: int, report: str, observer: str, stamp: int, event: int
) -> Row:
    """A failure heard, with its category and first failure (the core's reading of its
    report: ``failure_cause``)."""
    cause = failure_cause(report)
    values = (event, mesh, ranks, report or None, observer, cause.category, cause.kind)
    named = (cause.actor or None, cause.reason or None, stamp, None)  # the id: by the store
    return ("supervision_events", (*values, *named))


def send_rows(
    message: int, sender: int, proc: str, name: str, actors: list[int], stamp: int
) -> list[Row]:
    """A call's ``send`` span to each of its destination ``actors`` (their keys)."""
    rows: list[Row] = []
    for actor in actors:
        span = message_key(message, actor)
        values = (span, None, "send", name, proc, sender, actor, stamp, stamp, "ok", stamp)
        rows.append(("spans", values))
    return rows


def endpoint_span_row(
    span: int, parent: int | None, name: str, proc: str, actor: int, start: int, end: int, ok: bool
) -> Row:
    """An endpoint's run, under its message's ``send`` span where the call carried one."""
    status = "ok" if ok else "error"
    values = (span, parent, "endpoint", name, proc, actor, None, start, end, status, start)
    return ("spans", values)


def operation_span_row(
    span: int,
    kind: str,
    name: str,
    proc: str,
    actor: int,
    start_ns: int,
    end_ns: int,
    ok: bool,
    parent: int | None = None,
) -> Row:
    """Work done beside endpoints (``kind``: a cast ``relay``, from receiving the call to
    having passed it on; an ``rdma`` transfer; a ``tensor`` op), by ``actor``; ``parent``:
    the ``send`` span of the message that caused it, where known."""
    start, end = start_ns // 1000, max(end_ns // 1000, start_ns // 1000 + 1)
    status = "ok" if ok else "error"
    values = (span, parent, kind, name, proc, actor, None, start, end, status, start)
    return ("spans", values)


def sample_rows(stamp: int, proc: str, answer: Any) -> list[Row]:
    """What a snapshot's answer of one proc measures: its CPU seconds, RSS and threads, and
    each actor's messages handled and queued (actors by ``full_name``)."""
    cpu = answer.cpu_user + answer.cpu_system
    samples: list[tuple[str, str | None, float]] = [
        ("proc.cpu_seconds", None, cpu),
        ("proc.rss_bytes", None, float(answer.rss)),
        ("proc.threads", None, float(answer.threads)),
    ]
    for actor in answer.actors:
        name = actor.actor_id.partition("]@")[0] + "]"
        samples.append(("actor.handled", name, float(actor.handled)))
        samples.append(("actor.queued", name, float(actor.queued)))
    return [("metric_samples", (metric, proc, who, v, stamp)) for metric, who, v in samples]
