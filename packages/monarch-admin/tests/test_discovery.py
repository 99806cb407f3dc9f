"""How the commands find a job's admin server: the active ``monarch context``'s, stale files of
killed clients removed, clear messages and a non-zero exit where there is none; ``monarch
query`` over a live job's telemetry tables through ``enable_telemetry()`` + ``start_admin()``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from adminkit import HERE, Job, wait_for

from monarch.admin import AdminServer
from monarch.admin._client import AdminClient
from monarch.admin._discovery import record_file
from monarch.admin._query_command import text_table
from monarch.admin._stacks import pyspy_path

DEADLINE = 120


def monarch(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``monarch`` command as a user runs it in ``cwd``, with ``cwd`` as HOME too."""
    env = {**os.environ, "HOME": str(cwd), "MONARCH_ADMIN_TOKEN": ""}
    return subprocess.run(
        [sys.executable, "-m", "monarch.core", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def use_context(folder: Path, name: str) -> Path:
    """What ``monarch context use NAME`` leaves: the link to the context's saved job."""
    (folder / ".monarch" / name).mkdir(parents=True, exist_ok=True)
    link = folder / ".monarch" / "job_state.pkl"
    link.unlink(missing_ok=True)
    link.symlink_to(Path(name) / "state.pkl")
    return folder / ".monarch" / name / "state.pkl"


@pytest.fixture
def telemetry_job(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """``telemetry_job.py job`` in ``tmp_path`` (its HOME too) under the context ``exp``."""
    pytest.importorskip("monarch.telemetry")
    pytest.importorskip("monarch.job")
    pytest.importorskip("duckdb")
    use_context(tmp_path, "exp")
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, str(HERE / "telemetry_job.py"), "job"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdin is not None
    line = process.stdout.readline()
    assert line, f"the job ended before it served ({process.wait()})"
    try:
        yield process, json.loads(line)
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_monarch_query_prints_a_live_jobs_tables(
    tmp_path: Path, telemetry_job: tuple[subprocess.Popen[str], dict[str, Any]]
) -> None:
    """``enable_telemetry()`` then ``start_admin()`` with no ``query=``: the server answers
    SQL over the client's tables, and ``monarch query`` run in the job's folder finds that
    server through the active context (the saved job the client's ``state()`` went through)
    and prints the rows as a table."""
    _, hello = telemetry_job
    assert hello["job"] == os.path.realpath(tmp_path / ".monarch" / "exp" / "state.pkl")
    sql = "SELECT display_name, rank FROM actors WHERE NOT is_system ORDER BY rank"
    done = monarch(tmp_path, "query", sql)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # the context's server: nothing to say about the choice
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["display_name", "rank"]
    assert [line.split() for line in lines[2:4]] == [["workers[0]", "0"], ["workers[1]", "1"]]
    assert lines[-1] == "(2 rows)"
    as_json = monarch(tmp_path, "query", "--json", "SELECT count(*) AS n FROM meshes")
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == {"n": 2}  # procs, actors
    bad = monarch(tmp_path, "query", "SELECT * FROM nope")
    assert bad.returncode == 1 and "SQL error" in bad.stderr and "nope" in bad.stderr


def test_monarch_trace_writes_a_live_jobs_timeline(
    tmp_path: Path, telemetry_job: tuple[subprocess.Popen[str], dict[str, Any]]
) -> None:
    """``monarch trace``: the job's timeline on demand (``/v1/trace``), Chrome trace-event
    JSON: a thread track per worker, the client's sends joined to their runs by flows."""
    out = tmp_path / "job.json"

    def traced() -> dict[str, Any] | None:
        done = monarch(tmp_path, "trace", "-o", str(out))
        assert done.returncode == 0, done.stderr
        trace: dict[str, Any] = json.loads(out.read_text())
        flows = [e for e in trace["traceEvents"] if e["ph"] == "f"]
        return trace if len(flows) == 2 else None  # the procs' rows arrive in batches

    trace = wait_for(traced, timeout=DEADLINE, message="both runs in the trace")
    events = trace["traceEvents"]
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {"client", "workers[0]", "workers[1]"}
    runs = [e for e in events if e["ph"] == "X" and e["name"] == "Worker.ping"]
    sends = {e["id"]: e["pid"] for e in events if e["ph"] == "s"}
    assert len(runs) == 2 and len(sends) == 2
    assert all(e["pid"] != sends[e["id"]] for e in events if e["ph"] == "f")


def test_the_server_says_how_to_get_telemetry_tables(tmp_path: Path) -> None:
    """A server whose client has no telemetry tables: the dashboard hides its SQL box, and
    ``monarch query`` says what the client must call."""
    with AdminServer("127.0.0.1:0") as server:  # this process made no tables
        root = AdminClient(server.addr, server.token).get("/v1/root")
        assert root["properties"]["telemetry"] is False
        done = monarch(tmp_path, "query", "--addr", server.addr, "--token", server.token, "x")
        assert done.returncode == 1 and "did not call enable_telemetry()" in done.stderr


def test_monarch_query_takes_the_active_contexts_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs' servers: the one serving the active context's job is asked, whichever is
    newer; a context whose job has no server, or no context at all, gets the newest, said
    on stderr."""
    monkeypatch.setenv("HOME", str(tmp_path))
    job_a, job_b = (os.path.realpath(use_context(tmp_path, n)) for n in ("a", "b"))

    def answer(name: str) -> Any:
        return lambda sql: {"rows": [{"server": name}]}

    with (
        AdminServer("127.0.0.1:0", query=answer("a"), job=job_a),
        AdminServer("127.0.0.1:0", query=answer("b"), job=job_b) as newest,
    ):
        for context in ("a", "b"):
            use_context(tmp_path, context)
            done = monarch(tmp_path, "query", "--json", "SELECT 1")
            assert done.returncode == 0 and json.loads(done.stdout) == {"server": context}
            assert done.stderr == ""
        use_context(tmp_path, "c")
        done = monarch(tmp_path, "query", "--json", "SELECT 1")
        assert json.loads(done.stdout) == {"server": "b"}
        assert f"no admin server serves the job saved at {tmp_path}" in done.stderr
        assert newest.addr in done.stderr
        (tmp_path / ".monarch" / "job_state.pkl").unlink()
        done = monarch(tmp_path, "query", "--json", "SELECT 1")
        assert json.loads(done.stdout) == {"server": "b"}
        assert f"using the newest admin server, {newest.addr}" in done.stderr


def test_a_killed_clients_files_are_removed_and_no_dead_link_given(tmp_path: Path) -> None:
    """A client killed with its admin server up leaves its token and record; the next
    command removes them, says no server runs (not that a token is missing) and exits
    non-zero; a server named by --addr that does not answer is said to be unreachable."""
    job = Job(home=str(tmp_path))
    port = int(job.addr.rpartition(":")[2])
    folder = tmp_path / ".monarch" / "admin"
    assert {p.name for p in folder.iterdir()} == {f"{port}.token", f"{port}.json"}
    job.process.send_signal(signal.SIGKILL)
    job.process.wait(timeout=DEADLINE)
    assert record_file(port).name in {p.name for p in folder.iterdir()}
    for command in ("dashboard", "top", "query"):
        args = [command, "SELECT 1"] if command == "query" else [command]
        done = monarch(tmp_path, *args)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert done.stdout == ""
        assert f"monarch {command}: no admin server is running here" in done.stderr
        assert "token" not in done.stderr.split(";")[0]
        assert list(folder.iterdir()) == []
    dead = monarch(tmp_path, "dashboard", "--addr", job.addr, "--token", job.token)
    assert dead.returncode == 2 and dead.stdout == ""
    assert f"cannot reach the admin server at {job.addr}" in dead.stderr


def test_a_clean_exit_removes_the_servers_files(tmp_path: Path) -> None:
    job = Job(home=str(tmp_path))
    folder = tmp_path / ".monarch" / "admin"
    assert len(list(folder.iterdir())) == 2
    job.close()
    assert job.process.returncode == 0
    wait_for(lambda: not list(folder.iterdir()), message="the files to go")


def test_text_table_aligns_columns_and_counts_rows() -> None:
    rows = [{"name": "trainers[0]", "n": 1, "why": None}, {"name": "t", "n": 12, "why": "a\nb"}]
    assert text_table(rows) == (
        "name         n   why\n"
        "-----------  --  ----\n"
        "trainers[0]  1   NULL\n"
        "t            12  a\\nb\n"
        "(2 rows)\n"
    )
    assert text_table([]) == "(0 rows)\n"


def test_monarch_profile_samples_every_proc_onto_the_jobs_timeline(
    tmp_path: Path, telemetry_job: tuple[subprocess.Popen[str], dict[str, Any]]
) -> None:
    """``monarch profile``: py-spy samples the client and both procs at once; their samples
    land on the same process tracks as the job's spans (one pid per proc), and the flame
    graph has every proc at its base."""
    if pyspy_path() is None:
        pytest.skip("py-spy is not installed (pyspy_bin, PYSPY_BIN, PATH)")
    prefix = tmp_path / "prof"
    done = monarch(tmp_path, "profile", "--seconds", "1", "--idle", "-o", str(prefix))
    assert done.returncode == 0, done.stderr
    assert "not sampled" not in done.stderr
    events = json.loads((tmp_path / "prof.json").read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    sampled = {e["pid"] for e in events if e.get("cat") == "py-spy"}
    assert len(sampled) == 3  # the client and its two procs
    threads: dict[int, set[str]] = {}
    for e in events:
        if e["name"] == "thread_name":
            threads.setdefault(e["pid"], set()).add(e["args"]["name"])
    workers = [pid for pid, names in threads.items() if names & {"workers[0]", "workers[1]"}]
    assert len(workers) == 2 and set(workers) <= sampled  # spans and samples: one track
    assert all(any(n.startswith("py-spy thread") for n in threads[pid]) for pid in workers)
    assert all(pid in processes for pid in sampled)
    svg = (tmp_path / "prof.svg").read_text()
    assert svg.startswith("<svg") and svg.count('class="frame"') > 3
    for proc in ("client[0]", "procs[0]", "procs[1]"):
        assert f"<title>{proc} (" in svg
