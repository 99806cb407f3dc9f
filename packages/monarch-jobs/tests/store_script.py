"""A torchrun-launched script whose ranks find Monarch's hosts through their rendezvous
store (``StoreJob.from_store``), run by test_store_job.py:

    torchrun ... store_script.py TRANSPORT

Rank 0 attaches, spawns 2 procs on every host and prints one JSON line: for each proc
its point, network namespace and host agent (its worker); then every rank meets at a
barrier and ends (and with it the worker it started, if it did).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from monarch.actor import Actor, endpoint
from monarch.job.spmd import StoreJob


def host_agent() -> int:
    """This proc's host agent: its parent, or its zygote's parent (``fork_procs``)."""
    parent = os.getppid()
    if b"monarch.core._host._zygote_proc" in Path(f"/proc/{parent}/cmdline").read_bytes():
        return int(Path(f"/proc/{parent}/stat").read_text().rpartition(")")[2].split()[1])
    return parent


class Where(Actor):
    @endpoint
    def where(self) -> dict[str, Any]:
        return {"net": os.readlink("/proc/self/ns/net"), "worker": host_agent()}


if __name__ == "__main__":
    dist.init_process_group("gloo")
    store = dist.distributed_c10d._get_default_store()
    job = StoreJob.from_store(store, transport=sys.argv[1])
    if job is not None:
        hosts = job.state().monarch_worker
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        found = procs.spawn("where", Where).where.call().get(timeout=60)
        seen = [{"point": dict(point), **value} for point, value in found.items()]
        print(json.dumps({"extent": dict(hosts.extent), "actors": seen}), flush=True)
        procs.stop().get(timeout=60)
    dist.barrier()
    dist.destroy_process_group()
