"""How an unhandled failure ends the client: its report once, then status 1, no traceback.

Each test runs a client script in a child Python: the default fault hook ends that process.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

ACTORS = """
import os, signal, sys, threading, time
from monarch.actor import Actor, endpoint, this_host

class Fragile(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def explode(self) -> None:
        raise RuntimeError("nobody handles this")

    @endpoint
    def die(self) -> None:
        os._exit(3)
"""

REPORT = "Unhandled monarch error on the root actor"


def run_client(body: str) -> subprocess.CompletedProcess[str]:
    script = ACTORS + textwrap.dedent(body)
    argv = [sys.executable, "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90)


def assert_ended_cleanly(done: subprocess.CompletedProcess[str]) -> None:
    """Status 1, one report, no Python-internal traceback, the script did not go on."""
    assert done.returncode == 1, done.stderr
    assert done.stderr.count(REPORT) == 1, done.stderr
    # A remote traceback in the report is indented; the client's own would start a line.
    assert not re.search(r"^(Traceback|Exception ignored|KeyboardInterrupt)", done.stderr, re.M)
    assert "SystemExit" not in done.stderr, done.stderr
    assert "not reached" not in done.stdout


def test_an_actor_error_ends_a_blocked_client_with_status_1() -> None:
    done = run_client(
        """
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            procs.spawn("fragile", Fragile).explode.broadcast()
            threading.Event().wait(60)  # the failure interrupts this
            print("not reached")
        finally:
            print("finally ran", flush=True)
        """
    )
    assert_ended_cleanly(done)
    assert "nobody handles this" in done.stderr
    assert done.stdout == "finally ran\n"


def test_a_dead_proc_is_reported_once_by_the_users_actor() -> None:
    """Not also by the proc mesh's internal ``logger-<uid>``, which the user never spawned."""
    done = run_client(
        """
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        fragile = procs.spawn("fragile", Fragile)
        fragile.slice(gpus=1).die.broadcast()
        time.sleep(60)  # the failure interrupts this
        print("not reached")
        """
    )
    assert_ended_cleanly(done)
    assert "The actor <root>.<__main__.Fragile fragile{'gpus': 1/2}> and all" in done.stderr
    assert "logger-" not in done.stderr
    assert "exited with non-zero code 3" in done.stderr


def test_a_dead_proc_with_no_actor_of_the_users_is_reported_by_its_logger() -> None:
    done = run_client(
        """
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        fragile = procs.spawn("fragile", Fragile)
        pid = fragile.pid.call_one().get(timeout=60)
        fragile.stop().get(timeout=60)
        os.kill(pid, signal.SIGKILL)
        time.sleep(60)  # the failure interrupts this
        print("not reached")
        """
    )
    assert_ended_cleanly(done)
    assert "The actor logger-" in done.stderr
    assert "failed: Killed(sig=9)" in done.stderr, done.stderr


@pytest.mark.parametrize("where", ["get", "asyncio"])
def test_a_client_that_swallows_the_exit_still_ends_with_status_1(where: str) -> None:
    """``except BaseException`` catches the ``SystemExit``; the script goes on, then ends
    with status 1 (the failure was not handled)."""
    wait = (
        "fragile.die.call_one().get(timeout=60)"
        if where == "get"
        else "__import__('asyncio').run(fragile.die.call_one())"
    )
    done = run_client(
        f"""
        procs = this_host().spawn_procs(per_host={{"gpus": 1}})
        fragile = procs.spawn("fragile", Fragile)
        try:
            try:
                {wait}
            except Exception:
                pass  # the call's SupervisionError, when it comes before the end
            threading.Event().wait(60)
        except BaseException:
            print("swallowed", flush=True)
        print("went on", flush=True)
        """
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count(REPORT) == 1, done.stderr
    assert done.stdout == "swallowed\nwent on\n"


def test_a_hook_that_returns_keeps_the_client_running() -> None:
    """The hook's contract: returning drops the failure (the client goes on, status 0)."""
    done = run_client(
        """
        import monarch.actor
        seen = threading.Event()
        monarch.actor.unhandled_fault_hook = lambda failure: seen.set()
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        procs.spawn("fragile", Fragile).explode.broadcast()
        assert seen.wait(60)
        print("went on", flush=True)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "went on\n"
    assert REPORT not in done.stderr


def test_a_failure_reported_while_python_shuts_down_ends_it_with_status_1() -> None:
    """The hook is still running when the main thread is done (``threading._shutdown``
    joins it): no "Exception ignored in: threading._shutdown", status 1 all the same."""
    done = run_client(
        """
        import monarch.actor
        entered, leave = threading.Event(), threading.Event()
        default = monarch.actor.unhandled_fault_hook

        def hook(failure):
            if failure.mesh_name.startswith("fragile"):  # not the proc mesh's logger
                entered.set()
                leave.wait(60)  # until Python shuts down
            default(failure)

        monarch.actor.unhandled_fault_hook = hook
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        procs.spawn("fragile", Fragile).die.broadcast()
        assert entered.wait(60)
        threading._register_atexit(leave.set)  # first thing threading._shutdown does
        """
    )
    assert_ended_cleanly(done)
    assert "exited with non-zero code 3" in done.stderr


def test_an_oversize_reply_ends_the_client_with_its_report_not_a_keyboard_interrupt() -> None:
    done = run_client(
        """
        from monarch.config import configure

        class Large(Actor):
            @endpoint
            def large(self, size: int) -> bytes:
                return b"x" * size

        configure(codec_max_frame_length=10_000)
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            procs.spawn("large", Large).large.call_one(20_000).get(timeout=60)
        except Exception:
            pass  # the call's SupervisionError, when it comes before the end
        time.sleep(60)  # the failure interrupts this
        print("not reached")
        """
    )
    assert_ended_cleanly(done)
    assert "rejecting oversize frame" in done.stderr
