"""A client that spawns more procs than its soft limit of open files was.

    python open_files_client.py PROCS

Prints the limits it started with and has once its runtime started (``LIMITS``), then
``ANSWER`` and how many procs answered, or ``FAILED`` and the error; then ``STOPPED``.
"""

from __future__ import annotations

import os
import resource
import sys

import monarch.actor
from monarch.actor import Actor, endpoint, this_host
from monarch.core import current_runtime

monarch.actor.unhandled_fault_hook = lambda failure: None  # the call's error says it


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


before = resource.getrlimit(resource.RLIMIT_NOFILE)
current_runtime()
print("LIMITS", *before, *resource.getrlimit(resource.RLIMIT_NOFILE), flush=True)
procs = this_host().spawn_procs(per_host={"gpus": int(sys.argv[1])})
try:
    pids = procs.spawn("pid", Pid).pid.call().get(timeout=60)
    print("ANSWER", len(set(pids.values())), flush=True)
except Exception as exc:  # noqa: BLE001 - what the test reads
    print("FAILED", type(exc).__name__, exc, flush=True)
procs.stop().get(timeout=60)
print("STOPPED", flush=True)
