"""A client whose procs reach their limit of threads (a pids cgroup, Linux).

    python thread_limit_client.py CGROUP EXTRA [forward]

Joins CGROUP (a pids cgroup of its own) before Monarch starts anything, so that the
zygote and the procs are in it too; limits it to EXTRA tasks more than it holds; spawns 2
procs with a sync actor each (with ``forward``, their output forwarded: read by the
agent) and calls them. Prints ``ANSWER`` and the values, or
``FAILED`` and the error; then lifts the limit, stops the procs and prints ``STOPPED``.
"""

from __future__ import annotations

import os
import sys

cgroup = sys.argv[1]
with open(os.path.join(cgroup, "cgroup.procs"), "w") as joined:
    joined.write(str(os.getpid()))

import monarch.actor  # noqa: E402 - in the cgroup first
from monarch.actor import Actor, endpoint, this_host  # noqa: E402
from monarch.config import configure  # noqa: E402

monarch.actor.unhandled_fault_hook = lambda failure: None  # the call's error says it
configure(enable_log_forwarding=sys.argv[3:] == ["forward"])


class Counted(Actor):
    @endpoint
    def rank(self) -> int:
        return os.getpid()


def limit(value: str) -> None:
    with open(os.path.join(cgroup, "pids.max"), "w") as file:
        file.write(value)


with open(os.path.join(cgroup, "pids.current")) as current:
    limit(str(int(current.read()) + int(sys.argv[2])))
procs = None
try:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    values = procs.spawn("counted", Counted).rank.call().get(timeout=30)
    print("ANSWER", len(set(values.values())), flush=True)
except Exception as exc:  # noqa: BLE001 - what the test reads
    print("FAILED", type(exc).__name__, exc, flush=True)
finally:
    limit("max")
if procs is not None:
    procs.stop().get(timeout=30)
print("STOPPED", flush=True)
