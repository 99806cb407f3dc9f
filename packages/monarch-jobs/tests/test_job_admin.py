"""``job.enable_admin()``: a real ProcessJob serves its admin API from the client, as
upstream's (``state.admin_url``), with the job's telemetry tables behind ``/v1/query``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("monarch.admin") is None,
    reason="monarch-admin (monarch-jobs' admin extra) is not installed (pkg-jobs)",
)

SCRIPT = Path(__file__).with_name("admin_script.py")
DASHBOARD = Path(__file__).with_name("dashboard_script.py")


@pytest.mark.parametrize("telemetry", [False, True], ids=["alone", "with-telemetry"])
def test_a_jobs_admin_server_shows_its_hosts_and_actors(tmp_path: Path, telemetry: bool) -> None:
    if telemetry and importlib.util.find_spec("duckdb") is None:
        pytest.skip("the telemetry tables need duckdb (monarch-jobs[telemetry])")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *(["--telemetry"] if telemetry else [])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["hosts"] == [
        {"client": True, "procs": [["client", []]]},
        {"client": False, "procs": [["procs", ["pinged"]], ["procs", ["pinged"]]]},
    ]
    assert result["telemetry"] is telemetry
    assert result["rows"] == ([{"n": 2}] if telemetry else [])
    assert result["closed"] is True  # job.kill() ends it
    assert "monarch admin: http://127.0.0.1:" in done.stderr  # where, and its token


def test_a_telemetry_dashboard_alone_is_served_with_its_sql(tmp_path: Path) -> None:
    """``TelemetryConfig(include_dashboard=True)``: ``state.dashboard_url`` is the admin
    server's page (with its token), the job's tables behind it, no admin API asked for."""
    if importlib.util.find_spec("duckdb") is None:
        pytest.skip("the telemetry tables need duckdb (monarch-jobs[telemetry])")
    done = subprocess.run(
        [sys.executable, str(DASHBOARD)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"page": True, "rows": [{"n": 2}]}
