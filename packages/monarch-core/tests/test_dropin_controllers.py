"""Drop-in controllers (``get_or_spawn_controller``), as upstream's: a controller lives in the
root client and may start procs of its own with ``this_host()``; one asked for from an actor
on a proc mesh that travelled in a message is the client's; a client started by another
client's process (a test isolated in a subprocess) is the root of a job of its own.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from typing import Any

from monarch.actor import Actor, ProcMesh, endpoint, get_or_spawn_controller, this_host


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Starter(Actor):
    """A controller that starts procs of its own and hands back actors on them."""

    @endpoint
    def start(self) -> Any:
        return this_host().spawn_procs(per_host={"gpus": 2}).spawn("pids", Pid)


def _pids_of_two_controllers(tag: str) -> tuple[list[int], list[int]]:
    first = get_or_spawn_controller(f"starter-{tag}-0", Starter).get(timeout=60)
    second = get_or_spawn_controller(f"starter-{tag}-1", Starter).get(timeout=60)
    pids = []
    for controller in (first, second):
        actors = controller.start.call_one().get(timeout=60)
        pids.append(sorted(actors.pid.call().get(timeout=60).values()))
    return pids[0], pids[1]


def test_controllers_spawn_procs_on_this_host() -> None:
    first, second = _pids_of_two_controllers("here")
    assert len(set(first)) == 2 and len(set(second)) == 2
    assert not set(first) & set(second) and os.getpid() not in first + second


_CLIENT = """if True:
    import os, sys
    from monarch.actor import Actor, endpoint, get_or_spawn_controller, this_host

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    class Starter(Actor):
        @endpoint
        def start(self):
            return this_host().spawn_procs(per_host={"gpus": 2}).spawn("pids", Pid)

    controller = get_or_spawn_controller("starter", Starter).get(timeout=60)
    actors = controller.start.call_one().get(timeout=60)
    print(sorted(actors.pid.call().get(timeout=60).values()), flush=True)
    os._exit(0)
"""


def test_a_client_started_by_a_clients_process_has_controllers_of_its_own() -> None:
    this_host()  # this process's runtime runs, and names itself in the environment it passes on
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT],
        env=dict(os.environ),  # as a test isolated in a subprocess gets it
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    pids = ast.literal_eval(done.stdout.splitlines()[-1])
    assert len(set(pids)) == 2 and os.getpid() not in pids


class Store(Actor):
    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    @endpoint
    def put(self, key: str, value: int) -> None:
        self.values[key] = value

    @endpoint
    def get(self, key: str) -> int:
        return self.values[key]


class Reader(Actor):
    @endpoint
    def read(self, key: str) -> int:
        store = get_or_spawn_controller("drop-in store", Store).get(timeout=60)
        return int(store.get.call_one(key).get(timeout=60))


class Holder(Actor):
    @endpoint
    def hold(self, procs: ProcMesh) -> None:
        self.procs = procs

    @endpoint
    def read_through(self, key: str) -> int:
        reader = self.procs.spawn("reader", Reader)
        return int(reader.read.call_one(key).get(timeout=60))


def test_a_controller_asked_for_on_an_unpickled_proc_mesh_is_the_clients() -> None:
    holder = this_host().spawn_procs(per_host={"procs": 1}).spawn("holder", Holder)
    store = get_or_spawn_controller("drop-in store", Store).get(timeout=60)
    store.put.call_one("a", 1).get(timeout=60)
    procs = this_host().spawn_procs(per_host={"procs": 1})
    holder.hold.call(procs).get(timeout=60)  # the proc mesh travels in a message
    assert holder.read_through.call_one("a").get(timeout=60) == 1
