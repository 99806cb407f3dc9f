"""``job.enable_admin()``: a real ProcessJob serves its admin API from the client, as
upstream's (``state.admin_url``), with the job's telemetry tables behind ``/v1/query``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("admin_script.py")


def test_a_jobs_admin_server_shows_its_hosts_and_actors(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["hosts"] == [
        {"client": True, "procs": [["client", []]]},
        {"client": False, "procs": [["procs", ["pinged"]], ["procs", ["pinged"]]]},
    ]
    assert result["telemetry"] is True
    assert result["rows"] == [{"n": 2}]
    assert result["closed"] is True  # job.kill() ends it
    assert "monarch admin: http://127.0.0.1:" in done.stderr  # where, and its token
