"""A client that calls ``enable_telemetry()`` then ``start_admin()`` (no ``query=``), run by
test_discovery.py as its own process in a folder of the test's: two workers called, then
one JSON line ``{"url", "token", "job"}``; it ends when its stdin closes.

With the argument ``job``, its procs are a ``LocalJob``'s, taken by ``state()`` through the
folder's saved job (``.monarch/job_state.pkl``, a ``monarch context``'s link), whose file
the admin server then records."""

from __future__ import annotations

import json
import sys

from monarch.actor import Actor, endpoint, this_host
from monarch.admin import start_admin
from monarch.telemetry import TelemetryConfig, enable_telemetry


class Worker(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def main() -> None:
    enable_telemetry(TelemetryConfig(snapshot_interval_secs=0))
    host = this_host()
    if sys.argv[1:] == ["job"]:
        from monarch.job import LocalJob

        host = LocalJob().state().hosts
    workers = host.spawn_procs(per_host={"gpus": 2}).spawn("workers", Worker)
    workers.ping.call().get()
    server = start_admin("127.0.0.1:0", quiet=True)
    print(json.dumps({"url": server.url, "token": server.token, "job": server.job}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
