"""The admin server against a real running job: what it shows, who it answers, faults."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import stat
import string
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from adminkit import Job, actor, actors, procs, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.admin import AdminServer, parse_addr, start_admin
from monarch.admin._auth import token_file
from monarch.admin._stacks import pyspy_path
from monarch.config import configured


def quote(ref: str) -> str:
    return urllib.parse.quote(ref, safe="")


def test_the_snapshot_shows_hosts_procs_and_actors(job: Job) -> None:
    snap = job.snapshot()
    assert snap["summary"] == {
        "hosts": 1, "procs": 4, "actors": 3, "failed": 0, "not_answering": 0, "died": 0
    }  # fmt: skip
    [host] = snap["hosts"]
    assert host["hostname"] == socket.gethostname()
    assert [(p["mesh"], p["rank"], p["state"]) for p in host["procs"]] == [
        ("client", 0, "running"),
        ("workers", 0, "running"),
        ("workers", 1, "running"),
        ("loopers", 0, "running"),
    ]
    for proc in host["procs"]:
        assert proc["pid"] > 0 and proc["rss"] > 0 and proc["threads"] >= 1
    worker = actor(snap, "workers", 1)
    assert worker["class_name"] == "__main__.Worker"
    assert worker["point"] == "{'gpus': 1/2}"
    assert worker["state"] == "running" and worker["handled"] == 1 and worker["queued"] == 0
    assert worker["current"] == "" and worker["idle_for"] >= 0


def test_messages_per_second_and_counts_follow_the_calls(job: Job) -> None:
    job.snapshot()  # the first sample of the rates
    job.command("ping 200")
    snap = wait_for(
        lambda: (
            (s := job.snapshot())
            and actor(s, "workers", 0)["rate"] > 0
            and all(p["cpu_percent"] is not None for p in procs(s))
            and s
        ),
        message="a rate",
    )
    assert actor(snap, "workers", 0)["handled"] == 201
    assert actor(snap, "workers", 1)["handled"] == 201
    assert all(p["cpu_percent"] >= 0 for p in procs(snap))  # CPU per proc, a rate too
    assert actor(snap, "workers", 0)["last_active"] <= snap["time"]


def test_a_stuck_actor_shows_its_endpoint_and_its_stack(job: Job) -> None:
    job.command("hang")
    snap = wait_for(
        lambda: (s := job.snapshot()) and actor(s, "workers", 0)["current"] == "hang" and s
    )
    stuck = actor(snap, "workers", 0)
    assert stuck["busy_for"] >= 0
    job.command("queue 3")  # calls waiting behind the stuck one: its queue depth
    wait_for(lambda: actor(job.snapshot(), "workers", 0)["queued"] == 3, message="3 queued")
    dump = job.json(f"/v1/stacks/{quote(stuck['ref'])}?source=self")
    assert dump["source"] == "self"
    [thread] = [t for t in dump["threads"] if stuck["actor_id"] in t["actors"]]
    assert thread["frames"][-1]["function"] == "hang"
    # The other worker goes on.
    job.command("ping-one 3")
    assert actor(job.snapshot(), "workers", 1)["handled"] == 4


def test_a_failed_actor_shows_its_error(job: Job) -> None:
    job.command("fail")
    snap = wait_for(lambda: (s := job.snapshot()) and s["summary"]["failed"] == 1 and s)
    failed = actor(snap, "workers", 1)
    assert failed["state"] == "failed"
    assert "disk on fire" in failed["error"]
    assert actor(snap, "workers", 0)["state"] == "running"
    node = job.json(f"/v1/{quote(failed['ref'])}")
    assert node["properties"]["state"] == "failed"
    assert "disk on fire" in job.json("/v1/tree")  # text, as JSON's str


def test_a_proc_whose_loop_is_held_is_not_answering_and_not_waited_on(job: Job) -> None:
    job.snapshot()  # what it says last
    job.command("block")
    snap = wait_for(
        lambda: (s := job.snapshot()) and s["summary"]["not_answering"] == 1 and s,
        message="a proc not answering",
    )
    [held] = [p for p in procs(snap) if p["state"] == "not answering"]
    assert held["mesh"] == "loopers"
    assert "did not answer within" in held["error"]
    assert [a["mesh"] for a in held["actors"]] == ["looper"]  # what it said last
    assert held["stale"] is True
    status, body = job.get(f"/v1/stacks/{quote(held['ref'])}?source=self")
    assert status == 504 and "not answering" in body["error"]
    # The others still answer.
    assert actor(snap, "workers", 0)["state"] == "running"


def test_a_killed_proc_is_shown_dead_and_the_server_goes_on(job: Job) -> None:
    victim = next(p for p in procs(job.snapshot()) if p["mesh"] == "workers" and p["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    # Seen at once (its connection ends), then named by its host agent's report.
    snap = wait_for(
        lambda: (
            (s := job.snapshot())
            and any(p["ref"] == victim["ref"] and "signal 9" in p["error"] for p in procs(s))
            and s
        )
    )
    assert snap["summary"]["died"] == 1
    dead = next(p for p in procs(snap) if p["ref"] == victim["ref"])
    assert dead["state"] == "died"
    assert "signal 9" in dead["error"]
    assert [a["state"] for a in dead["actors"]] == ["lost"]
    status, body = job.get(f"/v1/stacks/{quote(dead['ref'])}")
    assert status == 404 and "signal 9" in body["error"]
    assert actor(snap, "workers", 0)["state"] == "running"


def test_a_stopped_mesh_is_shown_stopped(job: Job) -> None:
    job.snapshot()  # what its procs say last
    job.command("stop")
    snap = wait_for(
        lambda: (
            (s := job.snapshot())
            and all(p["state"] == "stopped" for p in procs(s) if p["mesh"] == "workers")
            and s
        )
    )
    assert [p["state"] for p in procs(snap) if p["mesh"] != "workers"] == ["running", "running"]
    assert {a["state"] for a in actors(snap) if a["mesh"] == "workers"} == {"stopped"}


def test_references_walk_from_the_root(job: Job) -> None:
    root = job.json("/v1/root")
    assert root["identity"] == "root" and root["parent"] is None
    assert root["properties"]["kind"] == "root" and root["properties"]["telemetry"] is False
    seen = {"root"}
    todo = list(root["children"])
    kinds = []
    while todo:
        ref = todo.pop()
        node = job.json(f"/v1/{quote(ref)}")
        assert node["identity"] == ref and node["parent"] in seen
        kinds.append(node["properties"]["kind"])
        seen.add(ref)
        todo.extend(node["children"])
    assert sorted(kinds) == ["actor"] * 3 + ["host"] + ["proc"] * 4


def test_every_request_needs_the_token(job: Job) -> None:
    for path in ("/", "/v1/root", "/v1/snapshot", "/openapi.json", "/v1/nothing"):
        assert job.get(path, token="") == (401, {"error": "a valid token is required"})
        assert job.get(path, token="not-the-token")[0] == 401
    status, page = job.get(f"/?token={job.token}", token="")
    assert status == 200 and "<title>Monarch job</title>" in page
    assert job.get(f"/v1/root?token={job.token}", token="")[0] == 200
    assert job.get("/v1/root", token=job.secret)[0] == 200  # the job's secret is accepted too
    assert job.get("/v1/root", token=job.secret[:-2])[0] == 401


def test_bad_requests_get_4xx_json(job: Job) -> None:
    assert job.get("/v1/actor%3Anobody")[0] == 404
    assert job.get("/nowhere") == (404, {"error": "not found: /nowhere"})
    assert job.get("/v1/stacks/proc%3Anowhere")[0] == 404
    assert job.get("/v1/stacks/proc%3Anowhere?source=gdb")[0] == 400
    assert job.get("/v1/%ff")[0] == 400
    assert job.get("/v1/query?sql=SELECT%201")[0] == 404  # no telemetry here
    status, body = job.get("/v1/root", method="POST")
    assert status == 405 and "GET" in body["error"]
    # A request line the server cannot read.
    host, port = parse_addr(job.addr)
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):  # the server closes after its answer
            received += chunk
        answer = received.decode()
    assert answer.startswith("HTTP/1.") and " 400 " in answer.splitlines()[0]
    assert answer.rstrip().endswith("}") and "application/json" in answer
    assert job.get("/v1/root")[0] == 200


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(alphabet=string.printable + "é\u2603", max_size=40))
def test_any_path_is_answered_with_json_never_a_crash(job: Job, tail: str) -> None:
    path = "/v1/" + urllib.parse.quote(tail, safe="/%?=&:")
    status, body = job.get(path)
    assert status in (200, 400, 404), (path, status, body)
    if path.startswith("/v1/tree"):
        return
    assert isinstance(body, dict)
    assert ("error" in body) == (status != 200)


def test_the_openapi_document_names_the_routes(job: Job) -> None:
    spec = job.json("/openapi.json")
    assert spec["openapi"].startswith("3.")
    routes = {"/v1/root", "/v1/tree", "/v1/snapshot", "/v1/stacks/{ref}", "/v1/{ref}"}
    assert routes <= set(spec["paths"])


def test_the_token_file_is_private_and_goes_with_the_server() -> None:
    server = start_admin("127.0.0.1:0", quiet=True)
    try:
        path = token_file(server.port)
        assert path.read_text().strip() == server.token
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) & 0o077 == 0
    finally:
        server.close()
    assert not path.exists()


def test_the_token_file_goes_when_the_client_ends_without_closing(tmp_path: Path) -> None:
    script = (
        "from monarch.admin import start_admin\n"
        "server = start_admin('127.0.0.1:0', quiet=True)\n"
        "print(server.token_path, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.parent == tmp_path / ".monarch" / "admin"
    assert not path.exists()


def test_the_default_address_is_loopback() -> None:
    with configured(mesh_admin_addr="[::]:1729"), AdminServer() as server:
        assert server.host == "127.0.0.1"  # port 1729, or another when that one is taken
    with configured(mesh_admin_addr="127.0.0.1:0"), AdminServer() as server:
        assert server.host == "127.0.0.1" and server.port != 1729


@pytest.mark.parametrize("addr", ["1729", "localhost", "host:port", "127.0.0.1:70000"])
def test_a_bad_address_is_refused(addr: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        AdminServer(addr)


def test_a_taken_address_is_refused_when_asked_for() -> None:
    with AdminServer("127.0.0.1:0") as first, pytest.raises(OSError, match="cannot listen on"):
        AdminServer(f"127.0.0.1:{first.port}")


def test_py_spy_reads_a_proc_that_cannot_answer(job: Job) -> None:
    """py-spy dumps from outside: the stack of an actor holding its proc's GIL."""
    if pyspy_path() is None:
        pytest.skip("py-spy is not installed (hatch.toml's test environment has it)")
    job.snapshot()
    job.command("block")
    snap = wait_for(lambda: (s := job.snapshot()) and s["summary"]["not_answering"] == 1 and s)
    [held] = [p for p in procs(snap) if p["state"] == "not answering"]
    dump = job.json(f"/v1/stacks/{quote(held['ref'])}")
    assert dump["source"] == "py-spy"
    [main] = [
        t for t in dump["threads"] if t["frames"] and t["frames"][-1]["function"].endswith("block")
    ]
    assert main["frames"][-1]["function"] == "Looper.block"  # py-spy names the class too
    assert main["actors"] == [a["actor_id"] for a in held["actors"]]  # the actor's thread


def test_without_py_spy_a_proc_dumps_its_own_stacks() -> None:
    """``source=auto`` with no py-spy to be had (``PYSPY_BIN`` names none): the stack the
    proc takes of itself, and a note saying why."""
    job = Job(env={"PYSPY_BIN": "no-such-py-spy"})
    try:
        job.command("hang")
        snap = wait_for(
            lambda: (s := job.snapshot()) and actor(s, "workers", 0)["current"] == "hang" and s
        )
        stuck = actor(snap, "workers", 0)
        dump = job.json(f"/v1/stacks/{quote(stuck['ref'])}")
        assert dump["source"] == "self" and "py-spy is not installed" in dump["note"]
        [thread] = [t for t in dump["threads"] if stuck["actor_id"] in t["actors"]]
        assert thread["frames"][-1]["function"] == "hang"
        status, body = job.get(f"/v1/stacks/{quote(stuck['ref'])}?source=py-spy")
        assert status == 504 and "py-spy is not installed" in body["error"]
    finally:
        job.close()


def test_sql_goes_to_the_query_function_given() -> None:
    """``/v1/query``: the telemetry tables' SQL (monarch-jobs passes its engine's query)."""

    def query(sql: str) -> dict[str, Any]:
        if "nope" in sql:
            raise RuntimeError("SQL error: no table nope")
        return {"rows": [{"asked": sql}]}

    with AdminServer("127.0.0.1:0", query=query) as server:

        def get(path: str) -> tuple[int, Any]:
            request = urllib.request.Request(
                server.url + path, headers={"Authorization": f"Bearer {server.token}"}
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        assert get("/v1/root")[1]["properties"]["telemetry"] is True
        assert get("/v1/query?sql=SELECT%201") == (200, {"rows": [{"asked": "SELECT 1"}]})
        assert get("/v1/query?sql=SELECT%20*%20FROM%20nope") == (
            400,
            {"error": "SQL error: no table nope"},
        )
        assert get("/v1/query")[0] == 400


def test_close_lets_the_request_being_answered_finish_and_refuses_later_ones() -> None:
    """A job that closes its server and then stops its meshes must not be shown half stopped:
    close() returns once the answer in hand is sent; a kept-alive connection is refused."""
    entered, release = threading.Event(), threading.Event()

    def query(sql: str) -> dict[str, Any]:
        entered.set()
        assert release.wait(30)
        return {"rows": [{"asked": sql}]}

    server = AdminServer("127.0.0.1:0", query=query)
    headers = {"Authorization": f"Bearer {server.token}"}
    early = http.client.HTTPConnection(server.host, server.port, timeout=30)
    early.request("GET", "/v1/root", headers=headers)
    assert early.getresponse().read()  # a kept-alive connection, open before the close
    slow = http.client.HTTPConnection(server.host, server.port, timeout=30)
    answers: list[tuple[int, Any]] = []

    def ask() -> None:
        slow.request("GET", "/v1/query?sql=SELECT%201", headers=headers)
        response = slow.getresponse()
        answers.append((response.status, json.loads(response.read())))

    asker = threading.Thread(target=ask)
    asker.start()
    assert entered.wait(30)
    closer = threading.Thread(target=server.close)
    closer.start()
    wait_for(lambda: server._http.socket.fileno() == -1, message="the listening socket to close")
    closer.join(0.2)  # it would be over at once after that without the wait
    assert closer.is_alive(), "close() returned while a request was being answered"
    release.set()
    closer.join(30)
    asker.join(30)
    assert not closer.is_alive()
    assert answers == [(200, {"rows": [{"asked": "SELECT 1"}]})]
    early.request("GET", "/v1/root", headers=headers)
    refused = early.getresponse()
    assert (refused.status, json.loads(refused.read())) == (503, {"error": "admin server closed"})


def test_every_new_token_passes_as_the_value_of_token() -> None:
    """A token is pasted after ``--token``; one that argparse reads as an option made
    ``monarch profile --token TOKEN`` fail one time in 64."""
    import argparse

    from monarch.admin._auth import new_token
    from monarch.admin._client import add_server_options

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_server_options(parser)
    for _ in range(2000):
        token = new_token()
        assert parser.parse_args(["--token", token, "--addr", "h:1"]).token == token
