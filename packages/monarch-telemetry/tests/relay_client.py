"""A client with the job's telemetry tables whose casts go through a cast tree (run by
test_sql.py as its own process): 4 procs, 2 children per node, so 2 of them relay each
call to the one below; prints the relay spans and the job's Perfetto trace as JSON."""

from __future__ import annotations

import json
import time

from monarch.actor import Actor, endpoint, this_host
from monarch.config import configure
from monarch.telemetry import TelemetryConfig, enable_telemetry, perfetto_trace


class Echo(Actor):
    @endpoint
    def hello(self) -> int:
        return 1


def main() -> None:
    configure(max_cast_fanout=2)  # inherited by the procs: heads relay to the rest
    engine = enable_telemetry(TelemetryConfig(snapshot_interval_secs=0))
    echo = this_host().spawn_procs(per_host={"gpus": 4}).spawn("echo", Echo)
    for _ in range(3):
        echo.hello.call().get()
    relays = (
        "SELECT s.name, s.proc, a.display_name AS actor, s.end_us >= s.start_us AS ordered "
        "FROM spans s LEFT JOIN actors a ON a.id = s.actor_id WHERE s.kind = 'relay'"
    )
    deadline = time.monotonic() + 30
    rows = engine.query(relays)["rows"]
    while len(rows) < 6 and time.monotonic() < deadline:  # a proc's rows come in batches
        time.sleep(0.05)
        rows = engine.query(relays)["rows"]
    print(json.dumps({"relays": rows, "trace": perfetto_trace(engine.query)}))


if __name__ == "__main__":
    main()
