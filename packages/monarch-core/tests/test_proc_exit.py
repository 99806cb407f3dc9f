"""A proc ends as the interpreter's exit would (threads joined, atexit handlers run, streams
flushed) without the interpreter's teardown (``_bootstrap.exit_now``), forked or not."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from monarch.actor import Actor, endpoint, this_host
from monarch.config import configured


class Exiting(Actor):
    """Leaves work for the proc's exit: a non-daemon thread that writes once the main
    thread has ended (the interpreter's exit marks it so before it joins the others), and
    an atexit handler."""

    @endpoint
    def arm(self, path: str) -> int:
        def work() -> None:
            threading.main_thread().join()
            _write(path, "thread")

        threading.Thread(target=work, daemon=False).start()
        atexit.register(_write, path, "atexit")
        return os.getpid()


def _write(path: str, what: str) -> None:
    with open(path, "a") as f:
        f.write(f"{what}\n")


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "new-python"])
def test_a_stopped_proc_joins_its_threads_then_runs_atexit_handlers(
    tmp_path: Path, fork: bool
) -> None:
    with configured(fork_procs=fork):
        procs = this_host().spawn_procs(per_host={"gpus": 2})
    files = [tmp_path / f"rank{i}" for i in range(2)]
    actors = procs.spawn("exiting", Exiting)
    pids = [actors.slice(gpus=i).arm.call_one(str(files[i])).get(timeout=60) for i in range(2)]
    procs.stop().get(timeout=60)
    for pid in pids:  # stop() returned once each exit was reported: they are gone
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    for f in files:
        assert f.read_text().splitlines() == ["thread", "atexit"]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_exit_clears_the_modules_imported_since_the_start_and_only_those() -> None:
    """``finalize_modules`` walks ``sys.modules`` back from its end (its order is the
    order of import) and stops at the first module the process started with: what was
    imported since is cleared, latest first, and nothing before it is read at all."""
    from monarch.core._host._bootstrap import finalize_modules

    older = types.ModuleType("monarch_test_exit_older")  # not counted at the start: a
    sys.modules[older.__name__] = older  # module the walk never reaches
    setattr(older, "kept", "kept")  # noqa: B010 - a module: mypy knows none of its names
    started_with = frozenset(sys.modules) - {older.__name__}
    cleared = []
    for name in ("monarch_test_exit_new1", "monarch_test_exit_new2"):
        module = types.ModuleType(name)
        setattr(module, "value", [name])  # noqa: B010 - as above
        sys.modules[name] = module
        cleared.append(module)
    # a module the process started with, imported again since: the walk's end
    sys.modules["monarch_test_exit_again"] = types.ModuleType("monarch_test_exit_again")
    started_with |= {"monarch_test_exit_again"}
    latest = types.ModuleType("monarch_test_exit_latest")
    setattr(latest, "value", ["latest"])  # noqa: B010 - as above
    sys.modules[latest.__name__] = latest
    try:
        finalize_modules(started_with)
        assert latest.__name__ not in sys.modules and latest.value is None
        for module in cleared:  # imported before the one imported again: not reached
            assert sys.modules[module.__name__] is module and module.value == [module.__name__]
        assert sys.modules[older.__name__] is older and older.kept == "kept"
    finally:
        for name in [name for name in sys.modules if name.startswith("monarch_test_exit_")]:
            del sys.modules[name]


def test_the_exit_runs_the_finalizers_registered_since_the_start_and_only_those() -> None:
    """``skip_finalizers_before`` leaves the exit a registry of the process's own
    finalizers, read back from the registry's end; the others are not called at exit."""
    script = """if True:
        import weakref
        from monarch.core._host._bootstrap import next_finalizer, skip_finalizers_before

        class Thing:
            pass

        inherited = [Thing() for _ in range(3)]
        for i, thing in enumerate(inherited):
            weakref.finalize(thing, print, f"inherited {i}")
        first_own = next_finalizer()
        own = [Thing() for _ in range(2)]
        for i, thing in enumerate(own):
            weakref.finalize(thing, print, f"own {i}")
        skip_finalizers_before(first_own)
        print("exiting")
    """
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    # the interpreter's exit calls the registry's finalizers, latest first
    assert done.stdout.splitlines() == ["exiting", "own 1", "own 0"]


def test_a_proc_that_never_reaches_its_host_agent_fails_and_says_why() -> None:
    """A proc started for an agent it cannot reach (gone, or out of descriptors to accept
    it) ends with status 1 and the reason on its stderr, which the spawn's error then
    quotes; once it has reached its agent, the agent's going is its clean stop."""
    from monarch.core._host._environ import PARENT_ENV, RANK_ENV, READY_ENV

    nobody = f"unix://@monarch-test-unreachable-agent-{os.getpid()}"
    env = {**os.environ, PARENT_ENV: nobody, READY_ENV: f"{nobody}#1", RANK_ENV: "3"}
    done = subprocess.run(
        [sys.executable, "-m", "monarch.core._host._proc"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert f"monarch proc 3: its host agent at {nobody} could not be reached" in done.stderr
    assert "ECONNREFUSED" in done.stderr or "refused" in done.stderr.lower(), done.stderr
