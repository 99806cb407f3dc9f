"""The ``monarch apply / exec / kill`` subcommands, run as the real command line would be,
on a real ProcessJob; a user's script attaches to the job ``monarch apply`` started."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobkit import Script, Terminal

from monarch.core.testing import alive
from monarch.job import ProcessJob, job_load

MONARCH = shutil.which("monarch", path=str(Path(sys.executable).parent)) or "monarch"
JOBFILE = """from monarch.job import ProcessJob

job = ProcessJob({"hosts": 2})
if __name__ == "__main__":
    raise SystemExit("monarch apply must not run the file as __main__")
"""


def monarch(folder: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MONARCH, *args], cwd=folder, input=stdin, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "job.py").write_text(JOBFILE)
    try:
        yield tmp_path
    finally:
        saved = tmp_path / ".monarch" / "job_state.pkl"
        if saved.exists():
            job_load(saved).kill()


def test_help_lists_the_job_commands() -> None:
    done = subprocess.run([MONARCH, "--help"], capture_output=True, text=True, check=True)
    for command in ("apply", "exec", "kill", "shell", "worker"):
        assert f"    {command}" in done.stdout
    assert "skipping subcommand plug-in" not in done.stderr  # every plug-in loads


def test_apply_exec_kill_and_a_script_that_attaches(folder: Path) -> None:
    done = monarch(folder, "apply", "job.py")
    assert done.returncode == 0, done.stderr
    assert "ProcessJob is running; saved at .monarch/job_state.pkl" in done.stdout
    assert "Starting ProcessJob: done in" in done.stderr  # the long step, timed
    job = job_load(folder / ".monarch" / "job_state.pkl")
    assert isinstance(job, ProcessJob)
    workers = sorted(w.pid for ws in job._workers.values() for w in ws)

    again = monarch(folder, "apply", "job.py")
    assert again.returncode == 0 and "already running" in again.stdout

    attached, said = Script(folder)("run", "2")  # a user's script: state() attaches
    assert "Job is running, returning current state" in said
    assert attached["workers"] == workers

    line = 'echo "$MONARCH_RANK_HOSTS of $MONARCH_SIZE_HOSTS"; echo second'
    ran = monarch(folder, "exec", "--", "sh", "-c", line)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "[hosts=0] 0 of 2",
        "[hosts=0] second",
        "[hosts=1] 1 of 2",
        "[hosts=1] second",
    ]
    gpus = monarch(
        folder,
        "exec",
        "--per-host",
        "gpus=2",
        "--rank",
        "3",
        "--env",
        "X=1",
        "--",
        "sh",
        "-c",
        "echo $X $MONARCH_RANK_GPUS; exit 7",
    )
    assert gpus.returncode == 7
    assert gpus.stdout.splitlines() == ["[hosts=1,gpus=1] 1 1"]
    assert "[hosts=1,gpus=1] exit status 7" in gpus.stderr

    term = Terminal([MONARCH, "shell", "--rank", "1", "-e", "X=5"], folder)
    try:  # an interactive shell on host 1
        term.until(b"# ")
        term.type(b"echo x-$X; tty; exit 4\r")
        term.until(b"x-5")
        term.until(b"/dev/pts/")
        assert term.proc.wait(60) == 4
    finally:
        term.close()
    every = monarch(folder, "shell", "--all", stdin="echo hi\nexit\necho never\n")
    assert every.returncode == 0
    assert every.stdout.splitlines() == ["[hosts=0] hi", "[hosts=1] hi"]

    killed = monarch(folder, "kill")
    assert killed.returncode == 0, killed.stderr
    assert not any(map(alive, workers))
    assert not (folder / ".monarch" / "job_state.pkl").exists()
    gone = monarch(folder, "exec", "--", "true")
    assert gone.returncode == 1
    assert "monarch exec: cannot read a saved job at .monarch/job_state.pkl" in gone.stderr


def test_a_saved_job_that_stopped_is_said(folder: Path) -> None:
    assert monarch(folder, "apply", "job.py").returncode == 0
    job_load(folder / ".monarch" / "job_state.pkl").kill()
    done = monarch(folder, "exec", "--", "true")
    assert done.returncode == 1 and "no longer runs (`monarch apply` starts it)" in done.stderr
    restarted = monarch(folder, "apply", "job.py")
    assert restarted.returncode == 0 and "is running" in restarted.stdout


def test_bad_input_is_one_clear_line(folder: Path) -> None:
    (folder / "empty.py").write_text("x = 1\n")
    cases = [
        (["apply", "missing.py"], "monarch apply: no such file: missing.py"),
        (["apply", "empty.py"], "empty.py defines no job"),
        (["exec"], "no command given"),
        (["exec", "--per-host", "gpus=0", "--", "true"], "must be a positive integer"),
        (["exec", "--env", "NOVALUE", "--", "true"], "--env must be NAME=VALUE"),
        (["kill"], "monarch kill: cannot read a saved job"),
        (["shell"], "monarch shell: cannot read a saved job"),
    ]
    for args, said in cases:
        done = monarch(folder, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
