"""Controller scripts for test_code_sync.py, each run as its own process (a controller
that attaches to workers listens on TCP; each scenario gets a fresh runtime). Each step
prints one JSON line; ``next`` lines on stdin move it on.

    python sync_controller.py reload SRC ADDR...   (edits SRC between steps)
    python sync_controller.py fault SRC ADDR...    (one sync; its outcome)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from monarch.actor import Actor, WorkspaceSyncError, endpoint
from monarch.core._host._attach import attach_to_workers
from monarch.tools.config import Workspace


class Uses(Actor):
    """Defined in ``__main__`` (by value): calls into the synced module by name."""

    @endpoint
    def version(self) -> int:
        import trainlib  # type: ignore[import-not-found]  # synced, on the proc's sys.path

        result: int = trainlib.version()
        return result


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def wait_for_next() -> None:
    line = sys.stdin.readline()
    assert line.strip() == "next", line


def reload(src: Path, addresses: list[str]) -> None:
    hosts = attach_to_workers(workers=addresses)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    workspace = Workspace(dirs=[src])
    hosts.sync_workspace(workspace, auto_reload=True).get(timeout=60)
    sys.path.insert(0, str(src))  # the client imports it too: its class goes by reference
    import trainlib

    uses = procs.spawn("uses", Uses)
    counter = procs.spawn("counter", trainlib.Counter)
    say(
        step="first",
        uses=uses.version.call().get().values(),
        counter=counter.value.call().get().values(),
    )
    for step in ("edited", "removed"):
        wait_for_next()  # the test edits src
        hosts.sync_workspace(workspace, auto_reload=True).get(timeout=60)
        say(
            step=step,
            uses=uses.version.call().get().values(),
            counter=counter.value.call().get().values(),
        )
    wait_for_next()  # the test edits src again: the ProcMesh form pushes and reloads it
    procs.sync_workspace(workspace, auto_reload=True).get(timeout=60)
    say(
        step="procs",
        uses=uses.version.call().get().values(),
        counter=counter.value.call().get().values(),
    )
    wait_for_next()
    procs.sync_workspace(workspace).get(timeout=60)  # nothing changed
    later = hosts.spawn_procs(per_host={"gpus": 1})  # spawned after the syncs: found there
    say(step="again", later=later.spawn("uses", Uses).version.call().get().values())


def fault(src: Path, addresses: list[str]) -> None:
    hosts = attach_to_workers(workers=addresses)
    say(step="syncing")
    try:
        hosts.sync_workspace(Workspace(dirs={src: "ws"})).get(timeout=120)
    except WorkspaceSyncError as error:
        say(step="failed", message=str(error), ranks=sorted(error.failures))
        return
    say(step="synced")


if __name__ == "__main__":
    mode, source, *workers = sys.argv[1:]
    {"reload": reload, "fault": fault}[mode](Path(source), workers)
