"""A torchrun-style script (run by SPMDActor.main in each proc): gloo all_reduce of the
ranks, appended to OUT/TAG-rank<RANK>.jsonl (a line per run) with the run's torchrun
environment and the proc's parent (its host's worker)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def host_agent() -> int:
    """The pid of this proc's host agent (its worker): its parent, or its zygote's parent
    when the agent forked it (``fork_procs``, see monarch-core's ``_zygote``)."""
    parent = os.getppid()
    if b"monarch.core._host._zygote_proc" in Path(f"/proc/{parent}/cmdline").read_bytes():
        return int(Path(f"/proc/{parent}/stat").read_text().rpartition(")")[2].split()[1])
    return parent


out, tag = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
try:
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    seen = {name: os.environ[name] for name in names}
    line = {"sum": total.item(), "env": seen, "name": __name__, "worker": host_agent()}
    with open(os.path.join(out, f"{tag}-rank{dist.get_rank()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
finally:
    dist.destroy_process_group()
