"""Jobs with real worker processes and a real Slurm; a script's re-runs re-attach."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobkit import Script

from monarch.core.testing import alive, wait_until
from monarch.job import (
    JobError,
    JobState,
    LocalJob,
    ProcessJob,
    SlurmJob,
    hosts_from_config,
    job_load,
    job_loads,
    set_current_job,
)


@pytest.fixture(params=["forked", "program"])
def script(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Script]:
    """The user's script; its ProcessJob workers forked from one fresh Python, or each
    started as a program."""
    fork = "1" if request.param == "forked" else "0"
    runner = Script(tmp_path, env={"MONARCH_JOBS_FORK_WORKERS": fork})
    try:
        yield runner
    finally:
        saved = tmp_path / ".monarch" / "job_state.pkl"
        if saved.exists():  # whatever the test left running
            job_load(saved).kill()


def test_a_second_run_reattaches_to_the_workers_the_first_started(script: Script) -> None:
    first, said = script("run", "2")
    assert "No cached job found at path: .monarch/job_state.pkl" in said
    assert "Saving job to cache" in said
    workers = first["workers"]
    assert len(set(workers)) == 2 and all(map(alive, workers))  # they outlive the script
    saved = script.folder / ".monarch" / "job_state.pkl"
    assert saved.stat().st_mode & 0o777 == 0o600  # it holds the job secret
    again, said = script("run", "2")
    assert "Job is running, returning current state" in said
    assert again["workers"] == workers
    assert script("kill")[0] == {"killed": True}
    assert not any(map(alive, workers))


def test_workers_are_never_the_script_s_forks_and_hold_none_of_its_descriptors(
    script: Script,
) -> None:
    read, write = os.pipe()  # the script's (fd >= 3): its workers must not keep it open
    try:
        done = script.run("run", "2", pass_fds=[write])
        os.close(write)
        assert done.returncode == 0, done.stderr
        workers = json.loads(done.stdout.splitlines()[-1])["workers"]
        assert all(map(alive, workers))  # they outlive the script ...
        ready, _, _ = select.select([read], [], [], 10)
        assert ready and os.read(read, 1) == b""  # ... and the pipe is closed: end of file
        forked = script.env["MONARCH_JOBS_FORK_WORKERS"] == "1"
        for pid in workers:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert not any(arg.endswith(b"job_script.py") for arg in cmdline)
            assert ("monarch.job._fork" if forked else "monarch.core.worker") in str(cmdline)
    finally:
        os.close(read)


def test_a_saved_job_whose_workers_are_gone_or_that_asks_for_other_hosts_starts_anew(
    script: Script,
) -> None:
    workers = script("run", "1")[0]["workers"]
    other, said = script("run", "2")  # another job: the saved one is not it
    assert "is another job (its hosts still run" in said
    assert len(other["workers"]) == 2 and not set(other["workers"]) & set(workers)
    job_load(script.folder / ".monarch" / "job_state.pkl").kill()
    assert not any(map(alive, other["workers"]))
    fresh, said = script("run", "2")  # same job, workers gone
    assert "no longer runs; starting anew" in said
    assert not set(fresh["workers"]) & set(other["workers"])
    for pid in workers:  # the first job's workers: saved over, so killed here
        if alive(pid):
            os.killpg(pid, 9)


def test_kill_in_the_script_whose_procs_still_run_ends_every_worker(script: Script) -> None:
    # The procs' end must not reach the unhandled-fault hook (which ends the client, as
    # upstream's): kill() stops them first, then signals every worker before waiting.
    for _ in range(3):  # it was a race: a client ended halfway left workers behind
        done = script.run("run-kill", "3")
        assert done.returncode == 0, done.stderr
        assert "Unhandled monarch error" not in done.stderr
        # An intentional stop reads as one: no "worker ... failed: lost connection".
        assert "failed" not in done.stderr, done.stderr
        workers = json.loads(done.stdout.splitlines()[0])["workers"]
        assert len(set(workers)) == 3 and not any(map(alive, workers))
        assert json.loads(done.stdout.splitlines()[1]) == {"killed": True}


def test_the_job_object_that_reattached_is_the_running_job(script: Script) -> None:
    first = script("run", "2")[0]["workers"]
    done = script.run("run-kill", "2")  # a new ProcessJob object re-attaches, then kills
    assert done.returncode == 0, done.stderr
    assert "Job is running, returning current state" in done.stderr
    assert json.loads(done.stdout.splitlines()[0])["workers"] == first
    assert not any(map(alive, first))


def test_a_corrupt_saved_job_is_said_and_replaced(script: Script) -> None:
    saved = script.folder / ".monarch" / "job_state.pkl"
    saved.parent.mkdir()
    saved.write_bytes(b"not a pickle")
    result, said = script("run", "1")
    assert "Ignoring the cached job at .monarch/job_state.pkl: not a saved job" in said
    assert len(result["workers"]) == 1
    assert isinstance(job_load(saved), ProcessJob)


def test_bad_input_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="number of hosts must be >= 1"):
        ProcessJob({"hosts": 0})
    with pytest.raises(ValueError, match="identifier"):
        ProcessJob({"my hosts": 1})
    with pytest.raises(JobError, match="not a saved job"):
        job_loads(b"junk")
    with pytest.raises(JobError, match="cannot read a saved job"):
        job_load(tmp_path / "missing.pkl")
    with pytest.raises(ValueError, match="a script and its arguments"):
        LocalJob().apply(client_script="  ")
    with pytest.raises(JobError, match="ProcessJob cannot run batch-mode scripts"):
        ProcessJob({"hosts": 1}).apply(client_script="train.py")
    two = SlurmJob({"a": 1, "b": 1}, log_dir=str(tmp_path))
    with pytest.raises(JobError, match="a SlurmJob of one mesh"):
        two.apply(client_script="train.py")


BATCH_CLIENT = """if True:
    import json, os, signal, sys
    from monarch.actor import Actor, endpoint
    from monarch.job import LocalJob

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    hosts = LocalJob().state(cached_path=None).hosts
    proc = hosts.spawn_procs().spawn("pid", Pid).pid.call_one().get(timeout=60)
    seen = {"batch": os.environ.get("MONARCH_BATCH_JOB"), "session": os.getsid(0),
            "pid": os.getpid(), "proc": proc, "args": sys.argv[1:]}
    with open(sys.argv[1] + ".part", "w") as out:
        out.write(json.dumps(seen))
    os.replace(sys.argv[1] + ".part", sys.argv[1])
    if sys.argv[2:] == ["wait"]:
        signal.pause()
"""


def test_a_local_job_runs_its_client_script_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    client = tmp_path / "client.py"
    client.write_text(BATCH_CLIENT)
    out = tmp_path / "seen.json"
    job = LocalJob()
    job.apply(client_script=f"{client} {out}")
    assert job.process.wait(120) == 0, (Path(job.log_dir or "") / "stderr.log").read_text()
    seen = json.loads(out.read_text())
    assert seen["batch"] == "1" and seen["args"] == [str(out)]
    assert seen["session"] == seen["pid"] == job.process.pid  # a session of its own
    assert seen["proc"] != seen["pid"]
    assert Path(job.log_dir or "").parent == tmp_path.resolve() / ".monarch/logs"

    # One that runs on: kill() ends it.
    waiting = LocalJob()
    waiting.apply(client_script=f"{client} {out}.2 wait")
    wait_until(lambda: Path(f"{out}.2").exists(), 120, "the client is up")
    waiting.kill()
    assert waiting.process.wait(30) != 0


def test_local_job_meshes_are_this_host() -> None:
    job = LocalJob(hosts=("trainers", "workers"))
    state = job.state(cached_path=None)
    assert isinstance(state, JobState)
    assert state.trainers.extent == state.workers.extent
    with pytest.raises(AttributeError, match=r"no mesh 'other' \(its meshes: trainers, workers\)"):
        _ = state.other
    set_current_job(job)
    assert hosts_from_config("trainers").extent == state.trainers.extent
    assert job.can_run(LocalJob(hosts=("trainers", "workers")))
    assert not job.can_run(LocalJob())


# -- Slurm ---------------------------------------------------------------------------------

START_SLURM = Path(__file__).parents[3] / "tools" / "slurm" / "start.sh"


@pytest.fixture(scope="session")
def slurm() -> None:
    """A real one-node Slurm (tools/slurm/start.sh; its packages come from
    tools/system-packages.sh). Where it cannot run (not root, no Slurm) the test fails
    saying so: it is not silently skipped."""
    if shutil.which("sbatch") is None:
        pytest.fail("no Slurm here: tools/system-packages.sh installs it (as root)")
    done = subprocess.run(["bash", str(START_SLURM)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.fail(f"Slurm did not start: {done.stderr}")


def squeue() -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True).stdout


@pytest.mark.system
def test_a_slurm_job_allocates_attaches_reattaches_and_is_cancelled(
    slurm: None, tmp_path: Path
) -> None:
    script = Script(tmp_path)
    saved = tmp_path / ".monarch" / "job_state.pkl"
    logs = str(script.folder / "slurm-logs")
    try:
        first, said = script("slurm", logs)
        assert "Saving job to cache" in said
        assert "monarch_job RUNNING" in squeue()
        again, said = script("slurm", logs)
        assert "Job is running, returning current state" in said
        assert again["workers"] == first["workers"]  # the same worker, in its allocation
        script("kill")
        assert isinstance(job_load(saved), SlurmJob)
        deadline = time.monotonic() + 60
        while "monarch_job" in squeue():
            assert time.monotonic() < deadline, squeue()
            time.sleep(0.1)
        assert not any(map(alive, first["workers"]))
    finally:
        if saved.exists():  # whatever the test left allocated
            job_load(saved).kill()


@pytest.mark.system
def test_a_failing_sbatch_says_why(slurm: None, tmp_path: Path) -> None:
    job = SlurmJob({"hosts": 1}, partition="no-such-partition", log_dir=str(tmp_path))
    with pytest.raises(JobError, match="invalid partition"):
        job.apply()


TUTORIAL = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from job_script import host_agent
from monarch.actor import Actor, HostMesh, ProcMesh, context, endpoint
from monarch.job import hosts_from_config


class Trainer(Actor):
    @endpoint
    def step(self):
        return f"Trainer {context().message_rank} taking a step.", host_agent()


hosts: HostMesh = hosts_from_config("MONARCH_HOSTS")
print(json.dumps({"hosts": dict(hosts.extent)}), flush=True)
trainer_procs: ProcMesh = hosts.spawn_procs(per_host={"gpus": 4})
trainers = trainer_procs.spawn("trainer", Trainer)
said = trainers.step.call().get()
print(json.dumps({"procs": dict(trainer_procs.extent), "said": [s for s, _ in said.values()],
                  "workers": sorted({w for _, w in said.values()})}), flush=True)
"""


def test_hosts_from_config_with_no_job_starts_local_workers(tmp_path: Path) -> None:
    # upstream's getting-started tutorial, its multi-host part, where no job is configured
    done = subprocess.run(
        [sys.executable, "-c", TUTORIAL, str(Path(__file__).parent)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert first == {"hosts": {"hosts": 2}}
    assert second["procs"] == {"hosts": 2, "gpus": 4}
    assert len(second["said"]) == 8 and all("taking a step" in s for s in second["said"])
    assert len(second["workers"]) == 2
    wait_until(lambda: not any(map(alive, second["workers"])), 30, "the workers end with it")
    assert not (tmp_path / ".monarch").exists()  # nothing saved: the next run starts afresh
