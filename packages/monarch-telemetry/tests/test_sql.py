"""The job's telemetry tables: filled by a real client and its procs, queried by SQL; and
the store's invariants (hypothesis): counts are what was added, retention keeps what is
recent."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.telemetry._sql import (
    SCHEMA,
    TelemetryConfig,
    TelemetryQueryError,
    TelemetryStore,
    key,
    now_us,
)

CLIENT = Path(__file__).with_name("sql_client.py")
RELAYS = Path(__file__).with_name("relay_client.py")
TENSOR = Path(__file__).with_name("tensor_client.py")


def check_trace(trace: dict[str, Any], procs_table: list[dict[str, Any]]) -> None:
    """The timeline as Perfetto reads it: a process track per proc (the client's too), a
    thread track per actor, each call's send joined to its run by a flow arrow that
    crosses procs, and the time it queued."""
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert {p["address"] for p in procs_table} == {n.split()[1] for n in processes.values()}
    assert {"client", "relay[0]"} | {f"counted[{r}]" for r in range(4)} == set(threads.values())
    slices = [e for e in events if e["ph"] == "X"]
    runs = [e for e in slices if e["name"] == "Counted.ping"]
    assert len(runs) == 11 and all(e["dur"] >= 1 for e in runs)
    assert {threads[(e["pid"], e["tid"])] for e in runs} == {f"counted[{r}]" for r in range(4)}
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == 13  # 11 pings, relay, die
    assert all(starts[i]["pid"] != ends[i]["pid"] for i in starts)
    assert all(starts[i]["ts"] <= ends[i]["ts"] for i in starts)
    client = next(p for p, name in processes.items() if name.startswith("client"))
    assert sum(starts[i]["pid"] == client for i in starts) == 12  # the relay's is its own
    waits = [e for e in events if e.get("cat") == "queue"]
    assert all(e["ph"] in "be" for e in waits) and len(waits) % 2 == 0


def check_actor_names(actors: list[dict[str, Any]], procs_table: list[dict[str, Any]]) -> None:
    """Every actor with upstream's user-parseable name (its owner's, then its own: what
    failure reports say), and the system actors marked: the client's root and each
    process's proc agent."""
    names = {a["display_name"]: a for a in actors}
    assert names["counted[2]"]["upstream_name"] == (
        "<root>.<__main__.Counted counted{'gpus': 2/4}>"
    )
    relay = names["relay[0]"]["upstream_name"]  # on one proc: a point, no coordinates
    assert relay == "<root>.<__main__.Relay relay>"
    assert names["<root>"]["is_system"] and names["<root>"]["upstream_name"] == "<root>"
    agents = {a["display_name"] for a in actors if a["is_system"]} - {"<root>"}
    assert agents == {f"proc_agent@{p['address']}" for p in procs_table}
    assert not any(names[f"counted[{r}]"]["is_system"] for r in range(4))


def test_a_jobs_actors_messages_and_failures_answer_sql(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    trace = tmp_path / "trace.json"
    done = subprocess.run(
        [sys.executable, str(CLIENT), str(trace)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    handled = {r["actor"]: r["handled"] for r in result["handled"]}
    # rank 0 also handled the relay's call; rank 3 the call that made it fail
    assert handled == {"counted[0]": 2, "counted[1]": 2, "counted[2]": 3, "counted[3]": 5}
    (failed,) = result["failed"]
    assert "SystemExit" in failed["reason"] or "3" in failed["reason"]
    statuses = {r["new_status"]: r["n"] for r in result["statuses"]}
    assert statuses["Created"] >= 4 and statuses["Running"] >= 4 and statuses["Failed"] == 1
    assert set(SCHEMA) <= set(result["tables"])
    # Who sent each message: the client, and the relay actor calling from its endpoint.
    senders = [r["sender"] for r in result["senders"]]
    assert senders.count("<root>") == 10 and senders.count("relay[0]") == 1  # the client's row
    # Every message handled became active, then complete (a failure completes it too).
    message_statuses = {r["status"]: r["n"] for r in result["message_statuses"]}
    assert message_statuses["active"] == message_statuses["complete"] >= 13
    # Casts as upstream's sent_messages: the sender and the view it was cast to.
    sent = result["sent"]
    assert sum(r["sender"] == "<root>" for r in sent) == 11  # ten pings and the fatal one
    assert sum(r["sender"] == "relay[0]" for r in sent) == 1
    # slice(gpus=N) is a point: no dimension left, at offset N of the mesh.
    views = [json.loads(r["view_json"]) for r in sent]
    assert all(v["labels"] == [] and v["slice"]["sizes"] == [] for v in views)
    assert {v["slice"]["offset"] for v in views} == {0, 1, 2, 3}
    assert all(r["shape_json"] == r["view_json"] for r in sent)  # as upstream 0.7.0's
    # The proc mesh is a mesh too (class Proc, as upstream's), the actor mesh's parent.
    (procs,) = result["procs"]
    assert procs["class"] == "Proc" and procs["given_name"] == "procs"
    assert procs["shape_json"] == '{"inner":{"labels":["gpus"],"sizes":[4]}}'  # upstream's text
    (counted,) = result["counted"]
    assert counted["parent_mesh_id"] == procs["id"]
    assert json.loads(counted["shape_json"]) == {"inner": {"labels": ["gpus"], "sizes": [4]}}
    parent_view = {"labels": ["gpus"], "slice": {"offset": 0, "sizes": [4], "strides": [1]}}
    assert json.loads(counted["parent_view_json"]) == parent_view
    # Ours: every proc (and the client) with its lifecycle, each call's send span and its
    # endpoint's run under it (on another proc), messages done in order, and one timeline.
    procs_table = result["procs_table"]
    assert sorted(r["role"] for r in procs_table) == ["client"] + ["proc"] * 4
    assert all(r["events"] == ["Running", "Stopped"] for r in procs_table if r["role"] == "proc")
    states = result["states"]
    assert len(states) == 11 and all(r["status"] == "done" and r["ordered"] for r in states)
    flows = result["flows"]
    pings = [f for f in flows if f["run"] == "Counted.ping"]
    assert len(pings) == 11 and all(f["send"] == "send counted.ping" for f in pings)
    assert not any(f["same_proc"] for f in pings)
    assert [f["status"] for f in flows if f["run"] == "Counted.die"] == ["error"]
    lifecycle = [(r["kind"], r["subject"], r["status"]) for r in result["lifecycle"]]
    assert lifecycle.index(("mesh", "counted", "Created")) < lifecycle.index(
        ("actor", "counted[3]", "Failed")
    )
    assert ("proc", procs_table[0]["address"], "Running") in lifecycle
    (died,) = [r for r in result["supervision"] if r["mesh"] == "counted"]
    assert (died["category"], died["kind"]) == ("user", "exception in user code")
    assert died["root_cause_actor"].endswith("Counted counted{'gpus': 3/4}>")
    assert "SystemExit" in died["root_cause"]
    assert died["root_cause_display"] == "counted[3]"  # the report's name, joined to our row
    check_actor_names(result["actors"], procs_table)
    check_trace(json.loads(trace.read_text()), procs_table)
    bad_sql, unknown_table = result["errors"]
    assert bad_sql.startswith("SQL error:") and "SELEC" in bad_sql
    assert "no_such_table" in unknown_table


def caused_flows(events: list[dict[str, Any]], cat: str) -> list[tuple[Any, Any]]:
    """The trace's arrows from a send to the work it caused, as (start, the slice the
    arrow ends on): checked to pair up, one start and one end per id."""
    flows = [e for e in events if e["ph"] in "sf" and e["cat"] == "caused"]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    ends = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert len(starts) + len(ends) == len(flows) and starts.keys() == ends.keys()
    slices = {(e["pid"], e["tid"], e["ts"]): e for e in events if e["ph"] == "X"}
    sends = {(e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "X" and e["cat"] == "send"}
    pairs = []
    for i, start in starts.items():
        end = ends[i]
        assert (start["pid"], start["tid"], start["ts"]) in sends  # from a send
        assert start["ts"] <= end["ts"] and start["pid"] != end["pid"]  # into another proc
        caused = slices[(end["pid"], end["tid"], end["ts"])]  # onto the work's slice
        if caused["cat"] == cat:
            pairs.append((start, caused))
    return pairs


def test_cast_relays_and_rdma_transfers_are_spans_on_their_tracks(tmp_path: Path) -> None:
    """A cast through a tree (2 children per node, 4 procs): each head proc's relay of each
    call is a ``relay`` span of that proc's agent, and a slice on its track in Perfetto,
    with an arrow from the call's send (once the relaying proc's actor runs: the first
    call's relays come before); an RDMA read is an ``rdma`` span of the actor (here the
    client) that made it (where monarch-rdma is installed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    path = tmp_path / "relays.json"
    done = subprocess.run(
        [sys.executable, str(RELAYS), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    result["trace"] = json.loads(path.read_text())
    relays = result["relays"]
    assert len(relays) == 6  # 3 calls, each relayed by 2 heads to the one below
    assert all(re.fullmatch(r"relay echo<\w+>\.hello to 1 procs", r["name"]) for r in relays)
    assert len({r["proc"] for r in relays}) == 2 and all(r["ordered"] for r in relays)
    assert all(r["actor"] == f"proc_agent@{r['proc']}" for r in relays)
    events = result["trace"]["traceEvents"]
    named = [e for e in events if e["name"] == "thread_name"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in named}
    slices = [e for e in events if e["ph"] == "X" and e["cat"] == "relay"]
    assert len(slices) == 6
    assert all(threads[(e["pid"], e["tid"])].startswith("proc_agent@") for e in slices)
    arrows = caused_flows(events, "relay")
    assert len(arrows) >= 4 and len({id(relay) for _, relay in arrows}) == len(arrows)
    assert all(threads[(s["pid"], s["tid"])] == "client" for s, _ in arrows)
    # The client's RDMA read of a proc's buffer: a span on the client's track.
    if importlib.util.find_spec("monarch.rdma") is None:
        assert result["rdma"] == []
        return
    (rdma,) = result["rdma"]
    assert rdma["name"].startswith("rdma read 4096 bytes from ") and rdma["actor"] == "<root>"
    assert rdma["status"] == "ok" and rdma["ordered"]
    (read,) = [e for e in events if e["ph"] == "X" and e["cat"] == "rdma"]
    assert threads[(read["pid"], read["tid"])] == "client"


def test_tensor_engine_ops_are_spans_of_each_procs_worker(tmp_path: Path) -> None:
    """Ops run by the tensor engine on 2 procs: a ``tensor`` span per command on each
    proc, named by its function, on the track of that proc's worker actor, each with an
    arrow from the client's send of the message whose endpoint ran it."""
    pytest.importorskip("monarch.tensor")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    path = tmp_path / "tensor.json"
    done = subprocess.run(
        [sys.executable, str(TENSOR), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    result["trace"] = json.loads(path.read_text())
    rows = result["tensor"]
    assert len({r["proc"] for r in rows}) == 2
    assert all(r["status"] == "ok" and r["ordered"] for r in rows)
    names = {r["name"] for r in rows}
    assert {"Op add", "Op sum"} <= names, names
    assert all(r["actor"] and not r["actor"].startswith("proc_agent@") for r in rows)
    events = result["trace"]["traceEvents"]
    ops = [e for e in events if e["ph"] == "X" and e["cat"] == "tensor"]
    assert len({e["pid"] for e in ops}) == 2
    arrows = caused_flows(events, "tensor")
    assert {id(op) for _, op in arrows} == {id(op) for op in ops}  # each op, one arrow
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert all(processes[s["pid"]].startswith("client") for s, _ in arrows)


def test_a_bad_retention_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="retention_secs must be 0"):
        TelemetryConfig(retention_secs=-1)
    with pytest.raises(TypeError, match="retention_secs is a number of seconds"):
        TelemetryConfig(retention_secs="1h")  # type: ignore[arg-type]


def test_without_duckdb_the_error_names_the_extra() -> None:
    script = (
        "import sys\nsys.modules['duckdb'] = None  # as if the sql extra were not installed\n"
        "from monarch.telemetry import enable_telemetry\n"
        "try:\n    enable_telemetry()\nexcept ImportError as e:\n    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert "monarch-telemetry's sql extra): pip install -e " in done.stdout, done.stderr[-2000:]
    assert 'monarch-telemetry[sql]" (monarch-telemetry is not on the package' in done.stdout


def test_bad_queries_are_clear_errors() -> None:
    store = TelemetryStore(TelemetryConfig())
    with pytest.raises(TelemetryQueryError, match="SQL error"):
        store.query("DROP TABLE nothing_here")
    assert store.query("SELECT count(*) AS n FROM messages") == {"rows": [{"n": 0}]}


names = st.text(alphabet="abc[]0123", min_size=1, max_size=12)


@settings(deadline=None, max_examples=30)  # a DuckDB database per example: ~0.1 s
@given(st.lists(st.tuples(names, st.integers(0, 7)), max_size=80))
def test_message_counts_are_what_was_added(calls: list[tuple[str, int]]) -> None:
    store = TelemetryStore(TelemetryConfig())
    stamp = now_us()
    store.add(
        [
            ("messages", (i, None, key(f"{m}[{r}]"), "E.f", None, stamp))
            for i, (m, r) in enumerate(calls)
        ]
    )
    rows = store.query("SELECT to_actor_id AS a, count(*) AS n FROM messages GROUP BY 1")["rows"]
    assert {row["a"]: row["n"] for row in rows} == Counter(key(f"{m}[{r}]") for m, r in calls)
    assert all(0 <= key(f"{m}[{r}]") < 2**63 for m, r in calls)


@settings(deadline=None, max_examples=30)
@given(ages=st.lists(st.integers(0, 7200), max_size=40), retention=st.integers(0, 3600))
def test_retention_keeps_exactly_the_recent_rows(ages: list[int], retention: int) -> None:
    store = TelemetryStore(TelemetryConfig(retention_secs=retention))
    stamp = now_us()
    store.add(
        [
            ("messages", (i, None, 1, "E.f", None, stamp - age * 1_000_000))
            for i, age in enumerate(ages)
        ]
    )
    store.flush()  # the queued rows are written
    with store._lock:
        store.retain()
    kept = store.query("SELECT id FROM messages ORDER BY id")["rows"]
    # a row exactly at the limit may go either way: the clock moved between the two reads;
    # 0 keeps every row (upstream's "0 disables retention")
    expected = [i for i, age in enumerate(ages) if age < retention or not retention]
    maybe = [i for i, age in enumerate(ages) if age == retention]
    got = [r["id"] for r in kept]
    assert set(expected) <= set(got) <= set(expected) | set(maybe)
