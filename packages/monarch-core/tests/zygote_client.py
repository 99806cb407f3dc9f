"""A client whose host agent's zygote is killed under its procs (test_zygote.py)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import monarch.actor
from monarch.actor import Actor, SupervisionError, endpoint, this_host


class Where(Actor):
    @endpoint
    def parent(self) -> int:
        return os.getppid()

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaps is not: this container's init may not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def main() -> None:
    monarch.actor.unhandled_fault_hook = lambda failure: None  # expected: the procs die
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("where", Where)
    zygotes = set(mesh.parent.call().get(timeout=60).values())
    assert len(zygotes) == 1 and os.getpid() not in zygotes, zygotes
    pids = list(mesh.pid.call().get(timeout=60).values())
    os.kill(zygotes.pop(), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while any(map(alive, pids)):  # they die with it
        assert time.monotonic() < deadline, f"procs {pids} outlived their zygote"
        time.sleep(0.01)
    try:
        mesh.parent.call().get(timeout=60)
    except SupervisionError as exc:
        print("FAILED:", str(exc).splitlines()[-1].strip())
    again = this_host().spawn_procs(per_host={"gpus": 2}).spawn("again", Where)
    parents = set(again.parent.call().get(timeout=60).values())
    print("PARENTS ARE US:", parents == {os.getpid()})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
