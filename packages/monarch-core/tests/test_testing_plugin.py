"""monarch.core.testing and the pytest plugin behind it (``monarch._testing``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from importlib.metadata import entry_points

import pytest

import monarch.actor
from monarch.core import MeshFailure
from monarch.core.lowlevel import process_alive, process_start, process_state
from monarch.core.testing import Failures, alive, stopped, wait_until


def test_the_plugin_is_registered_and_loads_without_the_core() -> None:
    """Every pytest run of the environment loads it: it must not import the runtime."""
    assert [e.value for e in entry_points(group="pytest11") if e.name == "monarch_core"] == [
        "monarch._testing"
    ]
    code = "import sys, monarch._testing; print(sorted(m for m in sys.modules if 'core' in m))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "monarch.core" not in done.stdout, done.stdout


def test_unhandled_failures_is_the_hook_of_this_test(unhandled_failures: Failures) -> None:
    failure = MeshFailure("mine", [0], "gone")
    monarch.actor.unhandled_fault_hook(failure)
    assert list(unhandled_failures) == [failure]


def test_wait_for_returns_a_failure_recorded_from_another_thread() -> None:
    failures = Failures()
    other = MeshFailure("other", [1], "gone")
    wanted = MeshFailure("doomed_1", [0], "gone")

    def arrive() -> None:
        failures.record(other)
        failures.record(wanted)

    later = threading.Timer(0.05, arrive)
    later.start()
    try:
        assert failures.wait_for("doomed", timeout=30) is wanted
    finally:
        later.join()
    assert failures.seen == [other, wanted]


def test_wait_for_fails_at_its_deadline_naming_what_it_saw() -> None:
    failures = Failures()
    failures.record(MeshFailure("other", [1], "gone"))
    with pytest.raises(AssertionError, match=r"no failure of doomed within 0\.01 s"):
        failures.wait_for("doomed", timeout=0.01)


def test_alive_and_stopped_follow_a_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert alive(child.pid) and not stopped(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(child.pid), 30, "the child stopped")
        os.kill(child.pid, signal.SIGKILL)
        wait_until(lambda: not alive(child.pid), 30, "the child a zombie")  # not reaped yet
    finally:
        child.kill()
        child.wait()
    assert not alive(child.pid)


def test_the_tests_check_processes_as_production_code_does() -> None:
    """One pid check for the tests, the launchers and monarch-admin's discovery."""
    assert alive is process_alive
    assert alive(os.getpid()) and process_state(os.getpid()) in {"R", "S"}
    start = process_start(os.getpid())
    assert start is not None and process_alive(os.getpid(), start)
    assert not process_alive(os.getpid(), str(int(start) + 1))  # another process, same pid


def test_wait_until_fails_at_its_deadline() -> None:
    with pytest.raises(AssertionError, match=r"not within 0\.01s: never"):
        wait_until(lambda: False, 0.01, "never")
