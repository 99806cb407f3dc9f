"""A user's script with a job's telemetry dashboard and no admin API asked for (run by
test_job_admin.py in a folder of its own): the dashboard page and the telemetry SQL behind
it, at ``state.dashboard_url``; prints what it saw as JSON."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from typing import Any

from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob, TelemetryConfig


class Pinged(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def main() -> None:
    job = ProcessJob({"hosts": 1})
    job.enable_telemetry(TelemetryConfig(include_dashboard=True, dashboard_port=0))
    state = job.state(cached_path=None)
    url = state.dashboard_url
    assert url is not None and state.admin_url is None
    base, _, query = url.partition("/?")
    token = urllib.parse.parse_qs(query)["token"][0]

    def get(path: str) -> bytes:
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body: bytes = response.read()
            return body

    procs = state.hosts.spawn_procs(per_host={"gpus": 2})
    procs.spawn("pinged", Pinged).ping.call().get()
    page = urllib.request.urlopen(url, timeout=30).read().decode()  # the link as given
    sql = urllib.parse.quote("SELECT count(*) AS n FROM actors WHERE NOT is_system")
    rows: Any = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # a proc's rows come in batches
        rows = json.loads(get(f"/v1/query?sql={sql}"))["rows"]
        if rows and rows[0]["n"] >= 2:
            break
        time.sleep(0.05)
    job.kill()
    print(json.dumps({"page": "<html" in page.lower(), "rows": rows}))


if __name__ == "__main__":
    main()
