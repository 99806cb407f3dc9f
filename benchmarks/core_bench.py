"""Monarch core (actors, endpoints, meshes) against a raw pickle-over-Unix-socket baseline.

Run with ``hatch run bench:core [--quick] [--out PATH]`` (or plain ``python
benchmarks/core_bench.py`` with monarch-core and monarch-transport importable). This
process is the controller, as a user's script would be: it spawns a mesh of 4 procs
with an ``Echo`` actor on each (sync endpoints, as in upstream's examples) and times
its calls. In the same run and in the same way it times the raw baseline
(``_raw_peer.py``: 4 plain Python server processes, pickle over a Unix socket). The
repetitions of the two are interleaved, so a drift in machine load hits both alike.

Workloads (figures are medians over the repetitions; the JSON keeps every repetition):

* no-op round trip: ``one.ping.call_one().get()``, one call at a time, each call timed
  (median and p99 of each repetition); the same awaited from an asyncio task
  (``await one.ping.call_one()``), and, for reference, to an ``async def`` endpoint.
* pipelined calls: N ``call_one()`` futures, then ``get()`` on each. Calls per second.
* fire-and-forget: N ``broadcast()`` to one actor, then one ``call_one().get()`` whose
  reply (the actor's count of messages) proves all of them were processed, in order.
* mesh of 4 and gather: ``actors.ping.call().get()`` (a ValueMesh of 4), latency.
* payloads of 1, 16 and 128 MiB (``bytes``): one-way (the endpoint returns None) and echo
  (the endpoint returns its argument). MiB/s; for echo both directions are counted.
* cold start: a fresh Python process (``_core_cold_start.py``) imports monarch.actor,
  spawns 1 proc with 1 actor and gets the first reply; timed from process start and
  from the spawn call. Raw: a fresh Python process starts a server process and gets
  its first reply.
* RSS (VmRSS from /proc): the workers after a few calls, and the cold-start script's
  controller; raw: the server processes and the raw cold-start client.

Also an in-process memcpy of 128 MiB. The ``targets`` section compares the headline
figures with upstream Monarch 0.7.0 as measured on the reference machine (DESIGN.md,
"Performance targets"); nothing here asserts on speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _raw_peer import AsyncRawClient, RawClient, rss_kib, start_server
from _results import (
    RESULTS_DIR,
    fmt_num,
    machine_info,
    markdown_table,
    package_versions,
    percentile,
    ratio_entry,
    summarize,
    write_json,
)

from monarch.actor import Actor, endpoint, this_host

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024
PAYLOAD_MIB = (1, 16, 128)
MESH_SIZE = 4
MEMCPY_SIZE = 128 * MIB

# Upstream Monarch 0.7.0 on the reference machine (DESIGN.md, "Performance targets").
UPSTREAM: dict[str, float] = {
    "roundtrip_sync_median_us": 714.0,
    "roundtrip_await_median_us": 714.0,
    "pipelined_calls_per_s": 4300.0,
    "fire_and_forget_msgs_per_s": 10900.0,
    "mesh4_gather_median_us": 1700.0,
    "payload_128MiB_oneway_MiBps": 654.0,
    "cold_start_process_s": 0.37,
    "worker_rss_MiB": 111.0,
}
# figure -> target ratio to upstream (see UPSTREAM); whether higher is better comes from FIGURES
TARGETS: dict[str, float] = {
    "roundtrip_sync_median_us": 0.2,
    "roundtrip_await_median_us": 0.2,
    "pipelined_calls_per_s": 10.0,
    "fire_and_forget_msgs_per_s": 10.0,
    "mesh4_gather_median_us": 0.25,
    "payload_128MiB_oneway_MiBps": 4.0,
    "cold_start_process_s": 1.0,
    "worker_rss_MiB": 0.4,
}
MEMCPY_TARGET = 0.5
"""128 MiB one-way >= this fraction of the memcpy bandwidth measured in the same run."""


@dataclass(frozen=True)
class Figure:
    unit: str
    higher_is_better: bool
    label: str


def _figures() -> dict[str, Figure]:
    figs: dict[str, Figure] = {}

    def latency(name: str, label: str) -> None:
        figs[f"{name}_median_us"] = Figure("us", False, f"{label}, median")
        figs[f"{name}_p99_us"] = Figure("us", False, f"{label}, p99")

    latency("roundtrip_sync", "no-op round trip, sync .get()")
    latency("roundtrip_await", "no-op round trip, await from asyncio")
    latency("roundtrip_async_endpoint", "no-op round trip to an async endpoint, .get()")
    figs["pipelined_calls_per_s"] = Figure("calls/s", True, "pipelined calls")
    figs["fire_and_forget_msgs_per_s"] = Figure("msg/s", True, "fire-and-forget + 1 call")
    latency("mesh4_gather", "call to a mesh of 4 + gather")
    for mib in PAYLOAD_MIB:
        figs[f"payload_{mib}MiB_oneway_MiBps"] = Figure("MiB/s", True, f"{mib} MiB one-way")
        figs[f"payload_{mib}MiB_echo_MiBps"] = Figure("MiB/s", True, f"{mib} MiB echo (both ways)")
    figs["cold_start_process_s"] = Figure("s", False, "cold start: process start to reply")
    figs["cold_start_spawn_s"] = Figure("s", False, "cold start: spawn call to reply")
    figs["cold_start_import_s"] = Figure("s", False, "cold start: import monarch.actor")
    figs["cold_start_stop_s"] = Figure("s", False, "cold start: procs.stop().get()")
    figs["worker_rss_MiB"] = Figure("MiB", False, "worker RSS after a few calls")
    figs["controller_rss_MiB"] = Figure("MiB", False, "controller RSS (cold-start script)")
    figs["cold_start_worker_rss_MiB"] = Figure(
        "MiB", False, "worker RSS (cold-start script, after a few calls)"
    )
    figs["worker_rss_end_MiB"] = Figure(
        "MiB", False, "worker 0 RSS at the end (after the payloads)"
    )
    figs["bench_controller_rss_MiB"] = Figure(
        "MiB", False, "this benchmark's process RSS (before payloads)"
    )
    return figs


FIGURES = _figures()


@dataclass(frozen=True)
class Sizes:
    roundtrips: int
    """Sequential calls per repetition, for each round-trip figure."""
    pipelined: int
    fire_and_forget: int
    mesh_calls: int
    payload_calls: tuple[int, ...]
    """Calls per repetition for each size of PAYLOAD_MIB."""
    reps: int
    warmup: int


DEFAULT = Sizes(
    roundtrips=1000,
    pipelined=10_000,
    fire_and_forget=10_000,
    mesh_calls=300,
    payload_calls=(16, 4, 1),
    reps=7,
    warmup=1,
)
QUICK = Sizes(
    roundtrips=300,
    pipelined=5000,
    fire_and_forget=5000,
    mesh_calls=100,
    payload_calls=(4, 2, 1),
    reps=3,
    warmup=0,
)

WORKLOADS = (
    "roundtrip",
    "roundtrip_await",
    "roundtrip_async_endpoint",
    "pipelined",
    "fire_and_forget",
    "mesh_gather",
    "payload",
    "cold_start",
)


# -- the actors ---------------------------------------------------------------------------


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


# -- helpers ------------------------------------------------------------------------------


def _latency(prefix: str, samples: list[float]) -> dict[str, float]:
    return {
        f"{prefix}_median_us": percentile(samples, 50) * 1e6,
        f"{prefix}_p99_us": percentile(samples, 99) * 1e6,
    }


def _payload(mib: int) -> bytes:
    data = bytearray(mib * MIB)  # zero-filled, so every page is touched before timing
    data[0], data[-1] = 1, 2
    return bytes(data)


def _check_echo(value: Any, size: int) -> None:
    if not isinstance(value, bytes | bytearray) or len(value) != size:
        raise AssertionError(f"echo returned {type(value).__name__} of {len(value)} bytes")
    if value[0] != 1 or value[-1] != 2:
        raise AssertionError("echo returned corrupted bytes")


def _mib(kib: dict[str, int]) -> float | None:
    return kib["VmRSS"] / 1024 if "VmRSS" in kib else None


_PYCACHE: list[str] = []
"""A bytecode cache for the cold-start processes, when this environment writes none."""


def _cold_env() -> dict[str, str]:
    # a fresh job: not the secret this process's runtime put in its environment
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_JOB_SECRET"}
    if _PYCACHE:
        # Installed packages come with compiled bytecode; PYTHONDONTWRITEBYTECODE would
        # make every cold start compile monarch's sources again. Cache it aside instead.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = _PYCACHE[0]
    return env


def _run_cold(args: list[str], timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        timeout=timeout,
        env=_cold_env(),
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"cold start exited with code {proc.returncode}: {' | '.join(tail)}")
    doc: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    doc["t_parent"] = started
    return doc


def _cold_figures(doc: dict[str, Any]) -> dict[str, float]:
    out = {
        "cold_start_process_s": doc["t_reply"] - doc["t_parent"],
        "cold_start_spawn_s": doc["t_reply"] - doc["t_spawn"],
    }
    if "t_imported" in doc:
        out["cold_start_import_s"] = doc["t_imported"] - doc["t_main"]
    if "stop_s" in doc:
        out["cold_start_stop_s"] = doc["stop_s"]
    for key, name in (
        ("controller_rss", "controller_rss_MiB"),
        ("worker_rss", "cold_start_worker_rss_MiB"),
    ):
        value = _mib(doc.get(key, {}))
        if value is not None:
            out[name] = value
    return out


# -- monarch ---------------------------------------------------------------------------


class MonarchSide:
    """This process as a Monarch controller: a mesh of 4 procs, an Echo actor on each."""

    name = "monarch"

    def __init__(self, timeout: float, runner: asyncio.Runner) -> None:
        self.timeout = timeout
        self.runner = runner
        self.procs = this_host().spawn_procs(per_host={"gpus": MESH_SIZE})
        self.actors = self.procs.spawn("echo", Echo)
        self.async_actors = self.procs.spawn("async_echo", AsyncEcho)
        self.one = self.actors.slice(gpus=0)
        self.async_one = self.async_actors.slice(gpus=0)
        self.pids: list[int] = list(self.actors.pid.call().get(timeout).values())

    def roundtrip(self, n: int) -> dict[str, float]:
        return _latency("roundtrip_sync", self._sequential(self.one.ping, n))

    def roundtrip_async_endpoint(self, n: int) -> dict[str, float]:
        return _latency("roundtrip_async_endpoint", self._sequential(self.async_one.ping, n))

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

        return _latency("roundtrip_await", self.runner.run(asyncio.wait_for(run(), self.timeout)))

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
        for _ in range(n):
            t0 = clock()
            values = ping.call().get(timeout)
            samples.append(clock() - t0)
        if len(values.values()) != MESH_SIZE:
            raise AssertionError(f"gathered {len(values.values())} values")
        return _latency("mesh4_gather", samples)

    def payload(self, mib: int, data: bytes, count: int) -> dict[str, float]:
        one, timeout, clock = self.one, self.timeout, time.perf_counter
        t0 = clock()
        for _ in range(count):
            if one.sink.call_one(data).get(timeout) is not None:
                raise AssertionError("sink returned a value")
        oneway = clock() - t0
        t0 = clock()
        for _ in range(count):
            _check_echo(one.echo.call_one(data).get(timeout), len(data))
        echo = clock() - t0
        return {
            f"payload_{mib}MiB_oneway_MiBps": mib * count / oneway,
            f"payload_{mib}MiB_echo_MiBps": 2 * mib * count / echo,
        }

    def cold_start(self, timeout: float) -> dict[str, float]:
        return _cold_figures(_run_cold([str(HERE / "_core_cold_start.py")], timeout))

    def worker_rss(self) -> list[float]:
        return [v for v in (_mib(rss_kib(pid)) for pid in self.pids) if v is not None]

    def stop(self) -> None:
        self.procs.stop().get(self.timeout)


# -- raw baseline ---------------------------------------------------------------------


class RawSide:
    """The raw baseline: 4 server processes, blocking and asyncio clients in this one."""

    name = "raw"

    def __init__(self, timeout: float, runner: asyncio.Runner) -> None:
        self.timeout = timeout
        self.runner = runner
        self.servers: list[subprocess.Popen[bytes]] = []
        self.clients: list[RawClient] = []
        names = [f"core-bench-raw-{os.getpid()}-{i}" for i in range(MESH_SIZE)]
        for name in names:
            self.servers.append(start_server(name, timeout))
        self.clients = [RawClient(name, timeout) for name in names]
        self.one = self.clients[0]
        self.aclient = runner.run(AsyncRawClient.connect(names[0]))
        self.pids: list[int] = [client.call("pid") for client in self.clients]

    def roundtrip(self, n: int) -> dict[str, float]:
        call, clock = self.one.call, time.perf_counter
        samples = []
        for _ in range(n):
            t0 = clock()
            call("ping")
            samples.append(clock() - t0)
        return _latency("roundtrip_sync", samples)

    def roundtrip_async_endpoint(self, n: int) -> dict[str, float]:
        return {}  # no such thing

    def roundtrip_await(self, n: int) -> dict[str, float]:
        async def run() -> list[float]:
            call, clock = self.aclient.call, time.perf_counter
            samples = []
            for _ in range(n):
                t0 = clock()
                await call("ping")
                samples.append(clock() - t0)
            return samples

        return _latency("roundtrip_await", self.runner.run(asyncio.wait_for(run(), self.timeout)))

    def pipelined(self, n: int) -> dict[str, float]:
        client = self.aclient

        async def run() -> float:
            async def collect() -> None:
                for _ in range(n):
                    await client.read()

            t0 = time.perf_counter()
            replies = asyncio.create_task(collect())
            for i in range(n):
                client.write("ping", (), True)
                if i % 256 == 255:
                    await client.writer.drain()
            await client.writer.drain()
            await replies
            return time.perf_counter() - t0

        elapsed = self.runner.run(asyncio.wait_for(run(), self.timeout))
        return {"pipelined_calls_per_s": n / elapsed}

    def fire_and_forget(self, n: int) -> dict[str, float]:
        client = self.aclient

        async def run() -> float:
            before = await client.call("ticks")
            t0 = time.perf_counter()
            for i in range(n):
                client.write("tick", (), False)
                if i % 256 == 255:
                    await client.writer.drain()
            after = await client.call("ticks")
            elapsed = time.perf_counter() - t0
            if after - before != n:
                raise AssertionError(f"the reply saw {after - before} of {n} messages")
            return elapsed

        elapsed = self.runner.run(asyncio.wait_for(run(), self.timeout))
        return {"fire_and_forget_msgs_per_s": n / elapsed}

    def mesh_gather(self, n: int) -> dict[str, float]:
        clients, clock = self.clients, time.perf_counter
        samples = []
        for _ in range(n):
            t0 = clock()
            for client in clients:
                client.request("ping")
            values = [client.recv() for client in clients]
            samples.append(clock() - t0)
        if len(values) != MESH_SIZE:
            raise AssertionError(f"gathered {len(values)} values")
        return _latency("mesh4_gather", samples)

    def payload(self, mib: int, data: bytes, count: int) -> dict[str, float]:
        call, clock = self.one.call, time.perf_counter
        t0 = clock()
        for _ in range(count):
            if call("sink", data) is not None:
                raise AssertionError("sink returned a value")
        oneway = clock() - t0
        t0 = clock()
        for _ in range(count):
            _check_echo(call("echo", data), len(data))
        echo = clock() - t0
        return {
            f"payload_{mib}MiB_oneway_MiBps": mib * count / oneway,
            f"payload_{mib}MiB_echo_MiBps": 2 * mib * count / echo,
        }

    def cold_start(self, timeout: float) -> dict[str, float]:
        return _cold_figures(_run_cold([str(HERE / "_raw_peer.py"), "cold"], timeout))

    def worker_rss(self) -> list[float]:
        return [v for v in (_mib(rss_kib(pid)) for pid in self.pids) if v is not None]

    def stop(self) -> None:
        try:
            self.runner.run(self.aclient.aclose())
        except Exception:  # noqa: BLE001 - best effort at the end of the run
            pass
        for client in self.clients:
            client.close()
        for server in self.servers:
            server.kill()
            server.wait()


Side = MonarchSide | RawSide


# -- orchestration ----------------------------------------------------------------------


def memcpy_bandwidth(reps: int) -> dict[str, Any]:
    src = bytearray(os.urandom(1024)) * (MEMCPY_SIZE // 1024)
    dst = bytearray(MEMCPY_SIZE)
    figures = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        dst[:] = src
        figures.append(MEMCPY_SIZE / MIB / (time.perf_counter() - t0))
    return {"unit": "MiB/s", "size": MEMCPY_SIZE, **summarize(figures[1:])}


class Recorder:
    """Every figure's repetitions, per implementation."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], list[float]] = {}
        self.errors: dict[tuple[str, str], list[str]] = {}

    def add(self, impl: str, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            self.values.setdefault((impl, name), []).append(float(value))

    def error(self, impl: str, workload: str, text: str) -> None:
        self.errors.setdefault((impl, workload), []).append(text)

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for (impl, name), values in self.values.items():
            fig = FIGURES[name]
            out.append(
                {
                    "name": name,
                    "impl": impl,
                    "unit": fig.unit,
                    "higher_is_better": fig.higher_is_better,
                    "label": fig.label,
                    **summarize(values),
                }
            )
        order = list(FIGURES)
        out.sort(key=lambda e: (order.index(e["name"]), e["impl"] != "monarch"))
        return out


def _progress(started: float, text: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)


def _run_workload(
    side: Side, workload: str, sizes: Sizes, payloads: dict[int, bytes], timeout: float
) -> dict[str, float]:
    if workload == "roundtrip":
        return side.roundtrip(sizes.roundtrips)
    if workload == "roundtrip_await":
        return side.roundtrip_await(sizes.roundtrips)
    if workload == "roundtrip_async_endpoint":
        return side.roundtrip_async_endpoint(sizes.roundtrips)
    if workload == "pipelined":
        return side.pipelined(sizes.pipelined)
    if workload == "fire_and_forget":
        return side.fire_and_forget(sizes.fire_and_forget)
    if workload == "mesh_gather":
        return side.mesh_gather(sizes.mesh_calls)
    if workload == "payload":
        out: dict[str, float] = {}
        for mib, count in zip(PAYLOAD_MIB, sizes.payload_calls, strict=True):
            out.update(side.payload(mib, payloads[mib], count))
        return out
    if workload == "cold_start":
        return side.cold_start(timeout)
    raise ValueError(workload)


def _prime(side: Side, workload: str, payloads: dict[int, bytes], timeout: float) -> None:
    """Imports, connections, allocator pools, bytecode: what a first call pays for."""
    small = Sizes(
        roundtrips=50,
        pipelined=500,
        fire_and_forget=500,
        mesh_calls=20,
        payload_calls=(1, 1, 1),
        reps=1,
        warmup=0,
    )
    _run_workload(side, workload, small, payloads, timeout)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~30 s smoke run (fewer, smaller reps)")
    p.add_argument("--reps", type=int, help="timed repetitions per figure (after the warm-up)")
    p.add_argument("--warmup", type=int, help="untimed repetitions before the timed ones")
    p.add_argument("--out", default=str(RESULTS_DIR / "core.json"), help="JSON output path")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    p.add_argument("--impls", default="monarch,raw", help="monarch and/or raw (the baseline)")
    p.add_argument("--roundtrips", type=int, help="sequential calls per round-trip repetition")
    p.add_argument("--count", type=int, help="calls/messages per pipelined and fire-and-forget rep")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per call")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else DEFAULT
    if args.reps:
        sizes = replace(sizes, reps=args.reps)
    if args.warmup is not None:
        sizes = replace(sizes, warmup=args.warmup)
    if args.roundtrips:
        sizes = replace(sizes, roundtrips=args.roundtrips)
    if args.count:
        sizes = replace(sizes, pipelined=args.count, fire_and_forget=args.count)
    workloads = [w for w in args.workloads.split(",") if w]
    impls = [i for i in args.impls.split(",") if i]
    for given, known in ((workloads, WORKLOADS), (impls, ("monarch", "raw"))):
        unknown = sorted(set(given) - set(known))
        if unknown:
            sys.exit(f"unknown {', '.join(unknown)}; choose from {', '.join(known)}")

    started = time.perf_counter()
    recorder = Recorder()
    notes: list[str] = []
    payloads: dict[int, bytes] = {}
    if "cold_start" in workloads and sys.flags.dont_write_bytecode:
        _PYCACHE.append(tempfile.mkdtemp(prefix="core-bench-pycache-"))
        notes.append(
            "PYTHONDONTWRITEBYTECODE is set: cold starts used a bytecode cache in a "
            "temporary PYTHONPYCACHEPREFIX (filled by an untimed first cold start)"
        )
    runner = asyncio.Runner()
    sides: list[Side] = []
    failures: dict[str, str] = {}
    skip: set[tuple[str, str]] = set()  # (impl, workload) that failed when primed
    try:
        kinds: list[type[MonarchSide] | type[RawSide]] = [MonarchSide, RawSide]
        for make in kinds:
            if make.name not in impls:
                continue
            try:
                sides.append(make(args.timeout, runner))
            except Exception as exc:  # noqa: BLE001 - recorded, the other side still runs
                failures[make.name] = f"setup failed: {exc!r}"
        _progress(started, f"started: {', '.join(s.name for s in sides)}")

        def prime(selected: list[str]) -> None:
            for side in sides:
                for workload in selected:
                    try:
                        _prime(side, workload, payloads, args.timeout)
                    except Exception as exc:  # noqa: BLE001 - recorded, skipped from now on
                        failures[f"{side.name}/{workload}"] = f"priming failed: {exc!r}"
                        skip.add((side.name, workload))

        # RSS after a few small calls: before any payload reaches the workers (or this process)
        prime([w for w in workloads if w != "payload"])
        bench_rss = _mib(rss_kib())
        if bench_rss is not None:
            recorder.add("monarch", {"bench_controller_rss_MiB": bench_rss})
        for side in sides:
            for value in side.worker_rss():
                recorder.add(side.name, {"worker_rss_MiB": value})
        if "payload" in workloads:
            payloads.update((mib, _payload(mib)) for mib in PAYLOAD_MIB)
            prime(["payload"])
        memcpy = memcpy_bandwidth(max(sizes.reps, 5))
        _progress(started, "primed")

        total = sizes.warmup + sizes.reps
        for rep in range(total):
            warm = " (warm-up)" if rep < sizes.warmup else ""
            _progress(started, f"repetition {rep + 1}/{total}{warm}")
            for workload in workloads:
                shift = rep % max(1, len(sides))  # alternate which side goes first
                for side in sides[shift:] + sides[:shift]:
                    if (side.name, workload) in skip:
                        continue
                    try:
                        figures = _run_workload(side, workload, sizes, payloads, args.timeout)
                    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                        recorder.error(side.name, workload, f"{type(exc).__name__}: {exc}")
                        continue
                    if rep >= sizes.warmup:
                        recorder.add(side.name, figures)
        for side in sides:
            end = side.worker_rss()[:1]  # worker 0: the one that served the payloads
            if end:
                recorder.add(side.name, {"worker_rss_end_MiB": end[0]})
    finally:
        for side in sides:
            try:
                side.stop()
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                notes.append(f"{side.name}: stop failed: {exc!r}")
        runner.close()
        for cache in _PYCACHE:
            shutil.rmtree(cache, ignore_errors=True)

    entries = recorder.entries()
    medians: dict[tuple[str, str], float | None] = {
        (f["impl"], f["name"]): f["median"] for f in entries
    }
    targets = []
    for name, target in TARGETS.items():
        ours = medians.get(("monarch", name))
        targets.append(
            ratio_entry(
                name,
                target,
                ours,
                UPSTREAM[name],
                higher_is_better=FIGURES[name].higher_is_better,
                against="upstream 0.7.0",
                label=FIGURES[name].label,
                unit=FIGURES[name].unit,
            )
        )
    targets.append(
        ratio_entry(
            "payload_128MiB_oneway_MiBps",
            MEMCPY_TARGET,
            medians.get(("monarch", "payload_128MiB_oneway_MiBps")),
            memcpy["median"],
            against="memcpy 128 MiB (this run)",
            label="128 MiB one-way vs memcpy",
            unit="MiB/s",
        )
    )
    versus_raw = []
    for name, fig in FIGURES.items():
        ours, raw = medians.get(("monarch", name)), medians.get(("raw", name))
        if ours is not None and raw:
            versus_raw.append(
                {"name": name, "unit": fig.unit, "monarch": ours, "raw": raw, "ratio": ours / raw}
            )

    info = machine_info()
    info["load_average_end"] = info.pop("load_average", None)
    doc = {
        "benchmark": "core",
        "machine": info,
        "packages": package_versions(
            ["monarch-core", "monarch-transport", "cloudpickle", "msgspec", "anyio", "uvloop"]
        ),
        "settings": {
            **asdict(sizes),
            "payload_mib": list(PAYLOAD_MIB),
            "mesh_size": MESH_SIZE,
            "workloads": workloads,
            "impls": impls,
            "quick": args.quick,
        },
        "duration_s": round(time.perf_counter() - started, 1),
        "memcpy": memcpy,
        "upstream": {"version": "0.7.0", **UPSTREAM},
        "figures": entries,
        "errors": [
            {"impl": impl, "workload": workload, "errors": errors}
            for (impl, workload), errors in recorder.errors.items()
        ],
        "targets": targets,
        "versus_raw": versus_raw,
        "failures": failures,
        "notes": notes,
    }
    out_path = write_json(args.out, doc)
    print(render_markdown(doc))
    print(f"\nJSON written to {out_path}", file=sys.stderr)
    return 0


# -- output -----------------------------------------------------------------------------


def _cell(f: dict[str, Any] | None) -> str:
    if f is None or f["median"] is None:
        return "-"
    text = fmt_num(f["median"])
    if f["spread"] is not None and len(f["reps"]) > 1:
        text += f" ±{f['spread'] * 100:.0f}%"
    return text


def render_markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    s = doc["settings"]
    lines = [
        f"## Monarch core ({m.get('cpu_count')} CPUs, {m.get('cpu_model', '?')}, "
        f"Python {m.get('python')}, load {m.get('load_average_end')}, {doc['duration_s']} s)",
        "",
        f"Median of {s['reps']} repetitions (± half the min-max range, relative). "
        f"Round trips: {s['roundtrips']} sequential calls per repetition; pipelined "
        f"{s['pipelined']}, fire-and-forget {s['fire_and_forget']} per repetition; "
        f"payloads are bytes. Ratios < 1 are better for latencies, costs and RSS.",
        "",
    ]
    by_key = {(f["impl"], f["name"]): f for f in doc["figures"]}
    targets = {t["name"]: t for t in doc["targets"] if t["against"].startswith("upstream")}
    rows = []
    for name, fig in FIGURES.items():
        ours, raw = by_key.get(("monarch", name)), by_key.get(("raw", name))
        if ours is None and raw is None:
            continue
        vs_raw = (
            fmt_num(ours["median"] / raw["median"])
            if ours and raw and ours["median"] is not None and raw["median"]
            else "-"
        )
        t = targets.get(name)
        rows.append(
            [
                fig.label,
                fig.unit,
                _cell(ours),
                _cell(raw),
                vs_raw,
                fmt_num(t["baseline"]) if t else "-",
                f"{t['op']} {t['target']}x" if t else "",
                fmt_num(t["ratio"]) if t else "",
                {True: "pass", False: "FAIL", None: "-"}[t["pass"]] if t else "",
            ]
        )
    headers = [
        "figure",
        "unit",
        "monarch",
        "raw",
        "monarch/raw",
        "upstream 0.7.0",
        "target",
        "vs upstream",
        "result",
    ]
    lines.append(markdown_table(headers, rows))
    lines.append("")
    memcpy = doc["memcpy"]
    lines.append(f"memcpy (in-process bytearray copy, 128 MiB): {fmt_num(memcpy['median'])} MiB/s")
    for t in doc["targets"]:
        if t["against"].startswith("memcpy"):
            result = {True: "pass", False: "FAIL", None: "-"}[t["pass"]]
            lines.append(
                f"128 MiB one-way vs memcpy: {fmt_num(t['ratio'])} (target {t['op']} "
                f"{t['target']}): {result}"
            )
    passed = [t for t in doc["targets"] if t["pass"]]
    lines.append(f"targets met: {len(passed)} of {len(doc['targets'])}")
    problems = []
    for key, error in doc["failures"].items():
        problems.append(f"- {key}: {error}")
    for e in doc["errors"]:
        problems.append(
            f"- {e['impl']}/{e['workload']}: {len(e['errors'])} error(s), first: {e['errors'][0]}"
        )
    for note in doc["notes"]:
        problems.append(f"- note: {note}")
    if problems:
        lines += ["", *problems]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
