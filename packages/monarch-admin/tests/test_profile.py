"""``monarch profile --torch``: the torch profiler's ops of a proc that uses torch on that
proc's track of the one trace; and procs that record themselves (those of other hosts),
py-spy run by the proc against its own pid."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from adminkit import HERE, Job

from monarch.actor import Actor, endpoint, this_host
from monarch.admin._profile import sample
from monarch.admin._stacks import pyspy_path
from monarch.core import spawned_procs


@pytest.fixture
def job() -> Iterator[Job]:
    job = Job()
    try:
        yield job
    finally:
        job.close()


def test_torch_ops_land_on_the_track_of_the_proc_that_ran_them(job: Job, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if pyspy_path() is None:
        pytest.skip("py-spy is not installed (pyspy_bin, PYSPY_BIN, PATH)")
    job.command("torch")  # worker 1 multiplies matrices; no other proc imported torch
    prefix = tmp_path / "prof"
    where = ["--addr", job.addr, "--token", job.token, "-o", str(prefix)]
    done = subprocess.run(
        [sys.executable, "-m", "monarch.core", "profile", "--torch", "--seconds", "1", *where],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    events = json.loads((tmp_path / "prof.json").read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    named = [e for e in events if e["name"] == "thread_name"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in named}
    torch_ops = [e for e in events if e.get("cat") == "torch"]
    (pid,) = {e["pid"] for e in torch_ops}  # one proc used torch
    assert processes[pid].startswith("workers[1] ")  # its own process track, named
    assert any(e["name"] == "aten::mm" and e["ph"] == "X" for e in torch_ops)
    assert all(threads[(pid, e["tid"])].startswith("torch thread ") for e in torch_ops)
    sampled = {e["pid"] for e in events if e.get("cat") == "py-spy"}
    assert pid in sampled  # its Python samples beside its torch ops, one process track
    mms = [e for e in torch_ops if e["name"] == "aten::mm"]
    spy = [e for e in events if e.get("cat") == "py-spy" and e["pid"] == pid]
    # on one clock: the ops lie within the profile's window as py-spy saw it (+-5 s of slack)
    first, last = min(e["ts"] for e in spy), max(e["ts"] for e in spy)
    assert all(first - 5e6 <= e["ts"] <= last + 5e6 for e in mms)


class Idle(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def test_procs_of_other_hosts_sample_themselves() -> None:
    """A proc not on this machine (as ``is_local`` says) is sampled by py-spy run by the
    proc itself, against its own pid, its trace sent back: on the proc's track."""
    if pyspy_path() is None:
        pytest.skip("py-spy is not installed (pyspy_bin, PYSPY_BIN, PATH)")
    procs = this_host().spawn_procs(per_host={"gpus": 2}, name="remote")
    procs.spawn("idle", Idle).ping.call().get()
    try:
        live = [p for p in spawned_procs() if p.mesh == "remote" and p.exited is None]
        assert len(live) == 2
        profile = sample(live, 1.0, 50, True, is_local=lambda proc: False)
        assert profile.notes == []
        sampled = {e["pid"] for e in profile.events if e.get("cat") == "py-spy"}
        assert sampled == {p.pid for p in live}
        bases = {path.split(";")[0] for path in profile.stacks}
        assert bases == {"remote[0]", "remote[1]"}
    finally:
        procs.stop().get()


def test_a_proc_on_another_host_samples_itself(tmp_path: Path) -> None:
    """``monarch profile`` of a job whose proc runs under ``monarch worker`` on another
    host (network namespaces): py-spy runs there, in the proc, against its own pid (its
    samples show the profiler's own frame), and the trace comes back onto its track."""
    if pyspy_path() is None:
        pytest.skip("py-spy is not installed (pyspy_bin, PYSPY_BIN, PATH)")
    kit = str(HERE.parents[1] / "monarch-core" / "tests")
    sys.path.insert(0, kit)  # monarch-core's test kit: hosts in network namespaces
    try:
        from hostkit import (  # type: ignore[import-not-found]
            NetnsUnavailable,
            children,
            network_namespaces,
            start_worker,
        )
    finally:
        sys.path.remove(kit)

    from monarch.core import SECRET_ENV
    from monarch.core.testing import ROOT_ENV

    own = {k: v for k, v in os.environ.items() if k != ROOT_ENV}
    env = {**own, SECRET_ENV: secrets.token_hex(32), "HOME": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    try:
        with network_namespaces(2, f"mpf{os.getpid() % 100000}") as (h1, h2), children() as start:
            _, worker = start_worker(start, env, "tcp://10.0.0.2:0", netns=h2)
            in_h1 = ["ip", "netns", "exec", h1, sys.executable]
            client = start([*in_h1, str(HERE / "remote_profile_job.py"), worker], env, stdin=True)
            hello = client.json(120)
            prefix = tmp_path / "far"
            where = ["--addr", hello["addr"], "--token", hello["token"], "-o", str(prefix)]
            done = subprocess.run(
                [*in_h1, "-m", "monarch.core", "profile", "--seconds", "1", "--idle", *where],
                capture_output=True,
                text=True,
                timeout=180,
                env=env,
            )
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))
    assert done.returncode == 0, done.stderr
    assert "not sampled" not in done.stderr
    events = json.loads((tmp_path / "far.json").read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    (far,) = [pid for pid, name in processes.items() if "tcp://10.0.0.2:" in name]
    assert processes[far].startswith("far[0] ")
    spied = [e for e in events if e.get("cat") == "py-spy" and e["pid"] == far]
    assert any(e["name"] == "record_self" for e in spied)  # it sampled itself
