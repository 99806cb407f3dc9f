"""A client with snapshots every 0.2 s (run by test_snapshots.py as its own process): two
procs, two actor meshes; one proc is stopped (SIGSTOP: it cannot answer) until a snapshot
has gone on without it, then the other proc is SIGKILLed. Prints what its queries answer
as JSON."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import monarch.actor
from monarch.actor import Actor, endpoint, this_host
from monarch.telemetry import QueryEngineClient, TelemetryConfig, enable_telemetry


class Worker(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()

    @endpoint
    def die(self) -> None:
        raise SystemExit(3)  # a BaseException: the actor fails, and says so itself

    @endpoint
    def crash(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


Rows = list[dict[str, Any]]


def wait_for(
    engine: QueryEngineClient, sql: str, enough: Callable[[Rows], bool], timeout: float = 30
) -> Rows:
    """The rows of ``sql`` once ``enough`` (snapshots and rows arrive in their own time),
    or as they are at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        rows: Rows = engine.query(sql)["rows"]
        if enough(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


TREE = """
    SELECT h.addr AS host, p.proc_name, p.num_actors, an.actor_status, an.actor_type,
           an.messages_processed, an.created_at, a.display_name, an.node_id
    FROM host_nodes h
    JOIN children hp ON hp.snapshot_id = h.snapshot_id AND hp.parent_id = h.node_id
    JOIN proc_nodes p ON p.snapshot_id = h.snapshot_id AND p.node_id = hp.child_id
    JOIN children pa ON pa.snapshot_id = h.snapshot_id AND pa.parent_id = p.node_id
    JOIN actor_nodes an ON an.snapshot_id = h.snapshot_id AND an.node_id = pa.child_id
    LEFT JOIN actors a ON an.node_id LIKE 'actor:' || a.full_name || '@%'
    WHERE h.snapshot_id = (
        SELECT n.snapshot_id FROM actor_nodes n JOIN snapshots s USING (snapshot_id)
        WHERE s.snapshot_ts >= {since}
        GROUP BY n.snapshot_id, s.snapshot_ts HAVING count(*) = 4
        ORDER BY s.snapshot_ts DESC LIMIT 1
    )
    ORDER BY a.display_name
"""

FAILED = """
    SELECT a.display_name, e.reason FROM actor_status_events e
    JOIN actors a ON a.id = e.actor_id WHERE e.new_status = 'Failed' ORDER BY 1
"""

LATEST = "(SELECT snapshot_id FROM snapshots ORDER BY snapshot_ts DESC LIMIT 1)"


def main() -> None:
    monarch.actor.unhandled_fault_hook = lambda failure: None
    engine = enable_telemetry(TelemetryConfig(snapshot_interval_secs=0.2))
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn("workers", Worker)
    others = procs.spawn("others", Worker)
    pid = workers.slice(gpus=0).ping.call_one().get()
    others.ping.call().get()
    others.ping.call().get()
    called = time.time_ns() // 1000  # a snapshot asked after this has seen every call
    # every actor's row of the actors table too: procs send theirs in batches, in their time
    tree = wait_for(
        engine,
        TREE.format(since=called),
        lambda rows: len(rows) == 4 and all(r["display_name"] for r in rows),
    )

    # The first proc is stopped: snapshots go on without it (an error node for it) and
    # with the other proc's actors.
    stopped_at = time.time_ns() // 1000
    os.kill(pid, signal.SIGSTOP)
    try:
        unanswered = wait_for(
            engine,
            "SELECT e.node_id, e.error_code, e.error_message, (SELECT count(*) FROM "
            "actor_nodes n WHERE n.snapshot_id = e.snapshot_id) AS actors "
            f"FROM resolution_errors e JOIN snapshots s USING (snapshot_id) "
            f"WHERE s.snapshot_ts >= {stopped_at}",
            lambda rows: len(rows) >= 2,
        )
    finally:
        os.kill(pid, signal.SIGCONT)

    # An actor of the first proc fails (and says so); the second proc is killed: its
    # actors, which could not say so, have Failed rows too.
    for doomed in (workers.slice(gpus=0).die, workers.slice(gpus=1).crash):
        try:
            doomed.call_one().get()
        except Exception:  # noqa: BLE001 - a SupervisionError
            pass
    failed = wait_for(engine, FAILED, lambda rows: len(rows) >= 3)
    failures = wait_for(
        engine,
        f"SELECT * FROM actor_failures WHERE snapshot_id = {LATEST} ORDER BY node_id",
        # the time comes from the Failed row, which a live proc sends in its next batch
        lambda rows: len(rows) >= 3 and all(r["failure_occurred_at"] for r in rows),
    )
    dead = engine.query(f"SELECT * FROM proc_nodes WHERE snapshot_id = {LATEST} AND is_poisoned")[
        "rows"
    ]
    procs.stop().get()
    print(
        json.dumps(
            {
                "tree": tree,
                "unanswered": unanswered,
                "failed": failed,
                "failures": failures,
                "dead": dead,
            }
        )
    )


if __name__ == "__main__":
    main()
