"""A client with the job's telemetry tables that runs tensor-engine ops on 2 procs (run by
test_sql.py as its own process, where monarch-tensor is installed); prints the tensor
spans as JSON, and writes the job's Perfetto trace to the file named by its argument."""

from __future__ import annotations

import json
import sys
import time

import torch

import monarch
from monarch.actor import this_host
from monarch.telemetry import TelemetryConfig, enable_telemetry, write_perfetto


def main() -> None:
    engine = enable_telemetry(TelemetryConfig(snapshot_interval_secs=0))
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    with procs.activate():
        t = torch.ones(8) * 3
        total = (t + 1).sum()
    assert float(monarch.fetch_shard(total, gpus=1).get(timeout=120)) == 32.0
    spans = (
        "SELECT s.name, s.proc, s.status, s.end_us >= s.start_us AS ordered, a.display_name "
        "AS actor FROM spans s LEFT JOIN actors a ON a.id = s.actor_id WHERE s.kind = 'tensor'"
    )
    deadline = time.monotonic() + 30
    rows = engine.query(spans)["rows"]
    while len({r["proc"] for r in rows}) < 2 and time.monotonic() < deadline:  # in batches
        time.sleep(0.05)
        rows = engine.query(spans)["rows"]
    write_perfetto(sys.argv[1], engine.query)  # the test loads it back
    print(json.dumps({"tensor": rows}))


if __name__ == "__main__":
    main()
