"""``benchmarks/scale_model.py`` (docs/scale.md's figures): it runs, and its figures agree.

The script is run as ``bench:scale-model`` runs it, on the results in the repository and
on a copy with a 32-host run beside them; the cast tree it computes is checked for any size
and fan-out against what the tree must be (one message per proc, levels within fan-out^n).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import scale_model  # noqa: E402


def run_model(results: Path, out: Path, *extra: str) -> dict[str, object]:
    script = str(BENCHMARKS / "scale_model.py")
    done = subprocess.run(
        [sys.executable, script, "--results", str(results), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    doc: dict[str, object] = json.loads(out.read_text())
    return doc


def test_the_model_runs_on_the_benches_results_and_agrees_with_itself(tmp_path: Path) -> None:
    doc = run_model(BENCHMARKS / "results", tmp_path / "model.json")
    assert doc["problems"] == {"10000x8": [], "32x8": []}
    models = doc["models"]
    assert isinstance(models, dict)
    big = models["10000x8"]
    assert big["procs"] == 80_000
    assert sum(level["messages"] for level in big["levels"]) == big["cast_messages"] == 80_000
    assert sum(level["bytes"] for level in big["levels"]) == big["cast_bytes"]
    assert big["controller_cast_messages"] == big["fanout"] == 16
    # each proc hears the cast once, so bytes grow with what the messages carry, not less
    assert big["cast_bytes"] >= big["procs"] * min(lv["bytes_max"] for lv in big["levels"])
    for key in ("direct", "tree"):
        assert big["replies"][key]["controller_cpu_ms"] > 0
    assert big["replies"]["tree"]["controller_messages"] == 16
    assert big["replies"]["direct"]["controller_messages"] == 80_000
    beat = big["heartbeat"]
    assert beat["direct_per_s"] == 10_000 / beat["interval_s"]
    assert beat["tree_bytes_per_s"] == beat["tree_per_s"] * beat["beat_bytes"]
    loss = big["host_loss"]
    assert loss["partition_detect_s_min"] < loss["partition_detect_s_max"]
    assert loss["partition_detect_s_max"] <= loss["partition_report_s"]
    small = models["32x8"]
    assert small["procs"] == 256 and small["depth"] < big["depth"]


def test_the_32_host_run_is_read_beside_the_prediction(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    for name in ("core.json", "scale.json", "scale_1024.json"):
        if (BENCHMARKS / "results" / name).exists():
            shutil.copy(BENCHMARKS / "results" / name, results / name)
    run = {
        "hosts": 32,
        "per_host": 8,
        "calls": {"call_ms": [30.0, 10.0, 20.0]},
        "traffic_idle": {"connections": 40, "rx_pps": 64.0},
        "killed": {"client_s": 0.061},
        "partitioned": {"client_s": 4.6},
    }
    (results / "hosts34_32hosts.json").write_text(json.dumps({"runs": {"32x8": run}}))
    after = run | {"traffic_idle": {"connections": 40, "busy_connections": 8, "rx_pps": 9.0}}
    failed = {"hosts": 32, "failed": "it said why"}
    runs = {"runs": {"a": failed, "b": after}}
    (results / "fanin34_32x8_after.json").write_text(json.dumps(runs))
    doc_path = tmp_path / "scale.md"
    doc_path.write_text("before\n<!-- model -->\nstale table\n<!-- /model -->\nafter\n")
    doc = run_model(results, tmp_path / "model.json", "--doc", str(doc_path))
    assert doc["hosts34"] == {
        "source": "hosts34_32hosts.json",
        "call_ms": 20.0,
        "controller_connections": 40,
        "controller_busy_connections_idle": None,
        "controller_rx_per_s_idle": 64.0,
        "killed_client_ms": 61.0,
        "partition_client_s": 4.6,
    }
    # helper fanin34's run (the agents watch their procs): its first run that completed
    fanin = doc["fanin34"]
    assert isinstance(fanin, dict) and fanin["source"] == "fanin34_32x8_after.json"
    assert fanin["controller_busy_connections_idle"] == 8
    assert fanin["controller_rx_per_s_idle"] == 9.0
    text = doc_path.read_text()
    assert text.startswith("before\n<!-- model -->\n") and text.endswith("<!-- /model -->\nafter\n")
    assert "stale table" not in text
    assert "(measured: hosts34_32hosts.json, fanin34_32x8_after.json)" in text


@settings(max_examples=60, deadline=None)
@given(procs=st.integers(1, 5000), fanout=st.integers(1, 40))
def test_the_tree_reaches_each_proc_once_within_its_fanout(procs: int, fanout: int) -> None:
    levels = scale_model.tree(procs, fanout, (procs, 1))
    assert sum(level["messages"] for level in levels) == procs
    assert levels[0]["messages"] == min(fanout, procs)
    for level in levels:
        assert level["messages"] <= fanout ** level["level"]
        assert level["bytes_max"] * level["messages"] >= level["bytes"]
    if fanout > 1:
        # each level takes at least one proc off every chunk: depth grows as log(procs)
        assert len(levels) <= math.ceil(math.log(procs + 1, fanout)) * 2 + 1
