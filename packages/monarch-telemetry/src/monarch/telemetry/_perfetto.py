"""A job's timeline as Chrome trace-event JSON, which ui.perfetto.dev (and chrome://tracing)
opens: built from the job's ``spans`` table, so it needs no collector; the procs' rows
reach the client in batches (every 0.2 s, and when a proc stops), so a trace taken at the
end, or at any time on demand, has them.

One process track per proc (named by its address and role), one thread track per actor in
it (named by its ``display_name``; the client's sends on ``client``): each endpoint run a
slice, each send a short slice with a flow arrow to the run it caused, and the time each
message waited in its actor's queue an async slice (``queued``) beside the actor's track.
Relays, RDMA transfers and tensor ops are slices on the track of the actor (or proc
agent) that did them, with an arrow from the send of the message that caused them where
known: a relay from the call's send to the relaying proc, a tensor op from the send of the
message whose endpoint ran it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from ._sql import CLIENT, key

Query = Callable[[str], dict[str, Any]]

SEND_US: Final = 1
"""The length shown for a send (an instant, as a slice: a flow arrow starts on a slice)."""

FLOWS: Final = {True: "message", False: "caused"}
"""The flows' category: a send to its endpoint's run (``message``), or to other work the
message caused (``caused``: a relay of the call, a tensor op in its endpoint)."""

_SPANS: Final = """
    SELECT s.span_id, s.parent_span_id, s.kind, s.name, s.proc, s.actor_id, s.start_us,
           s.end_us, s.status, coalesce(a.display_name, CAST(s.actor_id AS VARCHAR)) AS actor
    FROM spans s LEFT JOIN actors a ON a.id = s.actor_id ORDER BY s.start_us
"""
_PROCS: Final = "SELECT address, role, hostname, pid FROM procs"


def perfetto_trace(query: Query) -> dict[str, Any]:
    """The job's spans (``query``: SQL over its tables, as ``engine.query``) as a Chrome
    trace-event JSON object (``{"traceEvents": [...]}``)."""
    spans = query(_SPANS)["rows"]
    procs = {row["address"]: row for row in query(_PROCS)["rows"]}
    client = key(CLIENT)
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[int, str], int] = {}

    def track(proc: str, actor_id: int, actor: str) -> tuple[int, int]:
        if proc not in pids:
            info = procs.get(proc, {})
            # its own pid where known: a profile's samples of it join the same track
            pid = pids[proc] = info.get("pid") or len(pids) + 1
            role = info.get("role") or "proc"
            name = f"{role} {proc}" + (f" (pid {info['pid']})" if info.get("pid") else "")
            events.append(_meta("process_name", pid, 0, name))
            events.append(_meta("process_sort_index", pid, 0, pid, field="sort_index"))
        pid = pids[proc]
        name = "client" if actor_id == client else actor
        if (pid, name) not in tids:
            tid = tids[(pid, name)] = len(tids) + 1
            events.append(_meta("thread_name", pid, tid, name))
        return pid, tids[(pid, name)]

    sends = {s["span_id"]: s for s in spans if s["kind"] == "send"}
    for span in spans:
        pid, tid = track(span["proc"] or "?", span["actor_id"], span["actor"])
        start = span["start_us"]
        if span["kind"] == "send":
            events.append(_slice(span, pid, tid, start, SEND_US, "send"))
            continue
        duration = max(span["end_us"] - start, 1)
        events.append(_slice(span, pid, tid, start, duration, span["kind"]))
        sent = sends.get(span["parent_span_id"])
        if sent is None:
            continue
        # An arrow from the send to what it caused: its endpoint's run (one per send: the
        # send's id), or a relay of the call, a tensor op its endpoint ran (their own ids).
        run = span["kind"] == "endpoint"
        flow = {"id": sent["span_id"] if run else span["span_id"], "cat": FLOWS[run]}
        flow["name"] = flow["cat"]
        from_pid, from_tid = track(sent["proc"] or "?", sent["actor_id"], sent["actor"])
        events.append({**flow, "ph": "s", "pid": from_pid, "tid": from_tid, "ts": sent["start_us"]})
        events.append({**flow, "ph": "f", "bp": "e", "pid": pid, "tid": tid, "ts": start})
        if run and start > sent["start_us"]:
            wait = {"cat": "queue", "id": sent["span_id"], "name": f"queued {span['name']}"}
            events.append({**wait, "ph": "b", "pid": pid, "tid": tid, "ts": sent["start_us"]})
            events.append({**wait, "ph": "e", "pid": pid, "tid": tid, "ts": start})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_perfetto(path: str | Path, query: Query | None = None) -> Path:
    """Write the job's trace (this client's tables, or ``query``'s) to ``path``; open it in
    ui.perfetto.dev."""
    if query is None:
        from ._sql import job_query

        query = job_query()
        if query is None:
            raise RuntimeError("no telemetry tables here: call enable_telemetry() first")
    from ._sql import flush_rows

    flush_rows()
    target = Path(path)
    target.write_text(json.dumps(perfetto_trace(query)))
    return target


def _slice(span: dict[str, Any], pid: int, tid: int, ts: int, dur: int, cat: str) -> dict[str, Any]:
    args = {"span_id": span["span_id"], "status": span["status"]}
    return {
        "ph": "X",
        "name": span["name"],
        "cat": cat,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _meta(name: str, pid: int, tid: int, value: Any, field: str = "name") -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {field: value}}
