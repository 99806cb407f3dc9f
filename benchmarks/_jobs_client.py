"""One run of a user's script with a ProcessJob, for jobs_bench.py (upstream's API only, so
that upstream 0.7.0's interpreter runs it too).

    python _jobs_client.py run STARTED   state() (start or re-attach), one actor per host
    python _jobs_client.py kill          job_load() then kill()

``STARTED`` is the wall-clock time just before the process was started. Prints one JSON
line: seconds from process start, and from ``state()``, to the first reply of every host.
"""

from __future__ import annotations

import json
import os
import sys
import time


def run(started: float) -> None:
    from monarch.actor import Actor, endpoint
    from monarch.job import ProcessJob

    class Where(Actor):
        @endpoint
        def where(self) -> int:
            return os.getpid()

    begin = time.time()
    state = ProcessJob({"hosts": 2}).state()
    procs = state.hosts.spawn_procs(per_host={"gpus": 1})
    procs.spawn("where", Where).where.call().get()
    end = time.time()
    print(json.dumps({"from_process_start": end - started, "from_state": end - begin}), flush=True)
    os._exit(0)  # the workers stay up for the next run; nothing else to wait for


def kill() -> None:
    from monarch.job import job_load

    job_load(".monarch/job_state.pkl").kill()
    print(json.dumps({"killed": True}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(float(sys.argv[2]))
    else:
        kill()
