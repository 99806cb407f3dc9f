"""The forker of a ProcessJob's workers (``_fork``): real processes, its failures said."""

from __future__ import annotations

import os
import resource
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from monarch.core import SECRET_ENV, ForkedProc
from monarch.core.testing import alive, wait_until
from monarch.job import JobError
from monarch.job._fork import Forker


def test_a_forker_that_cannot_start_is_a_job_error_with_what_it_said(tmp_path: Path) -> None:
    broken = tmp_path / "broken" / "monarch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('no monarch in this environment')\n")
    log = tmp_path / "w.log"
    log.touch()
    env = {**os.environ, "PYTHONPATH": str(broken.parent)}  # the job's own path comes first
    forker = Forker([("unix://@never", str(log))], env, str(tmp_path / "forker.log"), False)
    with pytest.raises(
        JobError, match=r"(?s)forked 0 of 1 and exited with 1: .*no monarch in this"
    ):
        forker.wait_pids(60)


def test_a_forker_is_read_whatever_its_pipe_is_numbered(tmp_path: Path) -> None:
    # A client of many procs holds over 1,024 descriptors: select() refused the forker's
    # pipe there (ValueError); poll() takes any.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit of open files here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        test_a_forker_that_cannot_start_is_a_job_error_with_what_it_said(tmp_path)
    finally:
        for fd in held:
            os.close(fd)


def test_a_forked_worker_that_cannot_listen_says_why_in_its_log(tmp_path: Path) -> None:
    taken = socket.socket(socket.AF_UNIX)
    name = f"monarch-test-taken-{secrets.token_hex(4)}"
    taken.bind("\0" + name)
    try:
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        for log in logs:
            log.touch()
        env = {**os.environ, SECRET_ENV: secrets.token_hex(32)}
        specs = [(f"unix://@{name}", str(logs[0])), (f"unix://@{name}-free", str(logs[1]))]
        forker = Forker(specs, env, str(tmp_path / "forker.log"))
        first, second = forker.wait_pids(60)
        wait_until(lambda: not alive(first), 60, "the worker that cannot listen ends")
        assert "Address already in use" in logs[0].read_text()
        wait_until(lambda: logs[1].read_text().startswith(specs[1][0]), 60, "the other listens")
        assert os.getsid(second) == second  # a session of its own
        os.killpg(second, 9)
    finally:
        taken.close()


def test_the_forker_is_a_fork_of_the_scripts_zygote(tmp_path: Path) -> None:
    """No Python starts for it: the script's zygote (started as it imported monarch.actor)
    forks it, and it forks the workers, which serve in sessions of their own."""
    log = tmp_path / "w.log"
    log.touch()
    env = {**os.environ, SECRET_ENV: secrets.token_hex(32)}
    address = f"unix://@monarch-test-forked-{secrets.token_hex(4)}"
    forker = Forker([(address, str(log))], env, str(tmp_path / "forker.log"))
    (worker,) = forker.wait_pids(60)
    try:
        assert isinstance(forker.process, ForkedProc) and forker.process.returncode == 0
        wait_until(lambda: log.read_text().startswith(address), 60, "the worker listens")
        assert os.getsid(worker) == worker
    finally:
        os.killpg(worker, 9)


WITHOUT_ZYGOTE = """if True:
    import os, secrets, signal, subprocess, sys, time
    from monarch.core.lowlevel import current_zygote, prestart_zygote
    from monarch.job._fork import Forker

    prestart_zygote()
    zygote = current_zygote()
    zygote.process.kill()
    deadline = time.monotonic() + 60
    while not zygote.failed:  # its reader thread hears it exit
        assert time.monotonic() < deadline, "the zygote's exit went unnoticed"
        time.sleep(0.01)
    log, address = sys.argv[1], sys.argv[2]
    forker = Forker([(address, log)], dict(os.environ), log + ".forker")
    (worker,) = forker.wait_pids(60)
    print(isinstance(forker.process, subprocess.Popen), worker, flush=True)
"""


def test_without_a_zygote_the_forker_is_a_new_python(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.touch()
    address = f"unix://@monarch-test-unforked-{secrets.token_hex(4)}"
    env = {**os.environ, SECRET_ENV: secrets.token_hex(32)}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ZYGOTE, str(log), address],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    popen, worker = done.stdout.split()
    try:
        assert popen == "True"
        wait_until(lambda: log.read_text().startswith(address), 60, "the worker listens")
    finally:
        os.killpg(int(worker), 9)
