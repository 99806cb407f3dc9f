"""Snapshots of a real job's procs and actors into upstream's snapshot tables, a crashed
proc's actors as Failed rows and failures, a proc that does not answer; and the store's
invariants (hypothesis): an actor lost with its proc fails once, retention takes a
snapshot's rows with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.telemetry._sql import (
    SNAPSHOT_SCHEMA,
    TelemetryConfig,
    TelemetryStore,
    key,
    lost_row,
    now_us,
    split_actor_id,
    status_row,
)

CLIENT = Path(__file__).with_name("snapshot_client.py")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    """What the client's queries answered (one run for the tests of this module)."""
    done = subprocess.run(
        [sys.executable, str(CLIENT)], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_snapshots_show_the_jobs_procs_and_actors(job: dict[str, Any]) -> None:
    tree = {row["display_name"]: row for row in job["tree"]}
    assert sorted(tree) == ["others[0]", "others[1]", "workers[0]", "workers[1]"]
    assert {row["host"] for row in tree.values()} == {tree["others[0]"]["host"]}
    assert all(row["proc_name"] == "procs" and row["num_actors"] == 2 for row in tree.values())
    assert all(row["actor_status"] == "running" for row in tree.values())
    assert {row["actor_type"] for row in tree.values()} == {"__main__.Worker"}
    handled = {name: row["messages_processed"] for name, row in tree.items()}
    assert handled == {"others[0]": 2, "others[1]": 2, "workers[0]": 1, "workers[1]": 0}
    assert all(row["created_at"] for row in tree.values())  # the actors table's time
    # rank 0 of both meshes on one proc, rank 1 on the other
    proc = {name: row["node_id"].partition("]@")[2] for name, row in tree.items()}
    assert proc["workers[0]"] == proc["others[0]"] != proc["workers[1]"] == proc["others[1]"]


def test_a_proc_that_does_not_answer_does_not_stall_the_snapshots(job: dict[str, Any]) -> None:
    stopped = {row["display_name"]: row for row in job["tree"]}["workers[0]"]
    address = stopped["node_id"].partition("]@")[2]
    unanswered = job["unanswered"]
    assert len(unanswered) >= 2  # two snapshots went on while it was stopped
    for row in unanswered:
        assert row["node_id"] == f"proc:{address}" and row["error_code"] == "timeout"
        assert "did not answer" in row["error_message"]
        assert row["actors"] == 2  # the other proc's actors are in the same snapshot


def test_a_crashed_procs_actors_have_failed_rows_and_failures(job: dict[str, Any]) -> None:
    failed = {row["display_name"]: row["reason"] for row in job["failed"]}
    # exactly one Failed row each: the actor that failed itself has its own only
    assert sorted(failed) == ["others[1]", "workers[0]", "workers[1]"]
    assert len(job["failed"]) == 3
    for name in ("others[1]", "workers[1]"):
        assert "Killed(sig=9)" in failed[name] and "and all its descendants" in failed[name]
    assert "SystemExit" in failed["workers[0]"]
    # The latest snapshot's failures: the lost actors under their dead proc, with the
    # node ids the actors had while alive, and the actor that failed itself.
    tree = {row["display_name"]: row["node_id"] for row in job["tree"]}
    failures = {row["node_id"]: row for row in job["failures"]}
    assert set(failures) == {tree["others[1]"], tree["workers[1]"], tree["workers[0]"]}
    for name in ("others[1]", "workers[1]", "workers[0]"):
        row = failures[tree[name]]
        assert row["failure_error_message"] == failed[name] and row["failure_occurred_at"]
    (dead,) = job["dead"]
    assert dead["node_id"] == f"proc:{tree['workers[1]'].partition(']@')[2]}"
    assert dead["failed_actor_count"] == 2 and dead["num_actors"] == 0


def test_snapshots_are_off_without_telemetry_or_an_interval() -> None:
    script = (
        "import threading\n"
        "from monarch.telemetry import TelemetryConfig, enable_telemetry, install\n"
        "def snapshots():\n"
        "    return any(t.name == 'monarch-snapshots' for t in threading.enumerate())\n"
        "install()\nprint(snapshots())\n"
        "enable_telemetry(TelemetryConfig(snapshot_interval_secs=0))\nprint(snapshots())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True)
    assert done.stdout.split() == ["False", "False"], done.stderr[-2000:]


def test_a_bad_snapshot_interval_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="snapshot_interval_secs must be 0"):
        TelemetryConfig(snapshot_interval_secs=-1)
    with pytest.raises(TypeError, match="snapshot_interval_secs is a number"):
        TelemetryConfig(snapshot_interval_secs="30s")  # type: ignore[arg-type]


addresses = st.sampled_from(["unix://@ab12", "tcp://[::1]:2345", "tcp://10.0.0.1:80"])
names = st.text(alphabet="ab<>0[]", min_size=1, max_size=8)


@given(name=names, rank=st.integers(0, 99), address=addresses)
def test_an_actor_id_splits_into_its_full_name_and_address(
    name: str, rank: int, address: str
) -> None:
    assert split_actor_id(f"{name}[{rank}]@{address}") == (f"{name}[{rank}]", address)


statuses = st.lists(st.sampled_from(["Created", "Running", "Failed", "Stopped"]), max_size=4)


@settings(deadline=None, max_examples=30)  # a DuckDB database per example
@given(before=statuses, losses=st.integers(1, 3))
def test_an_actor_lost_with_its_proc_fails_once(before: list[str], losses: int) -> None:
    store = TelemetryStore(TelemetryConfig())
    store.add([status_row("m<1>", 0, status, "") for status in before])
    store.add([lost_row("m<1>[0]@unix://@ab", "killed") for _ in range(losses)])
    rows = store.query(
        f"SELECT new_status, reason FROM actor_status_events WHERE actor_id = {key('m<1>[0]')}"
    )["rows"]
    terminal = [s for s in before if s in ("Failed", "Stopped")]
    assert len(rows) == len(before) + (0 if terminal else 1)
    if not terminal:
        assert rows[-1] == {"new_status": "Failed", "reason": "killed"}


def test_retention_takes_a_snapshots_rows_with_it() -> None:
    store = TelemetryStore(TelemetryConfig(retention_secs=60))
    old, new = now_us() - 120_000_000, now_us()
    rows = []
    for snap, stamp in (("old", old), ("new", new)):
        rows += [("snapshots", (snap, stamp)), ("nodes", (snap, "root", "root", stamp))]
        rows.append(("actor_failures", (snap, "actor:a[0]@x", "boom", stamp)))
    store.add(rows)
    store.flush()  # add() only queues them
    with store._lock:
        store.retain()
    for table in ("snapshots", "nodes", "actor_failures"):
        kept = store.query(f"SELECT DISTINCT snapshot_id FROM {table}")["rows"]
        assert kept == [{"snapshot_id": "new"}], table
    assert {"snapshots", "actor_failures", "resolution_errors"} <= set(SNAPSHOT_SCHEMA)


def test_every_thread_in_duckdb_is_stopped_before_the_interpreter_ends() -> None:
    """A daemon thread still inside DuckDB when the interpreter ends aborts the process
    ("terminate called after throwing an instance of ''"): the exit hook stops the store's
    writer and the snapshot thread, and waits for both."""
    script = (
        "import atexit, threading\n"
        "from monarch.telemetry._sql import TelemetryConfig, TelemetryStore\n"
        "from monarch.telemetry._snapshots import Snapshots\n"
        "store = TelemetryStore(TelemetryConfig())\n"
        "Snapshots(store, 0.001)\n"
        "names = {'monarch-snapshots', 'monarch-telemetry-store'}\n"
        "print(sorted(t.name for t in threading.enumerate() if t.name in names))\n"
        "atexit._run_exitfuncs()\n"
        "print(sorted(t.name for t in threading.enumerate() if t.name in names))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = done.stdout.splitlines()[-2:]
    assert before == "['monarch-snapshots', 'monarch-telemetry-store']"
    assert after == "[]"
