"""``job.enable_telemetry()``: a real ProcessJob's actors and messages answer SQL through
``state.query_engine_client`` (monarch-telemetry's tables), as upstream's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("telemetry_script.py")


@pytest.mark.skipif(
    importlib.util.find_spec("duckdb") is None,
    reason="duckdb (monarch-telemetry's sql extra) is not installed (pkg-jobs)",
)
def test_a_jobs_messages_answer_sql(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["rows"] == [{"actor": "pinged[0]", "n": 3}, {"actor": "pinged[1]", "n": 3}]
    assert "before job.state()" in result["late"]
    # A snapshot lists both actors, under the job's one host.
    actors = result["actors"]
    assert [a["type"] for a in actors] == ["__main__.Pinged"] * 2
    assert len({a["host"] for a in actors}) == 1
