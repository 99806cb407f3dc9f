"""A user's script with a job's admin server (run by test_job_admin.py in a folder of its
own): a ProcessJob's hosts, 2 actors, then the admin API as ``monarch top`` reads it and the
telemetry tables through it; prints what it saw as JSON."""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from monarch.actor import Actor, endpoint
from monarch.job import MeshAdminConfig, ProcessJob, TelemetryConfig


class Pinged(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def main() -> None:
    telemetry = sys.argv[1:] == ["--telemetry"]  # its tables need duckdb (the [sql] extra)
    job = ProcessJob({"hosts": 1})
    if telemetry:
        job.enable_telemetry(TelemetryConfig())
    job.enable_admin(MeshAdminConfig(admin_addr="127.0.0.1:0"))
    state = job.state(cached_path=None)
    url = state.admin_url
    assert url is not None
    port = urllib.parse.urlsplit(url).port
    token = (Path.home() / ".monarch" / "admin" / f"{port}.token").read_text().strip()

    def get(path: str) -> Any:
        request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    procs = state.hosts.spawn_procs(per_host={"gpus": 2})
    pinged = procs.spawn("pinged", Pinged)
    pinged.ping.call().get()
    snap = get("/v1/snapshot")
    root = get("/v1/root")
    rows = []
    if telemetry:
        sql = urllib.parse.quote("SELECT count(*) AS n FROM actors WHERE NOT is_system")
        deadline = time.monotonic() + 30
        rows = get(f"/v1/query?sql={sql}")["rows"]
        while rows[0]["n"] < 2 and time.monotonic() < deadline:  # rows come in batches
            time.sleep(0.05)
            rows = get(f"/v1/query?sql={sql}")["rows"]
    job.kill()
    closed = True
    try:
        get("/v1/root")
        closed = False
    except OSError:
        pass
    hosts = [
        {
            "client": host["address"] == snap["client"],
            "procs": [(p["mesh"], [a["mesh"] for a in p["actors"]]) for p in host["procs"]],
        }
        for host in snap["hosts"]
    ]
    telemetry = root["properties"]["telemetry"]
    print(json.dumps({"hosts": hosts, "telemetry": telemetry, "rows": rows, "closed": closed}))


if __name__ == "__main__":
    main()
