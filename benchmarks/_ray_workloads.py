"""``core_bench.py``'s workloads with Ray actors, run in a Ray interpreter.

``benchmarks/.venvs/ray`` (``baselines.py create``) has ``ray==2.60.0``; core_bench runs::

    .venvs/ray/bin/python _ray_workloads.py --json OUT --sizes '{...}'   # the workloads
    .venvs/ray/bin/python _ray_workloads.py cold                         # one cold start

The counterparts of the Monarch workloads (``_actor_workloads.py``):

* the mesh of 4: ``ray.init(address="local", num_cpus=4)`` and 4 ``Echo`` actors (each its
  own worker process, as each Monarch proc is); one actor stands for ``one``. Plus one
  ``AsyncEcho`` actor (an ``async def`` method; Ray runs it on the actor's event loop).
* round trip: ``ray.get(one.ping.remote())``; awaited: ``await one.ping.remote()``.
* pipelined: N ``one.ping.remote()``, then ``ray.get`` on each reference.
* fire-and-forget: N ``one.tick.remote()`` whose references are dropped, then
  ``ray.get(one.ticks.remote())``. Ray runs one caller's calls to a (non-async) actor in
  order, so the count it returns proves all N were handled.
* mesh of 4 and gather: ``ray.get([a.ping.remote() for a in actors])``.
* payloads: ``ray.get(one.sink.remote(x))`` and ``ray.get(one.echo.remote(x))`` (above
  100 KiB Ray passes arguments and results through its shared-memory object store).
* cold start: a fresh ``python _ray_workloads.py cold``: ``import ray``, ``ray.init``
  (a new local cluster), one actor, its first reply; ``ray.shutdown()`` is the stop.
"""

from __future__ import annotations

import time

t_main = time.monotonic()

import asyncio  # noqa: E402 - the cold start is timed from the very top
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import ray  # type: ignore[import-not-found, unused-ignore]  # noqa: E402

t_imported = time.monotonic()

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _raw_peer import rss_kib  # noqa: E402
from _workloads import (  # noqa: E402
    MESH_SIZE,
    check_echo,
    cold_figures,
    latency,
    pids_pss,
    pids_rss,
    run_cold,
    script_main,
)


class Echo:
    """A Ray actor class (``ray.remote(Echo)``): sync methods, as monarch's Echo."""

    def __init__(self) -> None:
        self.count = 0

    def ping(self) -> None:
        return None

    def echo(self, x: Any) -> Any:
        return x

    def sink(self, x: Any) -> None:
        return None

    def tick(self) -> None:
        self.count += 1

    def ticks(self) -> int:
        return self.count

    def pid(self) -> int:
        return os.getpid()


class AsyncEcho:
    """An async actor: ``async def`` methods run on the actor's event loop."""

    async def ping(self) -> None:
        return None


def _init() -> None:
    ray.init(address="local", num_cpus=MESH_SIZE, log_to_driver=False)


class RaySide:
    name = "ray"

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.runner = asyncio.Runner()
        _init()
        remote_echo = ray.remote(Echo)
        self.actors = [remote_echo.remote() for _ in range(MESH_SIZE)]
        self.one = self.actors[0]
        self.async_one = ray.remote(AsyncEcho).remote()
        self.pids: list[int] = [
            int(pid) for pid in ray.get([a.pid.remote() for a in self.actors], timeout=timeout)
        ]
        ray.get(self.async_one.ping.remote(), timeout=timeout)

    def roundtrip(self, n: int) -> dict[str, float]:
        return latency("roundtrip_sync", self._sequential(self.one.ping, n))

    def roundtrip_async_endpoint(self, n: int) -> dict[str, float]:
        return latency("roundtrip_async_endpoint", self._sequential(self.async_one.ping, n))

    def _sequential(self, ping: Any, n: int) -> list[float]:
        timeout, clock, get = self.timeout, time.perf_counter, ray.get
        samples = []
        for _ in range(n):
            t0 = clock()
            get(ping.remote(), timeout=timeout)
            samples.append(clock() - t0)
        return samples

    def roundtrip_await(self, n: int) -> dict[str, float]:
        async def run() -> list[float]:
            ping, clock = self.one.ping, time.perf_counter
            samples = []
            for _ in range(n):
                t0 = clock()
                await ping.remote()
                samples.append(clock() - t0)
            return samples

        return latency("roundtrip_await", self.runner.run(asyncio.wait_for(run(), self.timeout)))

    def pipelined(self, n: int) -> dict[str, float]:
        ping, timeout, get = self.one.ping, self.timeout, ray.get
        t0 = time.perf_counter()
        refs = [ping.remote() for _ in range(n)]
        for ref in refs:
            get(ref, timeout=timeout)
        return {"pipelined_calls_per_s": n / (time.perf_counter() - t0)}

    def fire_and_forget(self, n: int) -> dict[str, float]:
        one = self.one
        before = int(ray.get(one.ticks.remote(), timeout=self.timeout))
        tick = one.tick
        t0 = time.perf_counter()
        for _ in range(n):
            tick.remote()
        after = int(ray.get(one.ticks.remote(), timeout=self.timeout))
        elapsed = time.perf_counter() - t0
        if after - before != n:
            raise AssertionError(f"the reply saw {after - before} of {n} calls")
        return {"fire_and_forget_msgs_per_s": n / elapsed}

    def mesh_gather(self, n: int) -> dict[str, float]:
        actors, timeout, clock = self.actors, self.timeout, time.perf_counter
        samples = []
        values: list[Any] = []
        for _ in range(n):
            t0 = clock()
            values = ray.get([a.ping.remote() for a in actors], timeout=timeout)
            samples.append(clock() - t0)
        if len(values) != MESH_SIZE:
            raise AssertionError(f"gathered {len(values)} values")
        return latency("mesh4_gather", samples)

    def payload(self, mib: int, data: bytes, count: int) -> dict[str, float]:
        one, timeout, clock = self.one, self.timeout, time.perf_counter
        t0 = clock()
        for _ in range(count):
            if ray.get(one.sink.remote(data), timeout=timeout) is not None:
                raise AssertionError("sink returned a value")
        oneway = clock() - t0
        t0 = clock()
        for _ in range(count):
            check_echo(ray.get(one.echo.remote(data), timeout=timeout), len(data))
        echo = clock() - t0
        return {
            f"payload_{mib}MiB_oneway_MiBps": mib * count / oneway,
            f"payload_{mib}MiB_echo_MiBps": 2 * mib * count / echo,
        }

    def cold_start(self, timeout: float) -> dict[str, float]:
        return cold_figures(run_cold([str(Path(__file__).resolve()), "cold"], timeout))

    def worker_rss(self) -> list[float]:
        return pids_rss(self.pids)

    def worker_pss(self) -> list[float]:
        return pids_pss(self.pids)

    def stop(self) -> None:
        try:
            ray.shutdown()
        finally:
            self.runner.close()


def cold() -> None:
    """One cold start (a fresh process): print its timings as one JSON line."""
    t_spawn = time.monotonic()
    _init()
    actor = ray.remote(Echo).remote()
    pid = int(ray.get(actor.pid.remote(), timeout=120))
    t_reply = time.monotonic()
    for _ in range(3):
        ray.get(actor.ping.remote(), timeout=60)
    doc: dict[str, Any] = {
        "t_main": t_main,
        "t_imported": t_imported,
        "t_spawn": t_spawn,
        "t_reply": t_reply,
        "controller_rss": rss_kib(),
        "worker_rss": rss_kib(pid),
    }
    t_stop = time.monotonic()
    ray.shutdown()
    doc["stop_s"] = time.monotonic() - t_stop
    print(json.dumps(doc), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["cold"]:
        cold()
        sys.exit(0)
    sys.exit(
        script_main(None, "core_bench's workloads with Ray actors", RaySide, ["ray"]),
    )
