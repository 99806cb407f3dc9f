"""A client whose host agent's zygote is killed under its procs (test_zygote.py)."""

from __future__ import annotations

import os
import signal
import sys
import time

import monarch.actor
from monarch.actor import Actor, SupervisionError, endpoint, this_host
from monarch.core.testing import alive


class Where(Actor):
    @endpoint
    def parent(self) -> int:
        return os.getppid()

    @endpoint
    def pid(self) -> int:
        return os.getpid()


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
