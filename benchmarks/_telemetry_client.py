"""One measurement of telemetry_bench.py: round trips and pipelined calls to a proc, in a
process of its own (telemetry state is per process). ``python _telemetry_client.py MODE N``:
``off`` (monarch.telemetry not used, or not installed at all), ``on`` (used: spans and
metrics through whatever providers the environment sets up), ``tables`` (the job's
telemetry tables too: ``enable_telemetry()`` with its default configuration). Prints one
JSON line: the median round trip, the pipelined calls/s, and the CPU time each pipelined
call cost the client and the proc (process CPU over the burst / calls: on a shared machine
steadier than the wall-clock figures, which other processes' load moves)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from monarch.actor import Actor, endpoint, this_host


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x

    @endpoint
    def cpu(self) -> float:
        """The proc's CPU seconds so far (all its threads)."""
        return time.process_time()


def measure(echo: Any, round_trips: int, calls: int) -> dict[str, float]:
    """The median of ``round_trips`` round trips to ``echo`` (an ``Echo`` mesh of one), then
    ``calls`` pipelined calls: their rate and the CPU each cost the client and the proc."""
    for i in range(200):  # warm up
        echo.echo.call_one(i).get()
    rts = []
    for i in range(round_trips):
        t0 = time.perf_counter()
        echo.echo.call_one(i).get()
        rts.append(time.perf_counter() - t0)
    proc_cpu0 = echo.cpu.call_one().get()
    cpu0, t0 = time.process_time(), time.perf_counter()
    futures = [echo.echo.call_one(i) for i in range(calls)]
    for future in futures:
        future.get()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    proc_cpu = echo.cpu.call_one().get() - proc_cpu0
    return {
        "rt_us": statistics.median(rts) * 1e6,
        "pipelined_per_s": calls / elapsed,
        "client_cpu_us": cpu / calls * 1e6,
        "proc_cpu_us": proc_cpu / calls * 1e6,
    }


def main(mode: str, count: int) -> None:
    if mode == "on":
        import monarch.telemetry

        monarch.telemetry.install()  # this process, and the procs it spawns
    elif mode == "tables":
        from monarch.telemetry import enable_telemetry

        enable_telemetry()  # rows of every message, its spans; snapshots every 30 s

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    figures = measure(procs.spawn("echo", Echo), count, count)
    procs.stop().get()
    print(json.dumps(figures))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
