"""The tensor-engine workloads of ``tensor_bench.py``, written against upstream's API only.

Run by ``tensor_bench.py`` in a process of its own, once with our monarch (this repository's
interpreter) and once with upstream torchmonarch 0.7.0 (``benchmarks/.venvs/upstream``), so
both measure the very same code: ``this_host().spawn_procs``, ``ProcMesh.activate()``,
plain torch inside it, ``monarch.fetch_shard``, ``monarch.remote`` and ``Tensor.reduce``.

    python _tensor_workloads.py --json OUT [--reps N] [--ops N] [--big-mib N] [--procs N]

The JSON is rewritten after every figure: a workload that takes the process down (upstream's
reduce on CPU may) leaves the figures measured before it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _tensor_fns import add_one

import monarch
import monarch.actor
from monarch.actor import this_host

MIB = 1024 * 1024
warnings.simplefilter("ignore")


class Recorder:
    """Figures and errors, written to ``path`` after each change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.doc: dict[str, Any] = {"figures": {}, "errors": {}, "faults": []}
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f)
        os.replace(tmp, self.path)

    def attempt(self, name: str, fn: Callable[[], Any]) -> bool:
        progress(name)
        try:
            self.doc["figures"][name] = fn()
            return True
        except BaseException as error:  # noqa: BLE001 - recorded; the others still run
            text = f"{type(error).__name__}: {error}"
            self.doc["errors"][name] = text[:1500]
            progress(f"{name} failed: {text[:300]}")
            traceback.print_exc()
            return False
        finally:
            self.save()


def progress(text: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {text}", flush=True)


def run(rec: Recorder, reps: int, ops: int, big_mib: int, timeout: float, size: int = 2) -> None:
    def fault(failure: Any) -> None:  # upstream's default hook ends the client
        rec.doc["faults"].append(str(failure)[:1000])
        rec.save()

    monarch.actor.unhandled_fault_hook = fault
    remote_add = monarch.remote(add_one, propagate=lambda t: t.clone())

    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"gpus": size})
    procs.initialized.get(timeout=timeout)
    spawned = time.perf_counter()
    rec.doc["figures"]["spawn_s"] = spawned - t0

    def first_value() -> float:
        begun = time.perf_counter()
        with procs.activate():
            t = torch.full((4, 4), 3.0)
        value = monarch.fetch_shard(t, gpus=1).get(timeout=timeout)
        took = time.perf_counter() - begun
        if not torch.equal(value, torch.full((4, 4), 3.0)):
            raise AssertionError(f"first value {value}")
        return took

    if not rec.attempt("first_value_s", first_value):
        return

    def small_ops() -> list[float]:
        rates = []
        for _ in range(reps + 1):  # the first is a warm-up (first use of each code path)
            with procs.activate():
                t = torch.zeros(4, 4)
                monarch.fetch_shard(t).get(timeout=timeout)
                begun = time.perf_counter()
                for _ in range(ops):
                    t = t + 1
                value = monarch.fetch_shard(t).get(timeout=timeout)
                rates.append(ops / (time.perf_counter() - begun))
            if float(value[0, 0]) != ops:  # a local tensor: outside activate()
                raise AssertionError(f"{ops} additions gave {value}")
        return rates[1:]

    rec.attempt("small_ops_per_s", small_ops)

    def timed(make: Callable[[], Any], n: int) -> list[float]:
        """Per repetition, the median of ``n`` timings of ``make().get()`` in ms."""
        out = []
        for _ in range(reps):
            samples = []
            for _ in range(n):
                begun = time.perf_counter()
                make().get(timeout=timeout)
                samples.append(1000 * (time.perf_counter() - begun))
            out.append(statistics.median(samples))
        return out

    with procs.activate():
        small = torch.ones(4, 4)
    monarch.fetch_shard(small).get(timeout=timeout)
    rec.attempt("fetch_small_ms", lambda: timed(lambda: monarch.fetch_shard(small, gpus=1), 20))

    def remote_call() -> Any:
        with procs.activate():
            return monarch.fetch_shard(remote_add(small), gpus=1)

    rec.attempt("remote_fetch_ms", lambda: timed(remote_call, 20))

    numel = big_mib * MIB // 4
    with procs.activate():
        big = torch.ones(numel)
        head = big[:1]
    monarch.fetch_shard(head).get(timeout=timeout)

    def fetch_big() -> list[float]:
        monarch.fetch_shard(big, gpus=1).get(timeout=timeout)  # warm-up
        seconds = []
        for _ in range(reps):
            begun = time.perf_counter()
            value = monarch.fetch_shard(big, gpus=1).get(timeout=timeout)
            seconds.append(time.perf_counter() - begun)
            if value.numel() != numel:
                raise AssertionError(f"fetched {value.numel()} elements")
        return seconds

    rec.attempt(f"fetch_{big_mib}MiB_s", fetch_big)

    def reduce_tiny_first() -> float:
        """A fresh mesh's first tensor work is a reduce of a 4x4 tensor (from its procs'
        ``initialized``): the workers' spawn on those procs, their process group (the store,
        gloo's connections), the op and its fetch."""
        fresh = this_host().spawn_procs(per_host={"gpus": size})
        fresh.initialized.get(timeout=timeout)
        try:
            begun = time.perf_counter()
            with fresh.activate():
                r = torch.ones(4, 4).reduce("gpus", "sum")  # type: ignore[attr-defined]
            value = monarch.fetch_shard(r, gpus=1).get(timeout=min(timeout, 30.0))
            took = time.perf_counter() - begun
        finally:
            stopping = threading.Thread(target=lambda: fresh.stop().get(timeout=30), daemon=True)
            stopping.start()
            stopping.join(35)  # never hang on a mesh upstream's failed reduce left behind
        if float(value[0, 0]) != float(size):
            raise AssertionError(f"sum over {size} procs of ones gave {value}")
        return took

    # Upstream's reduce fails on CPU and may take its client down: the reductions come last.
    rec.attempt("reduce_tiny_first_s", reduce_tiny_first)

    def reduce_once() -> float:
        begun = time.perf_counter()
        with procs.activate():
            r = big.reduce("gpus", "sum")  # type: ignore[attr-defined]
            head = r[:1]
        value = monarch.fetch_shard(head, gpus=1).get(timeout=min(timeout, 30.0))
        took = time.perf_counter() - begun
        if float(value[0]) != float(size):
            raise AssertionError(f"sum over {size} procs of ones gave {value}")
        return took

    def reduce_in_place() -> list[float]:
        seconds = []
        for k in range(reps):
            begun = time.perf_counter()
            with procs.activate():
                big.reduce_("gpus", "sum")  # type: ignore[attr-defined]
            value = monarch.fetch_shard(head, gpus=1).get(timeout=timeout)
            seconds.append(time.perf_counter() - begun)
            if float(value[0]) != float(size) ** (k + 1):
                raise AssertionError(f"reduce_ {k + 1} times gave {value}")
        return seconds

    # The first large reduce (after the tiny one, which formed the process group).
    if rec.attempt(f"reduce_{big_mib}MiB_first_s", reduce_once):
        rec.attempt(f"reduce_{big_mib}MiB_s", lambda: [reduce_once() for _ in range(reps)])
        rec.attempt(f"reduce_inplace_{big_mib}MiB_s", reduce_in_place)

    stopped = threading.Event()

    def stop() -> None:
        try:
            procs.stop().get(timeout=timeout)
        finally:
            stopped.set()

    threading.Thread(target=stop, daemon=True).start()
    stopped.wait(timeout)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", required=True)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--big-mib", type=int, default=128)
    p.add_argument("--procs", type=int, default=2, help="the mesh's size (gpus)")
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()
    rec = Recorder(args.json)
    try:
        run(rec, args.reps, args.ops, args.big_mib, args.timeout, args.procs)
    except BaseException as error:  # noqa: BLE001 - recorded for the driver
        rec.doc["errors"]["run"] = f"{type(error).__name__}: {error}"[:1500]
        rec.save()
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # never wait on a mesh that a failed workload left behind


if __name__ == "__main__":
    sys.exit(main())
