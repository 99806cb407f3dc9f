"""A process's limit of open files: raised to the hard limit as a runtime starts (a mesh of
more procs than a desktop's default soft limit spawns), and where the hard limit itself is
reached, the spawn fails at once with why."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from monarch.core._runtime._open_files import raise_open_files_limit

CLIENT = Path(__file__).with_name("open_files_client.py")
PROCS = 64


def run_with_limits(soft: int, hard: int) -> str:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    done = subprocess.run(
        [sys.executable, str(CLIENT), str(PROCS)],
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=limit,
    )
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    assert "STOPPED" in done.stdout, (done.stdout, done.stderr[-3000:])
    return done.stdout


def test_raising_the_limit_reaches_the_hard_limit() -> None:
    script = (
        "import resource\n"
        "from monarch.core._runtime._open_files import raise_open_files_limit\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 4096))\n"
        "print(raise_open_files_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"this process's hard limit ({hard}) is under 4096")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.split() == ["4096", "4096", "4096"], done.stderr
    assert raise_open_files_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_a_mesh_of_more_procs_than_the_soft_limit_spawns() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4 * PROCS:
        pytest.skip(f"this process's hard limit ({hard}) is too low")
    out = run_with_limits(PROCS, 4 * PROCS)
    assert f"LIMITS {PROCS} {4 * PROCS} {4 * PROCS} {4 * PROCS}" in out, out
    assert f"ANSWER {PROCS}" in out, out


def test_procs_beyond_the_hard_limit_fail_the_spawn_at_once() -> None:
    # Before: the zygote's pipes failed outside any handler, and the spawn waited for
    # host_spawn_ready_timeout (a TimeoutError that said nothing of descriptors). Where the
    # agent runs out first, the spawn says so; where it can no longer accept a proc's
    # connection, that proc ends before it was ready (seen under CI's load) and the spawn
    # fails at once too.
    out = run_with_limits(PROCS, PROCS)
    assert "FAILED RuntimeError" in out, out
    assert "Too many open files" in out or "before it was ready" in out, out
