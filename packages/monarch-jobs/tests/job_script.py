"""A user's script with a ProcessJob, run as its own process by test_process_job.py.

    python job_script.py run HOSTS     state() (start or re-attach), one actor per host
    python job_script.py slurm LOGS    the same with a SlurmJob of one node
    python job_script.py ssh JSON      the same with SSHJob(**JSON); each reply also names the
                                       network namespace of its proc
    python job_script.py kill          job_load() then kill()
    python job_script.py run-kill N    run with N hosts, then kill() in the same process, its
                                       procs still up
    python job_script.py spmd TRAIN OUT   serve() a torchrun line (2 hosts x 2), run it twice
    python job_script.py spmd-again    job_load() that job and run it once more
    python job_script.py spmd-slurm TRAIN OUT LOGS   serve() a torchrun line (2 nodes x 2)
                                       on Slurm, run it twice on the same allocation; prints
                                       each run's losses (what TRAIN wrote to OUT)
Prints one JSON line: the workers' pids (the parents of the actors' procs).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from monarch.actor import Actor, endpoint, this_host
from monarch.job import JobTrait, ProcessJob, SlurmJob, SSHJob, job_load


def host_agent() -> int:
    """The pid of this proc's host agent (its worker): its parent, or its zygote's parent
    when the agent forked it (``fork_procs``, see monarch-core's ``_zygote``)."""
    parent = os.getppid()
    if b"monarch.core._host._zygote_proc" in Path(f"/proc/{parent}/cmdline").read_bytes():
        return int(Path(f"/proc/{parent}/stat").read_text().rpartition(")")[2].split()[1])
    return parent


class Where(Actor):
    @endpoint
    def where(self) -> dict[str, Any]:
        net = os.readlink("/proc/self/ns/net")
        return {"pid": os.getpid(), "worker": host_agent(), "net": net}


def run(job: JobTrait, kill: bool = False) -> None:
    state = job.state()
    procs = state.hosts.spawn_procs(per_host={"gpus": 1})
    seen = procs.spawn("where", Where).where.call().get(timeout=60).values()
    workers = sorted(v["worker"] for v in seen)
    print(json.dumps({"workers": workers, "nets": sorted(v["net"] for v in seen)}), flush=True)
    if kill:
        job.kill()
        # Time for what the hosts' end sends (already in the sockets) to be read: a
        # failure it reports ends this client (status 1, "Unhandled monarch error").
        local = this_host().spawn_procs()
        local.spawn("where", Where).where.call().get(timeout=60)
        local.stop().get(timeout=60)
        print(json.dumps({"killed": True}), flush=True)
    else:
        procs.stop().get(timeout=60)


def kill() -> None:
    job = job_load()
    job.kill()
    print(json.dumps({"killed": True}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(ProcessJob({"hosts": int(sys.argv[2])}))
    elif sys.argv[1] == "run-kill":
        run(ProcessJob({"hosts": int(sys.argv[2])}), kill=True)
    elif sys.argv[1] == "spmd":
        from monarch.job.spmd import serve

        line = ["torchrun", "--nnodes=2", "--nproc-per-node=2", sys.argv[2], sys.argv[3], "t"]
        spmd = serve(line, scheduler="local")
        spmd.run_spmd(cached_path=".monarch/job_state.pkl")
        spmd.run_spmd()
        print(json.dumps({"runs": 2}), flush=True)
    elif sys.argv[1] == "spmd-again":
        saved = job_load()
        saved.run_spmd(cached_path=".monarch/job_state.pkl")  # type: ignore[attr-defined]
        print(json.dumps({"runs": 1}), flush=True)
    elif sys.argv[1] == "spmd-slurm":
        from monarch.job.spmd import serve

        train, out = sys.argv[2], Path(sys.argv[3])
        line = ["torchrun", "--nnodes=2", "--nproc-per-node=2", train, str(out)]
        cfg = {"python_exe": sys.executable, "exclusive": False, "log_dir": sys.argv[4]}
        spmd = serve(line, scheduler="slurm", scheduler_cfg=cfg)
        runs = []
        for number in (1, 2):  # the second on the same hosts: no new allocation
            spmd.run_spmd(cached_path=".monarch/job_state.pkl")
            ranks = [json.loads(text) for text in out.read_text().splitlines()]
            out.unlink()
            losses = next(r["losses"] for r in ranks if r["rank"] == 0)
            print(f"run {number}: losses {losses}", flush=True)
            runs.append({"losses": losses, "at": sorted((r["rank"], r["address"]) for r in ranks)})
        jobs = sorted(spmd._job._jobs.values())  # type: ignore[attr-defined]
        print(json.dumps({"runs": runs, "slurm_jobs": jobs}), flush=True)
    elif sys.argv[1] == "slurm":
        python, logs = sys.executable, sys.argv[2]
        run(SlurmJob({"hosts": 1}, python, monarch_port=0, exclusive=False, log_dir=logs))
    elif sys.argv[1] == "ssh":
        run(SSHJob(**json.loads(sys.argv[2])))
    else:
        kill()
