"""The workloads of ``core_bench.py``, shared by every implementation it measures.

Standard library only: besides this repository's monarch, the same code runs in the
baseline interpreters (``benchmarks/.venvs/*``, see ``baselines.py``), where
``_actor_workloads.py`` drives upstream torchmonarch and ``_ray_workloads.py`` drives Ray.

A *side* is one implementation, set up and ready (a mesh of 4 workers, an ``Echo`` on
each). Each workload method runs one repetition and returns its figures (name ->
value, the names of ``core_bench.FIGURES``). ``run_sides`` primes the sides, takes the
RSS figures, then runs the repetitions, interleaving the sides; ``script_main`` is the
command line of a baseline script: one side, its figures written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from _raw_peer import cpu_ticks, pss_kib, rss_kib
from _results import percentile

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024
PAYLOAD_MIB = (1, 16, 128)
MESH_SIZE = 4

WORKLOADS = (
    "roundtrip",
    "roundtrip_await",
    "roundtrip_async_endpoint",
    "pipelined",
    "fire_and_forget",
    "mesh_gather",
    "payload",
    "tensor_payload",
    "cold_start",
)
TENSOR_MIB = 128
"""The size of the float32 tensor of ``tensor_payload`` (sides without torch skip it)."""


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
PRIME = Sizes(
    roundtrips=50,
    pipelined=500,
    fire_and_forget=500,
    mesh_calls=20,
    payload_calls=(1, 1, 1),
    reps=1,
    warmup=0,
)
"""What priming runs: imports, connections, allocator pools, bytecode."""


class Side(Protocol):
    """One implementation under test (see the module docstring)."""

    @property
    def name(self) -> str: ...

    def roundtrip(self, n: int) -> dict[str, float]: ...
    def roundtrip_await(self, n: int) -> dict[str, float]: ...
    def roundtrip_async_endpoint(self, n: int) -> dict[str, float]: ...
    def pipelined(self, n: int) -> dict[str, float]: ...
    def fire_and_forget(self, n: int) -> dict[str, float]: ...
    def mesh_gather(self, n: int) -> dict[str, float]: ...
    def payload(self, mib: int, data: bytes, count: int) -> dict[str, float]: ...
    def cold_start(self, timeout: float) -> dict[str, float]: ...
    def worker_rss(self) -> list[float]: ...
    def worker_pss(self) -> list[float]: ...
    def stop(self) -> None: ...


class Sink(Protocol):
    def add(self, impl: str, figures: dict[str, float]) -> None: ...
    def error(self, impl: str, workload: str, text: str) -> None: ...


# -- helpers ------------------------------------------------------------------------------


def latency(prefix: str, samples: list[float]) -> dict[str, float]:
    return {
        f"{prefix}_median_us": percentile(samples, 50) * 1e6,
        f"{prefix}_p99_us": percentile(samples, 99) * 1e6,
    }


class CpuMeter:
    """CPU time spent from now: this process's (the client's) and ``pids``' (the workers')."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.client = time.process_time()
        self.workers = cpu_ticks(self.pids)

    def per_call(self, prefix: str, calls: int) -> dict[str, float]:
        client = time.process_time() - self.client
        workers = (cpu_ticks(self.pids) - self.workers) / os.sysconf("SC_CLK_TCK")
        return {
            f"{prefix}_client_cpu_us": client / calls * 1e6,
            f"{prefix}_cpu_us": (client + workers) / calls * 1e6,
        }


def make_payload(mib: int) -> bytes:
    data = bytearray(mib * MIB)  # zero-filled, so every page is touched before timing
    data[0], data[-1] = 1, 2
    return bytes(data)


def check_echo(value: Any, size: int) -> None:
    if not isinstance(value, bytes | bytearray) or len(value) != size:
        raise AssertionError(f"echo returned {type(value).__name__} of {len(value)} bytes")
    if value[0] != 1 or value[-1] != 2:
        raise AssertionError("echo returned corrupted bytes")


def mib(kib: dict[str, int]) -> float | None:
    return kib["VmRSS"] / 1024 if "VmRSS" in kib else None


def pids_rss(pids: Sequence[int]) -> list[float]:
    return [v for v in (mib(rss_kib(pid)) for pid in pids) if v is not None]


def pids_pss(pids: Sequence[int]) -> list[float]:
    return [v / 1024 for v in (pss_kib(pid) for pid in pids) if v is not None]


# -- cold starts ------------------------------------------------------------------------

PYCACHE: list[str] = []
"""A bytecode cache for the cold-start processes, when this environment writes none."""


def cold_env() -> dict[str, str]:
    # a fresh job: not the secret (or root) this process's runtime put in its environment
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MONARCH_JOB_SECRET", "MONARCH_ROOT_ADDRESS")
    }
    if PYCACHE:
        # Installed packages come with compiled bytecode; PYTHONDONTWRITEBYTECODE would
        # make every cold start compile monarch's sources again. Cache it aside instead.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = PYCACHE[0]
    return env


def run_cold(args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``python ARGS`` fresh; its last JSON line on stdout, plus the parent's start."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        timeout=timeout,
        env=cold_env(),
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"cold start exited with code {proc.returncode}: {' | '.join(tail)}")
    for line in reversed(proc.stdout.decode(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                doc: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            if "t_reply" in doc:
                doc["t_parent"] = started
                return doc
    raise RuntimeError("cold start printed no timings")


def cold_figures(doc: dict[str, Any]) -> dict[str, float]:
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
        value = mib(doc.get(key, {}))
        if value is not None:
            out[name] = value
    return out


def use_pycache_if_needed(workloads: Sequence[str]) -> str | None:
    """Under PYTHONDONTWRITEBYTECODE, give cold starts a bytecode cache; returns a note."""
    if "cold_start" not in workloads or not sys.flags.dont_write_bytecode or PYCACHE:
        return None
    PYCACHE.append(tempfile.mkdtemp(prefix="core-bench-pycache-"))
    return (
        "PYTHONDONTWRITEBYTECODE is set: cold starts used a bytecode cache in a "
        "temporary PYTHONPYCACHEPREFIX (filled by an untimed first cold start)"
    )


def drop_pycache() -> None:
    for cache in PYCACHE:
        shutil.rmtree(cache, ignore_errors=True)
    PYCACHE.clear()


# -- running ------------------------------------------------------------------------------


def run_workload(
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
        for size, count in zip(PAYLOAD_MIB, sizes.payload_calls, strict=True):
            out.update(side.payload(size, payloads[size], count))
        return out
    if workload == "tensor_payload":
        tensor_payload = getattr(side, "tensor_payload", None)
        if tensor_payload is None:
            return {}  # an implementation that does not take torch tensors
        count = sizes.payload_calls[PAYLOAD_MIB.index(TENSOR_MIB)]
        figures: dict[str, float] = tensor_payload(TENSOR_MIB, count)
        return figures
    if workload == "cold_start":
        return side.cold_start(timeout)
    raise ValueError(workload)


def run_sides(
    sides: Sequence[Side],
    workloads: Sequence[str],
    sizes: Sizes,
    timeout: float,
    sink: Sink,
    failures: dict[str, str],
    *,
    controller_impl: str | None,
    progress: Callable[[str], None],
    beside_payload: Callable[[], None] | None = None,
) -> None:
    """Prime, take the RSS figures, then the repetitions, interleaved across the sides.

    Priming runs every workload once, small; one that fails then is recorded in
    ``failures`` and skipped from then on. For each workload of each repetition the
    sides run one after the other, and which goes first rotates.
    """
    payloads: dict[int, bytes] = {}
    skip: set[tuple[str, str]] = set()  # (impl, workload) that failed when primed

    def prime(selected: list[str]) -> None:
        for side in sides:
            for workload in selected:
                try:
                    run_workload(side, workload, PRIME, payloads, timeout)
                except Exception as exc:  # noqa: BLE001 - recorded, skipped from now on
                    failures[f"{side.name}/{workload}"] = f"priming failed: {exc!r}"
                    skip.add((side.name, workload))

    # RSS after a few small calls: before any payload reaches the workers (or this process)
    prime([w for w in workloads if w != "payload"])
    controller_rss = mib(rss_kib())
    if controller_rss is not None and controller_impl is not None:
        sink.add(controller_impl, {"bench_controller_rss_MiB": controller_rss})
    for side in sides:
        for value in side.worker_rss():
            sink.add(side.name, {"worker_rss_MiB": value})
        for value in side.worker_pss():
            sink.add(side.name, {"worker_pss_MiB": value})
    if "payload" in workloads or "tensor_payload" in workloads:
        payloads.update((size, make_payload(size)) for size in PAYLOAD_MIB)
        prime([w for w in workloads if w in ("payload", "tensor_payload")])
    progress("primed")

    total = sizes.warmup + sizes.reps
    for rep in range(total):
        warm = " (warm-up)" if rep < sizes.warmup else ""
        progress(f"repetition {rep + 1}/{total}{warm}")
        for workload in workloads:
            if workload == "payload" and beside_payload is not None and rep >= sizes.warmup:
                beside_payload()  # its baseline, measured under the same load as it
            shift = rep % max(1, len(sides))  # alternate which side goes first
            for side in [*sides[shift:], *sides[:shift]]:
                if (side.name, workload) in skip:
                    continue
                try:
                    figures = run_workload(side, workload, sizes, payloads, timeout)
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    sink.error(side.name, workload, f"{type(exc).__name__}: {exc}")
                    continue
                if rep >= sizes.warmup:
                    sink.add(side.name, figures)
    for side in sides:
        end = side.worker_rss()[:1]  # worker 0: the one that served the payloads
        if end:
            sink.add(side.name, {"worker_rss_end_MiB": end[0]})


# -- the baseline scripts' command line -----------------------------------------------------


class _Collected:
    """A Sink that keeps one side's figures as ``name -> [repetitions]``."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}
        self.errors: dict[str, list[str]] = {}

    def add(self, impl: str, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            self.values.setdefault(name, []).append(float(value))

    def error(self, impl: str, workload: str, text: str) -> None:
        self.errors.setdefault(workload, []).append(text)


def script_main(
    argv: list[str] | None,
    description: str,
    make_side: Callable[[float], Side],
    packages: Sequence[str],
) -> int:
    """Run the workloads on one side and write ``{"values", "errors", ...}`` as JSON.

    ``core_bench.py`` runs this (``--json PATH``) in a baseline's interpreter.
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", required=True, help="where to write the figures")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--sizes", required=True, help="a core_bench Sizes, as JSON")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per call")
    args = p.parse_args(argv)
    raw = json.loads(args.sizes)
    sizes = Sizes(**{**raw, "payload_calls": tuple(raw["payload_calls"])})
    workloads = [w for w in args.workloads.split(",") if w]
    started = time.perf_counter()

    def progress(text: str) -> None:
        print(f"  [{time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)

    collected = _Collected()
    failures: dict[str, str] = {}
    notes: list[str] = []
    note = use_pycache_if_needed(workloads)
    if note:
        notes.append(note)
    side: Side | None = None
    try:
        try:
            side = make_side(args.timeout)
        except Exception as exc:  # noqa: BLE001 - reported to core_bench
            failures["setup"] = f"setup failed: {exc!r}"
        else:
            progress("started")
            run_sides(
                [side],
                workloads,
                sizes,
                args.timeout,
                collected,
                failures,
                controller_impl=side.name,
                progress=progress,
            )
    finally:
        if side is not None:
            try:
                side.stop()
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                notes.append(f"stop failed: {exc!r}")
        drop_pycache()
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    doc = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "packages": versions,
        "sizes": asdict(sizes),
        "workloads": workloads,
        "values": collected.values,
        "errors": collected.errors,
        "failures": failures,
        "notes": notes,
        "duration_s": round(time.perf_counter() - started, 1),
    }
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0
