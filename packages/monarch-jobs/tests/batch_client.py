"""The client a SlurmJob runs in its own allocation (``apply(client_script=...)``), for
test_slurm_netns.py: ``python batch_client.py OUT LOGS``. Its ``state()`` attaches to the
job it runs in; it spawns a proc on each node and writes what it saw to OUT."""

from __future__ import annotations

import json
import os
import sys

from monarch.actor import Actor, endpoint
from monarch.job import SlurmJob


class Where(Actor):
    @endpoint
    def net(self) -> str:
        return os.readlink("/proc/self/ns/net")


if __name__ == "__main__":
    out, logs = sys.argv[1], sys.argv[2]
    job = SlurmJob({"hosts": 2}, sys.executable, exclusive=False, log_dir=logs)
    procs = job.state().hosts.spawn_procs(per_host={"gpus": 1})
    nets = procs.spawn("where", Where).net.call().get(timeout=60).values()
    seen = {
        "batch": os.environ.get("MONARCH_BATCH_JOB"),
        "job": os.environ.get("SLURM_JOB_ID"),
        "client": os.readlink("/proc/self/ns/net"),
        "nets": list(nets),
    }
    with open(f"{out}.part", "w") as file:
        file.write(json.dumps(seen))
    os.replace(f"{out}.part", out)
    procs.stop().get(timeout=60)
