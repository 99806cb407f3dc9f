"""One run of a user's script with a ProcessJob, for jobs_bench.py (upstream's API only, so
that upstream 0.7.0's interpreter runs it too).

    python _jobs_client.py run STARTED [local] [torch]
                                               state() (start or re-attach), one actor per host;
                                               ``local``: a LocalJob (this host) instead of a
                                               ProcessJob of 2 hosts; ``torch``: torch first
    python _jobs_client.py slurm STARTED LOGS  the same with a SlurmJob of 2 nodes (logs in LOGS)
    python _jobs_client.py kill                job_load() then kill()

``STARTED`` is the wall-clock time just before the process was started. Prints one JSON
line: seconds from process start, and from ``state()``, to the first reply of every host;
for Slurm also from the allocation's start (the time its batch script printed first).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def run(started: float, logs: str | None = None, local: bool = False) -> None:
    from monarch.actor import Actor, endpoint
    from monarch.job import LocalJob, ProcessJob, SlurmJob

    class Where(Actor):
        @endpoint
        def where(self) -> int:
            return os.getpid()

    begin = time.time()
    if local:
        state = LocalJob().state()
    elif logs is None:
        state = ProcessJob({"hosts": 2}).state()
    else:
        state = SlurmJob({"hosts": 2}, python_exe=sys.executable, log_dir=logs).state()
    procs = state.hosts.spawn_procs(per_host={"gpus": 1})
    procs.spawn("where", Where).where.call().get()
    end = time.time()
    result = {"from_process_start": end - started, "from_state": end - begin}
    if logs is not None:  # "monarch: allocated at <time> on <nodes>"
        (batch,) = Path(logs).glob("slurm-*/hosts-batch.out")
        granted = float(batch.read_text().split()[3])
        result["from_allocation"] = end - granted
        # When the last worker had written its address (its output file's first line).
        listening = max(out.stat().st_mtime for out in batch.parent.glob("hosts-[0-9]*.out"))
        result["workers_listening"] = listening - granted
    print(json.dumps(result), flush=True)
    os._exit(0)  # the workers stay up for the next run; nothing else to wait for


def kill() -> None:
    from monarch.job import job_load

    job_load(".monarch/job_state.pkl").kill()
    print(json.dumps({"killed": True}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    if "torch" in sys.argv[3:]:
        import torch  # noqa: F401 - a PyTorch user's script imports it first
    if sys.argv[1] == "run":
        run(float(sys.argv[2]), local="local" in sys.argv[3:])
    elif sys.argv[1] == "slurm":
        run(float(sys.argv[2]), sys.argv[3])
    else:
        kill()
