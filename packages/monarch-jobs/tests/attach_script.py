"""A client that attaches to running workers (as a job's ``state()`` does once it knows
their addresses), spawns one proc on each and asks where it runs.

    MONARCH_JOB_SECRET=... python attach_script.py ADDRESS...

Prints one JSON line: per host, the network namespace of its proc.
"""

from __future__ import annotations

import json
import os
import sys

from monarch.actor import Actor, attach_to_workers, endpoint


class Where(Actor):
    @endpoint
    def net(self) -> str:
        return os.readlink("/proc/self/ns/net")


if __name__ == "__main__":
    hosts = attach_to_workers(workers=sys.argv[1:], name="hosts")
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    nets = procs.spawn("where", Where).net.call().get(timeout=60).values()
    print(json.dumps(list(nets)), flush=True)
    procs.stop().get(timeout=60)
