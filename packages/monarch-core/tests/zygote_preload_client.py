"""A script whose procs ask their zygote to preload a module (test_zygote.py).

    python zygote_preload_client.py MODE MODULE

The first procs are forked at once, without MODULE; the zygote's successor imports it
meanwhile and forks the procs asked for once it is done. Prints one JSON line per step.
MODE: ``ready`` waits for the successor and spawns from it; ``torch`` (MODULE torch,
imported here first, ``proc_preload`` left at "auto") also sends a first proc a tensor;
``thread`` (a MODULE that starts a thread) waits for the successor to give up; ``kill``
kills the successor under a proc it forked.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import monarch.actor
from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.config import configured

MODE, MODULE = sys.argv[1], sys.argv[2]
if MODE == "torch":
    import torch  # before the first spawn: proc_preload "auto" then names it

T = TypeVar("T")
faults: list[str] = []
monarch.actor.unhandled_fault_hook = lambda failure: faults.append(str(failure))


class Probe(Actor):
    @endpoint
    def probe(self, module: str) -> dict[str, Any]:
        found = module in sys.modules  # first: nothing of this proc's imports it
        parent = os.getppid()
        return {
            "pid": os.getpid(),
            "parent": parent,
            "found": found,
            "imported_by": getattr(sys.modules.get(module), "IMPORTED_BY", None),
            "parent_threads": len(os.listdir(f"/proc/{parent}/task")),
        }

    @endpoint
    def double(self, tensor: Any) -> tuple[Any, bool]:
        return tensor * 2, "torch" in sys.modules


def children(pid: int) -> set[int]:
    """The live children of ``pid`` (from /proc: zombies excluded)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[1] == str(pid) and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def until(check: Callable[[], T | None], what: str, timeout: float = 120) -> T:
    deadline = time.monotonic() + timeout
    while (value := check()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)
    return value


def spawn(count: int) -> tuple[ProcMesh, list[dict[str, Any]]]:
    procs = this_host().spawn_procs(per_host={"gpus": count})
    probes = procs.spawn("probe", Probe)
    return procs, list(probes.probe.call(MODULE).get(timeout=120).values())


def show(step: str, value: object) -> None:
    print(json.dumps({step: value}), flush=True)


def from_successor(successor: int) -> tuple[ProcMesh, dict[str, Any]]:
    """Spawn procs until one is the successor's (it serves once it has preloaded)."""

    def attempt() -> tuple[ProcMesh, dict[str, Any]] | None:
        procs, (found,) = spawn(1)
        if found["parent"] == successor:
            return procs, found
        procs.stop().get(timeout=60)
        return None

    return until(attempt, "no proc forked by the zygote's successor")


def main() -> None:
    first, found = spawn(2)
    show("first", found)
    zygote = found[0]["parent"]
    if MODE == "torch":
        mesh = first.spawn("probe", Probe).slice(gpus=0)
        doubled, imported = mesh.double.call_one(torch.ones(2)).get(timeout=120)
        show("tensor", [doubled.tolist(), imported])
    first.stop().get(timeout=60)
    if MODE == "thread":  # the successor imports, finds a thread and exits
        until(lambda: True if not children(zygote) else None, "the successor stays")
        _, after = spawn(1)
        show("after", after)
        return
    procs_first = {proc["pid"] for proc in found}
    successor = until(lambda: next(iter(children(zygote) - procs_first), None), "no successor")
    show("successor", successor != zygote)
    procs, later = from_successor(successor)
    show("later", later)
    if MODE == "kill":
        os.kill(successor, signal.SIGKILL)
        until(lambda: True if faults else None, "the proc's death went unreported")
        show("fault", faults[0])
        procs.stop().get(timeout=60)
        _, after = spawn(1)
        show("after", after)


if __name__ == "__main__":
    if MODE == "torch":
        main()  # proc_preload "auto": torch, imported here
    else:
        with configured(proc_preload=MODULE):
            main()
    sys.stdout.flush()
    os._exit(0)
