"""A client with the job's telemetry tables whose casts go through a cast tree (run by
test_sql.py as its own process): 4 procs, 2 children per node, so 2 of them relay each
call to the one below, then an RDMA read from one of them; prints the relay and RDMA
spans as JSON, and writes the job's Perfetto trace to the file named by its argument."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from typing import Any

from monarch.actor import Actor, endpoint, this_host
from monarch.config import configure
from monarch.telemetry import TelemetryConfig, enable_telemetry, write_perfetto


class Echo(Actor):
    def __init__(self) -> None:
        self.data = bytearray(b"x" * 4096)

    @endpoint
    def hello(self) -> int:
        return 1

    @endpoint
    def lend(self) -> Any:
        from monarch.rdma import RDMABuffer

        return RDMABuffer(self.data)


def main() -> None:
    configure(max_cast_fanout=2)  # inherited by the procs: heads relay to the rest
    engine = enable_telemetry(TelemetryConfig(snapshot_interval_secs=0))
    echo = this_host().spawn_procs(per_host={"gpus": 4}).spawn("echo", Echo)
    for _ in range(3):
        echo.hello.call().get()
    into = bytearray(4096)
    if importlib.util.find_spec("monarch.rdma") is not None:  # an RDMA transfer
        echo.slice(gpus=3).lend.call_one().get().read_into(into).get()
        assert into == bytearray(b"x" * 4096)
    spans = (
        "SELECT s.kind, s.name, s.proc, a.display_name AS actor, s.end_us >= s.start_us AS "
        "ordered, s.status FROM spans s LEFT JOIN actors a ON a.id = s.actor_id "
        "WHERE s.kind IN ('relay', 'rdma')"
    )
    deadline = time.monotonic() + 30
    rows = engine.query(spans)["rows"]
    expected = 6 + (into[0] != 0)  # the relays, and the read where there was one
    while len(rows) < expected and time.monotonic() < deadline:  # rows come in batches
        time.sleep(0.05)
        rows = engine.query(spans)["rows"]
    relays = [r for r in rows if r["kind"] == "relay"]
    rdma = [r for r in rows if r["kind"] == "rdma"]
    write_perfetto(sys.argv[1], engine.query)  # the test loads it back
    print(json.dumps({"relays": relays, "rdma": rdma}))


if __name__ == "__main__":
    main()
