"""A user's script with a job's telemetry (run by test_job_telemetry.py in a folder of its
own): a ProcessJob's hosts, 2 actors called, then SQL (its messages, and a snapshot of
its hosts, procs and actors); prints the answers as JSON."""

from __future__ import annotations

import json
import time

from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob, TelemetryConfig


class Pinged(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def main() -> None:
    job = ProcessJob({"hosts": 1})
    job.enable_telemetry(TelemetryConfig(retention_secs=600, snapshot_interval_secs=0.2))
    state = job.state(cached_path=None)
    engine = state.query_engine_client
    assert engine is not None
    procs = state.hosts.spawn_procs(per_host={"gpus": 2})
    pinged = procs.spawn("pinged", Pinged)
    for _ in range(3):
        pinged.ping.call().get()
    query = (
        "SELECT a.display_name AS actor, count(*) AS n FROM messages m "
        "JOIN actors a ON a.id = m.to_actor_id GROUP BY 1 ORDER BY 1"
    )
    deadline = time.monotonic() + 30
    rows = engine.query(query)["rows"]
    while sum(r["n"] for r in rows) < 6 and time.monotonic() < deadline:  # rows come in batches
        time.sleep(0.05)
        rows = engine.query(query)["rows"]
    snapshot = (  # the actors of the latest snapshot that has them, with their host
        "SELECT h.addr AS host, an.actor_type AS type FROM actor_nodes an "
        "JOIN children pa ON pa.snapshot_id = an.snapshot_id AND pa.child_id = an.node_id "
        "JOIN children hp ON hp.snapshot_id = an.snapshot_id AND hp.child_id = pa.parent_id "
        "JOIN host_nodes h ON h.snapshot_id = an.snapshot_id AND h.node_id = hp.parent_id "
        "WHERE an.snapshot_id = (SELECT n.snapshot_id FROM actor_nodes n JOIN snapshots s "
        "USING (snapshot_id) GROUP BY 1, s.snapshot_ts ORDER BY s.snapshot_ts DESC LIMIT 1)"
    )
    actors = engine.query(snapshot)["rows"]
    while len(actors) < 2 and time.monotonic() < deadline:  # the next snapshot has them
        time.sleep(0.05)
        actors = engine.query(snapshot)["rows"]
    late = ""
    try:
        job.enable_telemetry()
    except RuntimeError as exc:
        late = str(exc)
    job.kill()
    print(json.dumps({"rows": rows, "late": late, "actors": actors}))


if __name__ == "__main__":
    main()
