"""A user's script with a job's telemetry (run by test_job_telemetry.py in a folder of its
own): a ProcessJob's hosts, 2 actors called, then SQL; prints the answers as JSON."""

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
    job.enable_telemetry(TelemetryConfig(retention_secs=600))
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
    late = ""
    try:
        job.enable_telemetry()
    except RuntimeError as exc:
        late = str(exc)
    job.kill()
    print(json.dumps({"rows": rows, "late": late}))


if __name__ == "__main__":
    main()
