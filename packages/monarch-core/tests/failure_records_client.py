"""A client whose meshes fail three ways (run by test_failure_records.py as its own
process, its system log at the path given): a proc killed, an actor whose endpoint raises
with nobody to tell, and a cascade (an actor's child fails and it does not handle it)."""

from __future__ import annotations

import os
import signal
import sys
import threading

import monarch.actor
from monarch.actor import Actor, MeshFailure, endpoint, this_host

heard: list[MeshFailure] = []
done = threading.Condition()


def hook(failure: MeshFailure) -> None:
    with done:
        heard.append(failure)
        done.notify_all()


class Victim(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def boom(self) -> None:
        raise KeyboardInterrupt("user code gave up")  # a BaseException: the actor fails


class Parent(Actor):
    @endpoint
    def start(self) -> None:
        procs = this_host().spawn_procs(name="inner")
        self.child = procs.spawn("child", Victim)
        self.child.boom.broadcast()

    @endpoint
    def ping(self) -> int:
        return 1


def wait_for(mesh: str) -> None:
    """Until the failure of mesh ``mesh`` (its name, before the uid) is heard."""
    with done:
        if not done.wait_for(
            lambda: any(f.mesh_name.startswith(f"{mesh}-") for f in heard), timeout=60
        ):
            sys.exit(f"no failure of {mesh} heard: {[f.mesh_name for f in heard]}")


def main() -> None:
    monarch.actor.unhandled_fault_hook = hook
    killed = this_host().spawn_procs(name="killed").spawn("killed", Victim)
    os.kill(killed.pid.call_one().get(), signal.SIGKILL)
    wait_for("killed")
    user = this_host().spawn_procs(name="user").spawn("user", Victim)
    user.boom.broadcast()
    wait_for("user")
    parent = this_host().spawn_procs(name="outer").spawn("parent", Parent)
    parent.start.call_one().get()
    wait_for("parent")
    print("ok", flush=True)


if __name__ == "__main__":
    main()
