"""Monarch core (actors, endpoints, meshes) against a raw pickle-over-Unix-socket baseline.

Run with ``hatch run bench:core [--quick] [--out PATH]`` (or plain ``python
benchmarks/core_bench.py`` with monarch-core and monarch-transport importable). This
process is the controller, as a user's script would be: it spawns a mesh of 4 procs
with an ``Echo`` actor on each (sync endpoints, as in upstream's examples) and times
its calls. In the same run and in the same way it times the raw baseline
(``_raw_peer.py``: 4 plain Python server processes, pickle over a Unix socket). The
repetitions of the two are interleaved, so a drift in machine load hits both alike.

When the baseline venvs exist (``hatch run bench:baselines``, see ``baselines.py``), the
same run then measures upstream torchmonarch 0.7.0 (the very same workload code,
``_actor_workloads.py``, in the upstream interpreter) and Ray 2.60.0
(``_ray_workloads.py``), one after the other, each in a block of its own.

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

Also an in-process memcpy of 128 MiB, in each repetition just before the payloads.
The ``targets`` section compares the headline figures with upstream Monarch 0.7.0: as
measured in this run when the upstream venv exists, else as measured on the reference
machine (DESIGN.md, "Performance targets"); nothing here asserts on speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _actor_workloads import MonarchSide
from _raw_peer import AsyncRawClient, RawClient, start_server
from _results import (
    RESULTS_DIR,
    fmt_num,
    machine_info,
    markdown_table,
    memcpy_bandwidth,
    package_versions,
    ratio_entry,
    summarize,
    write_json,
)
from _workloads import (
    DEFAULT,
    HERE,
    MESH_SIZE,
    MIB,
    PAYLOAD_MIB,
    QUICK,
    TENSOR_MIB,
    WORKLOADS,
    Side,
    Sizes,
    check_echo,
    cold_figures,
    drop_pycache,
    latency,
    pids_pss,
    pids_rss,
    run_cold,
    run_sides,
    use_pycache_if_needed,
)
from baselines import default_python

MEMCPY_SIZE = 128 * MIB

# Upstream Monarch 0.7.0 on the reference machine (DESIGN.md, "Performance targets"): what
# the targets are checked against when no upstream venv was measured in this run.
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
# Ray 2.60 on the same reference machine (DESIGN.md): shown when no Ray venv was measured.
RAY_REFERENCE: dict[str, float] = {
    "roundtrip_sync_median_us": 853.0,
    "roundtrip_await_median_us": 853.0,
    "pipelined_calls_per_s": 4500.0,
    "fire_and_forget_msgs_per_s": 4100.0,
    "mesh4_gather_median_us": 3200.0,
    "payload_128MiB_oneway_MiBps": 1040.0,
    "cold_start_process_s": 4.4,
    "worker_rss_MiB": 115.0,
}
REFERENCES = {"upstream": UPSTREAM, "ray": RAY_REFERENCE}
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

IMPLS = ("monarch", "raw", "upstream", "ray")


@dataclass(frozen=True)
class Baseline:
    """Another implementation, measured in its own interpreter (see ``baselines.py``)."""

    impl: str
    script: str
    label: str


BASELINES = {
    "upstream": Baseline("upstream", "_actor_workloads.py", "upstream torchmonarch 0.7.0"),
    "ray": Baseline("ray", "_ray_workloads.py", "Ray 2.60.0"),
}


@dataclass(frozen=True)
class Figure:
    unit: str
    higher_is_better: bool
    label: str


def _figures() -> dict[str, Figure]:
    figs: dict[str, Figure] = {}

    def lat(name: str, label: str) -> None:
        figs[f"{name}_median_us"] = Figure("us", False, f"{label}, median")
        figs[f"{name}_p99_us"] = Figure("us", False, f"{label}, p99")

    lat("roundtrip_sync", "no-op round trip, sync .get()")
    figs["roundtrip_sync_client_cpu_us"] = Figure("us", False, "client CPU per round trip")
    figs["roundtrip_sync_cpu_us"] = Figure("us", False, "client + worker CPU per round trip")
    lat("roundtrip_await", "no-op round trip, await from asyncio")
    lat("roundtrip_async_endpoint", "no-op round trip to an async endpoint, .get()")
    figs["pipelined_calls_per_s"] = Figure("calls/s", True, "pipelined calls")
    figs["fire_and_forget_msgs_per_s"] = Figure("msg/s", True, "fire-and-forget + 1 call")
    lat("mesh4_gather", "call to a mesh of 4 + gather")
    figs["mesh4_gather_client_cpu_us"] = Figure("us", False, "client CPU per call to a mesh of 4")
    figs["mesh4_gather_cpu_us"] = Figure("us", False, "client + 4 workers' CPU per call to 4")
    for size in PAYLOAD_MIB:
        figs[f"payload_{size}MiB_oneway_MiBps"] = Figure("MiB/s", True, f"{size} MiB one-way")
        figs[f"payload_{size}MiB_echo_MiBps"] = Figure(
            "MiB/s", True, f"{size} MiB echo (both ways)"
        )
    figs[f"tensor_{TENSOR_MIB}MiB_oneway_MiBps"] = Figure(
        "MiB/s", True, f"{TENSOR_MIB} MiB float32 torch tensor one-way"
    )
    figs[f"tensor_{TENSOR_MIB}MiB_echo_MiBps"] = Figure(
        "MiB/s", True, f"{TENSOR_MIB} MiB float32 torch tensor echo (both ways)"
    )
    figs["cold_start_process_s"] = Figure("s", False, "cold start: process start to reply")
    figs["cold_start_spawn_s"] = Figure("s", False, "cold start: spawn call to reply")
    figs["cold_start_import_s"] = Figure("s", False, "cold start: import monarch.actor")
    figs["cold_start_stop_s"] = Figure("s", False, "cold start: procs.stop().get()")
    figs["worker_rss_MiB"] = Figure("MiB", False, "worker RSS after a few calls")
    figs["worker_pss_MiB"] = Figure(
        "MiB", False, "worker PSS after a few calls (shared pages by share)"
    )
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
        return latency("roundtrip_sync", samples)

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

        return latency("roundtrip_await", self.runner.run(asyncio.wait_for(run(), self.timeout)))

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
        return latency("mesh4_gather", samples)

    def payload(self, mib: int, data: bytes, count: int) -> dict[str, float]:
        call, clock = self.one.call, time.perf_counter
        t0 = clock()
        for _ in range(count):
            if call("sink", data) is not None:
                raise AssertionError("sink returned a value")
        oneway = clock() - t0
        t0 = clock()
        for _ in range(count):
            check_echo(call("echo", data), len(data))
        echo = clock() - t0
        return {
            f"payload_{mib}MiB_oneway_MiBps": mib * count / oneway,
            f"payload_{mib}MiB_echo_MiBps": 2 * mib * count / echo,
        }

    def cold_start(self, timeout: float) -> dict[str, float]:
        return cold_figures(run_cold([str(HERE / "_raw_peer.py"), "cold"], timeout))

    def worker_rss(self) -> list[float]:
        return pids_rss(self.pids)

    def worker_pss(self) -> list[float]:
        return pids_pss(self.pids)

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


# -- orchestration ----------------------------------------------------------------------


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
        impls = list(IMPLS)
        out.sort(key=lambda e: (order.index(e["name"]), impls.index(e["impl"])))
        return out


def _progress(started: float, text: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)


def _baseline_env(impl: str) -> dict[str, str]:
    """This environment, less what would point the other interpreter at our monarch."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MONARCH_JOB_SECRET", "MONARCH_ROOT_ADDRESS"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if impl == "ray":
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network here; don't try
    return env


def _kill_group(pgid: int) -> None:
    """Anything left in a baseline's process group (a raylet, a proc), once it is done."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_baseline(
    baseline: Baseline,
    python: Path,
    workloads: list[str],
    sizes: Sizes,
    call_timeout: float,
    timeout: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Run the workloads in another interpreter; its JSON document (see script_main)."""
    with tempfile.TemporaryDirectory(prefix=f"core-bench-{baseline.impl}-") as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [
            str(python),
            str(HERE / baseline.script),
            "--json",
            str(out),
            "--workloads",
            ",".join(workloads),
            "--sizes",
            json.dumps(asdict(sizes)),
            "--timeout",
            str(call_timeout),
        ]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_baseline_env(baseline.impl),
            cwd=tmp,
            start_new_session=True,
        )
        tail: collections.deque[str] = collections.deque(maxlen=20)

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                tail.append(line)
                if line.startswith("  ["):  # script_main's progress
                    progress(f"{baseline.impl}: {line.strip()}")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            raise RuntimeError(f"timed out after {timeout:.0f} s") from None
        finally:
            _kill_group(proc.pid)
            reader.join(5)
        if code != 0 or not out.exists():
            lines = " | ".join(line for line in tail if line.strip())[-1500:]
            raise RuntimeError(f"exited with code {code}: {lines}")
        doc: dict[str, Any] = json.loads(out.read_text())
        return doc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~30 s smoke run (fewer, smaller reps)")
    p.add_argument("--reps", type=int, help="timed repetitions per figure (after the warm-up)")
    p.add_argument("--warmup", type=int, help="untimed repetitions before the timed ones")
    p.add_argument("--out", default=str(RESULTS_DIR / "core.json"), help="JSON output path")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    p.add_argument(
        "--impls",
        default=",".join(IMPLS),
        help="any of monarch, raw (the baseline in this process), upstream, ray (when found)",
    )
    p.add_argument("--roundtrips", type=int, help="sequential calls per round-trip repetition")
    p.add_argument("--count", type=int, help="calls/messages per pipelined and fire-and-forget rep")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per call")
    for impl in BASELINES:
        p.add_argument(
            f"--{impl}-python",
            metavar="PATH",
            help=f"the {BASELINES[impl].label} interpreter (default: "
            f"benchmarks/.venvs/{impl}/bin/python, when it exists)",
        )
    p.add_argument("--no-baselines", action="store_true", help="measure neither upstream nor ray")
    p.add_argument(
        "--no-torch",
        action="store_true",
        help="leave torch unimported in this process (by default it is imported first, as a "
        "user's script has; upstream's imports it anyway)",
    )
    p.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="keep N other processes spinning on the CPU for the whole run (a busy machine)",
    )
    p.add_argument(
        "--baseline-timeout",
        type=float,
        default=1800.0,
        help="seconds allowed for each baseline's whole block",
    )
    return p.parse_args(argv)


def import_torch() -> bool:
    """Import torch as a user's script would have before using monarch (if installed)."""
    try:
        import torch  # noqa: F401 - the import is the point
    except ImportError:
        return False
    return True


def start_spinners(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes burning CPU until killed: the other work of a busy machine."""
    spin = [sys.executable, "-c", "while True: pass"]
    return [subprocess.Popen(spin, stdin=subprocess.DEVNULL) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch_imported = False if args.no_torch else import_torch()
    spinners = start_spinners(args.busy)
    try:
        return _main(args, torch_imported)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _main(args: argparse.Namespace, torch_imported: bool) -> int:
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
    for given, known in ((workloads, WORKLOADS), (impls, IMPLS)):
        unknown = sorted(set(given) - set(known))
        if unknown:
            sys.exit(f"unknown {', '.join(unknown)}; choose from {', '.join(known)}")

    started = time.perf_counter()
    recorder = Recorder()
    notes: list[str] = []
    failures: dict[str, str] = {}

    # which baselines, with which interpreter
    pythons: dict[str, Path] = {}
    for impl in BASELINES:
        if impl not in impls or args.no_baselines:
            continue
        given = getattr(args, f"{impl}_python")
        if given:
            python = Path(given)
            if not python.exists():
                sys.exit(f"--{impl}-python {given}: no such file")
            pythons[impl] = python
        else:
            found = default_python(impl)
            if found is None:
                notes.append(
                    f"{impl}: not measured, no benchmarks/.venvs/{impl} "
                    "(make it with `hatch run bench:baselines`)"
                )
            else:
                pythons[impl] = found

    note = use_pycache_if_needed(workloads)
    if note:
        notes.append(note)
    runner = asyncio.Runner()
    sides: list[Side] = []
    memcpy: dict[str, Any] = {}
    memcpy_reps: list[float] = []
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

        def measure_memcpy() -> None:
            """One figure per repetition, taken just before the payloads of that repetition."""
            memcpy_reps.append(memcpy_bandwidth(MEMCPY_SIZE, 3)["median"])

        run_sides(
            sides,
            workloads,
            sizes,
            args.timeout,
            recorder,
            failures,
            controller_impl="monarch" if any(s.name == "monarch" for s in sides) else None,
            progress=lambda text: _progress(started, text),
            beside_payload=measure_memcpy,
        )
    finally:
        for side in sides:
            try:
                side.stop()
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                notes.append(f"{side.name}: stop failed: {exc!r}")
        runner.close()
        drop_pycache()
    if not memcpy_reps:  # no payload workload: measured anyway, for the record
        for _ in range(max(sizes.reps, 5)):
            measure_memcpy()
    memcpy.update({"unit": "MiB/s", "size": MEMCPY_SIZE, **summarize(memcpy_reps)})

    # the baselines: each in a block of its own, with nothing of ours left running
    baselines: dict[str, dict[str, Any]] = {}
    for impl, python in pythons.items():
        baseline = BASELINES[impl]
        _progress(started, f"{impl}: {baseline.label} ({python})")
        info: dict[str, Any] = {"label": baseline.label, "python": str(python)}
        baselines[impl] = info
        t0 = time.perf_counter()
        try:
            doc = run_baseline(
                baseline,
                python,
                workloads,
                sizes,
                args.timeout,
                args.baseline_timeout,
                lambda text: _progress(started, text),
            )
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            failures[impl] = f"baseline failed: {exc}"
            info["error"] = str(exc)
            info["duration_s"] = round(time.perf_counter() - t0, 1)
            continue
        info["python_version"] = doc.get("python")
        info["packages"] = doc.get("packages")
        info["duration_s"] = doc.get("duration_s")
        for name, values in doc.get("values", {}).items():
            if name in FIGURES:
                for value in values:
                    recorder.add(impl, {name: value})
        for workload, texts in doc.get("errors", {}).items():
            for text in texts:
                recorder.error(impl, workload, text)
        for key, text in doc.get("failures", {}).items():
            failures[f"{impl}/{key}"] = text
        notes.extend(f"{impl}: {n}" for n in doc.get("notes", []) if "PYTHONDONTWRITE" not in n)

    entries = recorder.entries()
    medians: dict[tuple[str, str], float | None] = {
        (f["impl"], f["name"]): f["median"] for f in entries
    }
    targets = []
    for name, target in TARGETS.items():
        ours = medians.get(("monarch", name))
        measured = medians.get(("upstream", name))
        targets.append(
            ratio_entry(
                name,
                target,
                ours,
                measured if measured is not None else UPSTREAM[name],
                higher_is_better=FIGURES[name].higher_is_better,
                against="upstream 0.7.0 (this run)"
                if measured is not None
                else "upstream 0.7.0 (reference machine, DESIGN.md)",
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
    versus: dict[str, list[dict[str, Any]]] = {}
    for other in ("raw", "upstream", "ray"):
        rows = []
        for name, fig in FIGURES.items():
            ours, theirs = medians.get(("monarch", name)), medians.get((other, name))
            if ours is not None and theirs:
                rows.append(
                    {
                        "name": name,
                        "unit": fig.unit,
                        "monarch": ours,
                        other: theirs,
                        "ratio": ours / theirs,
                    }
                )
        versus[other] = rows

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
            "client_imported_torch": torch_imported,
            "busy_processes": args.busy,
        },
        "duration_s": round(time.perf_counter() - started, 1),
        "memcpy": memcpy,
        "upstream": {"version": "0.7.0", **UPSTREAM},
        "ray_reference": {"version": "2.60", **RAY_REFERENCE},
        "baselines": baselines,
        "figures": entries,
        "errors": [
            {"impl": impl, "workload": workload, "errors": errors}
            for (impl, workload), errors in recorder.errors.items()
        ],
        "targets": targets,
        "versus_raw": versus["raw"],
        "versus_upstream": versus["upstream"],
        "versus_ray": versus["ray"],
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


def _ratio(ours: dict[str, Any] | None, theirs: float | None) -> str:
    if ours is None or ours["median"] is None or not theirs:
        return "-"
    return fmt_num(ours["median"] / theirs)


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
        f"payloads are bytes. Ratios < 1 are better for latencies, costs and RSS. "
        f"Client imported torch: {'yes' if s.get('client_imported_torch') else 'no'}; "
        f"other processes spinning: {s.get('busy_processes', 0)}.",
        "",
    ]
    by_key = {(f["impl"], f["name"]): f for f in doc["figures"]}
    targets = {t["name"]: t for t in doc["targets"] if t["against"].startswith("upstream")}
    references = {"upstream": doc["upstream"], "ray": doc.get("ray_reference", {})}
    measured = {impl for impl, _ in by_key}
    used_reference = False

    def baseline(impl: str, name: str) -> tuple[str, float | None]:
        """The cell and the figure to compare with: measured, else the reference one."""
        nonlocal used_reference
        f = by_key.get((impl, name))
        if f is not None and f["median"] is not None:
            return _cell(f), f["median"]
        ref = references[impl].get(name)
        if impl not in measured and isinstance(ref, int | float):
            used_reference = True
            return f"{fmt_num(ref)} (ref)", float(ref)
        return "-", None

    rows = []
    for name, fig in FIGURES.items():
        ours, raw = by_key.get(("monarch", name)), by_key.get(("raw", name))
        if not any((impl, name) in by_key for impl in IMPLS):
            continue  # a reference figure alone: not measured here at all
        up_cell, up = baseline("upstream", name)
        ray_cell, ray = baseline("ray", name)
        t = targets.get(name)
        rows.append(
            [
                fig.label,
                fig.unit,
                _cell(ours),
                _cell(raw),
                _ratio(ours, raw["median"] if raw else None),
                up_cell,
                ray_cell,
                _ratio(ours, up),
                f"{t['op']} {t['target']}x" if t else "",
                {True: "pass", False: "FAIL", None: "-"}[t["pass"]] if t else "",
                _ratio(ours, ray),
            ]
        )
    headers = [
        "figure",
        "unit",
        "monarch",
        "raw",
        "monarch/raw",
        "upstream 0.7.0",
        "ray 2.60",
        "monarch/upstream",
        "target",
        "result",
        "monarch/ray",
    ]
    lines.append(markdown_table(headers, rows))
    lines.append("")
    for impl in ("upstream", "ray"):
        info = doc.get("baselines", {}).get(impl)
        label = BASELINES[impl].label
        if info is None:
            lines.append(f"{impl}: not measured in this run.")
        elif "error" in info:
            lines.append(f"{impl}: {label} failed: {info['error'][:300]}")
        else:
            versions = ", ".join(f"{k} {v}" for k, v in (info.get("packages") or {}).items() if v)
            lines.append(
                f"{impl}: measured in this run, after monarch and raw ({versions}; "
                f"{info['python']}, {info.get('duration_s')} s)."
            )
    if used_reference:
        lines.append(
            "(ref): not measured in this run; the figure measured on the reference machine "
            "(DESIGN.md, 'Performance targets'). Ratios and targets then compare across "
            "machines."
        )
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
    against = sorted({t["against"] for t in targets.values()})
    lines.append(
        f"targets met: {len(passed)} of {len(doc['targets'])} "
        f"(against {' and '.join(against) or 'nothing'})"
    )
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
