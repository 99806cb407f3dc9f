"""A `remote` call and its fetch inside ``activate()``, with the batch carried in the fetch
and without (``CARRIED = 0``: the batch broadcast first), alternated in one process so that
both see the same load; a plain fetch beside them as the floor.

Run with ``hatch run python benchmarks/tensor_carried_ab.py [--rounds N] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch  # noqa: F401 - a PyTorch user's script imports it first

import monarch
import monarch.tensor._client as tensor_client
from monarch.actor import this_host

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import machine_info  # noqa: E402
from _tensor_fns import add_one  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--out", default=str(HERE / "results" / "tensor29_carried_ab.json"))
    args = p.parse_args()
    remote_add = monarch.remote(add_one, propagate=lambda t: t.clone())
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    procs.initialized.get(timeout=300)
    with procs.activate():
        small = torch.ones(4, 4)
    monarch.fetch_shard(small).get(timeout=300)

    def remote_call() -> Any:
        with procs.activate():
            return monarch.fetch_shard(remote_add(small), gpus=1)

    def fetch() -> Any:
        return monarch.fetch_shard(small, gpus=1)

    def median_ms(make: Callable[[], Any]) -> float:
        samples = []
        for _ in range(args.calls):
            begun = time.perf_counter()
            make().get(timeout=300)
            samples.append(1000 * (time.perf_counter() - begun))
        return statistics.median(samples)

    for _ in range(args.calls):  # warm-up: the function loaded, the caches filled
        remote_call().get(timeout=300)
    carried = tensor_client.CARRIED
    figures: dict[str, list[float]] = {"carried": [], "broadcast": [], "fetch": []}
    for _ in range(args.rounds):
        tensor_client.CARRIED = carried
        figures["carried"].append(median_ms(remote_call))
        tensor_client.CARRIED = 0
        figures["broadcast"].append(median_ms(remote_call))
        figures["fetch"].append(median_ms(fetch))
    tensor_client.CARRIED = carried
    procs.stop().get(timeout=120)
    doc = {
        "benchmark": "tensor_carried_ab",
        "machine": machine_info(),
        "unit": "ms, median of each round's calls",
        "rounds": figures,
        "median": {name: statistics.median(values) for name, values in figures.items()},
    }
    Path(args.out).write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc["median"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
