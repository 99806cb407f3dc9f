"""A proc ends as the interpreter's exit would (threads joined, atexit handlers run, streams
flushed) without the interpreter's teardown (``_bootstrap.exit_now``), forked or not."""

from __future__ import annotations

import atexit
import os
import threading
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
