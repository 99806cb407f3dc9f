"""The Monarch side of ``core_bench.py``, written against upstream's public API only.

``core_bench.py`` imports ``MonarchSide`` from here to measure this repository's monarch.
Run as a script in another interpreter, the very same code measures upstream
torchmonarch (``benchmarks/.venvs/upstream``, made by ``baselines.py``)::

    .venvs/upstream/bin/python _actor_workloads.py --json OUT --sizes '{...}'

Nothing here goes past ``monarch.actor``'s ``Actor``, ``endpoint`` and ``this_host``, and
what they return: ``spawn_procs``, ``spawn``, ``slice``, ``call_one``, ``call``,
``broadcast``, ``get(timeout)``, ``await``, ``ValueMesh.values()`` and ``stop()``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workloads import (
    HERE,
    MESH_SIZE,
    MIB,
    CpuMeter,
    check_echo,
    cold_figures,
    latency,
    pids_pss,
    pids_rss,
    run_cold,
    script_main,
)

from monarch.actor import Actor, endpoint, this_host


class Echo(Actor):
    """Sync endpoints (they run on the actor's own thread)."""

    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def ping(self) -> None:
        return None

    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    def sink(self, x: Any) -> None:
        return None

    @endpoint
    def tick(self) -> None:
        self.count += 1

    @endpoint
    def ticks(self) -> int:
        return self.count

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class AsyncEcho(Actor):
    """An ``async def`` endpoint (runs on the proc's event loop)."""

    @endpoint
    async def ping(self) -> None:
        return None


class MonarchSide:
    """This process as a Monarch controller: a mesh of 4 procs, an Echo actor on each."""

    name = "monarch"

    def __init__(self, timeout: float, runner: asyncio.Runner | None = None) -> None:
        self.timeout = timeout
        self.own_runner = runner is None
        self.runner = asyncio.Runner() if runner is None else runner
        self.procs = this_host().spawn_procs(per_host={"gpus": MESH_SIZE})
        self.actors = self.procs.spawn("echo", Echo)
        self.async_actors = self.procs.spawn("async_echo", AsyncEcho)
        self.one = self.actors.slice(gpus=0)
        self.async_one = self.async_actors.slice(gpus=0)
        self._tensor: Any = None
        self.pids: list[int] = list(self.actors.pid.call().get(timeout).values())

    def roundtrip(self, n: int) -> dict[str, float]:
        cpu = CpuMeter(self.pids[:1])
        figures = latency("roundtrip_sync", self._sequential(self.one.ping, n))
        return {**figures, **cpu.per_call("roundtrip_sync", n)}

    def roundtrip_async_endpoint(self, n: int) -> dict[str, float]:
        return latency("roundtrip_async_endpoint", self._sequential(self.async_one.ping, n))

    def _sequential(self, ping: Any, n: int) -> list[float]:
        timeout, clock = self.timeout, time.perf_counter
        samples = []
        for _ in range(n):
            t0 = clock()
            ping.call_one().get(timeout)
            samples.append(clock() - t0)
        return samples

    def roundtrip_await(self, n: int) -> dict[str, float]:
        async def run() -> list[float]:
            ping, clock = self.one.ping, time.perf_counter
            samples = []
            for _ in range(n):
                t0 = clock()
                await ping.call_one()
                samples.append(clock() - t0)
            return samples

        return latency("roundtrip_await", self.runner.run(asyncio.wait_for(run(), self.timeout)))

    def pipelined(self, n: int) -> dict[str, float]:
        ping, timeout = self.one.ping, self.timeout
        t0 = time.perf_counter()
        futures = [ping.call_one() for _ in range(n)]
        for future in futures:
            future.get(timeout)
        return {"pipelined_calls_per_s": n / (time.perf_counter() - t0)}

    def fire_and_forget(self, n: int) -> dict[str, float]:
        one = self.one
        before = one.ticks.call_one().get(self.timeout)
        tick = one.tick
        t0 = time.perf_counter()
        for _ in range(n):
            tick.broadcast()
        after = one.ticks.call_one().get(self.timeout)
        elapsed = time.perf_counter() - t0
        if after - before != n:
            raise AssertionError(f"the reply saw {after - before} of {n} broadcasts")
        return {"fire_and_forget_msgs_per_s": n / elapsed}

    def mesh_gather(self, n: int) -> dict[str, float]:
        ping, timeout, clock = self.actors.ping, self.timeout, time.perf_counter
        samples = []
        cpu = CpuMeter(self.pids)
        for _ in range(n):
            t0 = clock()
            values = ping.call().get(timeout)
            samples.append(clock() - t0)
        if len(values.values()) != MESH_SIZE:
            raise AssertionError(f"gathered {len(values.values())} values")
        return {**latency("mesh4_gather", samples), **cpu.per_call("mesh4_gather", n)}

    def payload(self, mib: int, data: bytes, count: int) -> dict[str, float]:
        return self._oneway_and_echo(
            "payload", mib, data, count, lambda back: check_echo(back, len(data))
        )

    def _oneway_and_echo(
        self, prefix: str, mib: int, data: Any, count: int, check: Any
    ) -> dict[str, float]:
        """``count`` calls of ``data`` to a sink, then ``count`` echoed back (each ``check``ed)."""
        one, timeout, clock = self.one, self.timeout, time.perf_counter
        t0 = clock()
        for _ in range(count):
            if one.sink.call_one(data).get(timeout) is not None:
                raise AssertionError("sink returned a value")
        oneway = clock() - t0
        t0 = clock()
        for _ in range(count):
            check(one.echo.call_one(data).get(timeout))
        echo = clock() - t0
        return {
            f"{prefix}_{mib}MiB_oneway_MiBps": mib * count / oneway,
            f"{prefix}_{mib}MiB_echo_MiBps": 2 * mib * count / echo,
        }

    def tensor_payload(self, mib: int, count: int) -> dict[str, float]:
        """``payload`` with a float32 torch tensor of ``mib`` MiB as the argument."""
        import torch

        if self._tensor is None or self._tensor.numel() * 4 != mib * MIB:
            self._tensor = torch.arange(mib * MIB // 4, dtype=torch.float32)
        data = self._tensor

        def check(back: Any) -> None:
            if back.shape != data.shape or back[-1].item() != data[-1].item():
                raise AssertionError("echo returned a different tensor")

        return self._oneway_and_echo("tensor", mib, data, count, check)

    def cold_start(self, timeout: float) -> dict[str, float]:
        return cold_figures(run_cold([str(HERE / "_core_cold_start.py")], timeout))

    def worker_rss(self) -> list[float]:
        return pids_rss(self.pids)

    def worker_pss(self) -> list[float]:
        return pids_pss(self.pids)

    def stop(self) -> None:
        try:
            self.procs.stop().get(self.timeout)
        finally:
            if self.own_runner:
                self.runner.close()


if __name__ == "__main__":
    sys.exit(
        script_main(
            None,
            "core_bench's Monarch workloads, in this interpreter's monarch",
            MonarchSide,
            ["torchmonarch", "torch", "monarch-core"],
        )
    )
