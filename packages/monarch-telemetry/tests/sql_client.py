"""A client with the job's telemetry tables (run by test_sql.py as its own process): 4
actors called 1..4 times each, one that fails, one called by another actor; prints what
its queries answer as JSON."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import monarch.actor
from monarch.actor import Actor, endpoint, this_host
from monarch.telemetry import (
    TelemetryConfig,
    TelemetryQueryError,
    enable_telemetry,
    write_perfetto,
)


class Counted(Actor):
    @endpoint
    def ping(self) -> None:
        pass

    @endpoint
    def die(self) -> None:
        raise SystemExit(3)  # a BaseException: the actor fails


class Relay(Actor):
    @endpoint
    def relay(self, counted: Counted) -> None:
        counted.slice(gpus=0).ping.call_one().get()


PER_ACTOR = """
    SELECT a.display_name AS actor, count(m.id) AS handled
    FROM actors a LEFT JOIN messages m ON m.to_actor_id = a.id
    WHERE a.display_name LIKE 'counted%'
    GROUP BY a.display_name ORDER BY a.display_name
"""


def main() -> None:
    monarch.actor.unhandled_fault_hook = lambda failure: None
    engine = enable_telemetry(TelemetryConfig(retention_secs=600))
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    counted = procs.spawn("counted", Counted)
    for rank in range(4):
        for _ in range(rank + 1):
            counted.slice(gpus=rank).ping.call_one().get()
    procs.slice(gpus=1).spawn("relay", Relay).relay.call_one(counted).get()
    try:
        counted.slice(gpus=3).die.call_one().get()
    except Exception:  # noqa: BLE001 - a SupervisionError: the actor failed
        pass
    deadline = time.monotonic() + 30
    while True:  # a proc's rows arrive in batches: wait for all of them, with a deadline
        handled = engine.query(PER_ACTOR)["rows"]
        failed = engine.query(
            "SELECT e.reason FROM actor_status_events e JOIN actors a ON a.id = e.actor_id "
            "WHERE e.new_status = 'Failed'"
        )["rows"]
        if (sum(r["handled"] for r in handled) >= 12 and failed) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    statuses = engine.query(
        "SELECT new_status, count(*) AS n FROM actor_status_events GROUP BY 1 ORDER BY 1"
    )["rows"]
    tables = sorted(r["name"] for r in engine.query("SHOW TABLES")["rows"])
    senders = engine.query(
        "SELECT coalesce(a.display_name, 'client') AS sender, m.endpoint AS endpoint "
        "FROM messages m LEFT JOIN actors a ON a.id = m.from_actor_id "
        "WHERE m.endpoint = 'Counted.ping' ORDER BY 1"
    )["rows"]
    message_statuses = engine.query(
        "SELECT status, count(*) AS n FROM message_status_events GROUP BY 1 ORDER BY 1"
    )["rows"]
    sent = engine.query(
        "SELECT s.view_json, s.shape_json, coalesce(a.display_name, 'client') AS sender "
        "FROM sent_messages s JOIN meshes m ON m.id = s.actor_mesh_id "
        "LEFT JOIN actors a ON a.id = s.sender_actor_id WHERE m.given_name = 'counted'"
    )["rows"]
    procs_meshes = engine.query("SELECT * FROM meshes WHERE class = 'Proc'")["rows"]
    counted_mesh = engine.query("SELECT * FROM meshes WHERE given_name = 'counted'")["rows"]
    errors = []
    for bad in ("SELEC 1", "SELECT * FROM no_such_table"):
        try:
            engine.query(bad)
        except TelemetryQueryError as exc:
            errors.append(str(exc))
    procs.stop().get()
    observed = ours(engine)
    if len(sys.argv) > 1:  # the job's timeline, taken at its end
        write_perfetto(sys.argv[1])
    print(
        json.dumps(
            {
                "handled": handled,
                "failed": failed,
                "statuses": statuses,
                "tables": tables,
                "senders": senders,
                "message_statuses": message_statuses,
                "sent": sent,
                "errors": errors,
                "procs": procs_meshes,
                "counted": counted_mesh,
                **observed,
            }
        )
    )


def ours(engine: Any) -> dict[str, Any]:
    """Our tables and views beyond upstream's, once the stopped procs said so."""
    deadline = time.monotonic() + 30
    stopped = "SELECT count(*) AS n FROM proc_status_events WHERE new_status = 'Stopped'"
    while engine.query(stopped)["rows"][0]["n"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    return {
        "procs_table": engine.query(
            "SELECT p.role, p.address, list(e.new_status ORDER BY e.timestamp_us) AS events "
            "FROM procs p JOIN proc_status_events e USING (address) GROUP BY 1, 2"
        )["rows"],
        "states": engine.query(
            "SELECT endpoint, status, queued_us <= started_us AND started_us <= done_us AS "
            "ordered FROM message_states WHERE endpoint = 'Counted.ping'"
        )["rows"],
        "flows": engine.query(
            "SELECT s.name AS send, e.name AS run, s.proc = e.proc AS same_proc, e.status "
            "FROM spans s JOIN spans e ON e.parent_span_id = s.span_id "
            "WHERE s.kind = 'send' AND e.kind = 'endpoint' ORDER BY 2"
        )["rows"],
        "supervision": engine.query(
            "SELECT s.mesh, s.category, s.kind, s.root_cause_actor, s.root_cause, "
            "a.display_name AS root_cause_display FROM supervision_events s "
            "LEFT JOIN actors a ON a.id = s.root_cause_actor_id"
        )["rows"],
        "actors": engine.query(
            "SELECT display_name, upstream_name, is_system FROM actors ORDER BY display_name"
        )["rows"],
        "lifecycle": engine.query(
            "SELECT kind, subject, status FROM lifecycle_events ORDER BY timestamp_us"
        )["rows"],
    }


if __name__ == "__main__":
    main()
