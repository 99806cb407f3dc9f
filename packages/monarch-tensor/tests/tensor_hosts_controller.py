"""The controller of test_hosts.py, run on a "host" of its own (a network namespace).

    python tensor_hosts_controller.py WORKER_ADDRESS [WORKER_ADDRESS ...]

Attaches to a ``monarch worker`` on each host, spawns one proc per host, and drives
distributed tensors over them: a reduction and ``to_mesh`` across the hosts (gloo between
machines); prints one JSON line of what it fetched.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch

import monarch
from monarch.actor import attach_to_workers
from monarch.tensor import rank_tensor


def main(addresses: list[str]) -> None:
    warnings.simplefilter("ignore")
    hosts = attach_to_workers(workers=addresses, ca="trust_all_connections")
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    with procs.activate():
        rank = rank_tensor("hosts").float()
        values = torch.ones(1 << 16) * (rank + 1)
        total = values.reduce("hosts", "sum")
        values.reduce_("hosts", "max")
    summed = [float(monarch.fetch_shard(total, hosts=h).get(timeout=120)[0]) for h in (0, 1)]
    maxed = [float(monarch.fetch_shard(values, hosts=h).get(timeout=120)[-1]) for h in (0, 1)]
    print(json.dumps({"summed": summed, "maxed": maxed}), flush=True)
    procs.stop().get(timeout=60)


if __name__ == "__main__":
    main(sys.argv[1:])
