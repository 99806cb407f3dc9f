"""One measurement of telemetry_bench.py: round trips and pipelined calls to a proc, in a
process of its own (telemetry state is per process). ``python _telemetry_client.py MODE N``:
``off`` (monarch.telemetry not used, or not installed at all), ``on`` (used: spans and
metrics through whatever providers the environment sets up), ``tables`` (the job's
telemetry tables too: ``enable_telemetry()`` with its default configuration). Prints one
JSON line."""

from __future__ import annotations

import json
import statistics
import sys
import time

from monarch.actor import Actor, endpoint, this_host


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


def main(mode: str, count: int) -> None:
    if mode == "on":
        import monarch.telemetry

        monarch.telemetry.install()  # this process, and the procs it spawns
    elif mode == "tables":
        from monarch.telemetry import enable_telemetry

        enable_telemetry()  # rows of every message, its spans; snapshots every 30 s

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    echo = procs.spawn("echo", Echo)
    for i in range(200):  # warm up
        echo.echo.call_one(i).get()
    rts = []
    for i in range(count):
        t0 = time.perf_counter()
        echo.echo.call_one(i).get()
        rts.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    futures = [echo.echo.call_one(i) for i in range(count)]
    for future in futures:
        future.get()
    pipelined = count / (time.perf_counter() - t0)
    procs.stop().get()
    print(json.dumps({"rt_us": statistics.median(rts) * 1e6, "pipelined_per_s": pipelined}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
