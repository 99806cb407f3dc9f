"""Casting to large meshes: what a cast costs the controller at 16, 128 and 1024 actors.

Run with ``hatch run bench:cast [--quick] [--out PATH]`` (or plain ``python
benchmarks/cast_bench.py`` with monarch-core and monarch-transport importable). This
process is the controller. It spawns three meshes, always 8 OS processes each, with
``procs_per_process`` packing several procs (each with its own actor) into one process:
8 x 2 = 16, 8 x 16 = 128 and 8 x 128 = 1024 actors. All three stay up for the whole run,
and the repetitions are interleaved across them, in a rotating order, so a drift in
machine load hits every size alike.

A cast is sent down a tree (``max_cast_fanout``, default 16): the controller sends one
message per subtree, not one per actor, and each process answers a gathered call with one
batched reply, in which equal values are sent and unpickled once. Per size, and once more
for 1024 actors with ``max_cast_fanout=2`` (the controller then sends 2 messages, and
the tree does the rest):

* gathered call: ``actors.ping.call().get()`` (every actor returns the same small str),
  one at a time. Controller CPU per call (``time.process_time()``, all of this process's
  threads), wall latency (median and p99), messages the controller sent
  (``current_runtime().posted``) and received per call, the distinct value objects in
  the returned ValueMesh, and the workers' CPU per call (``/proc/PID/stat``).
* fire-and-forget cast: N ``actors.tick.broadcast()``, then one
  ``actors.ticks.call().get()``, whose reply (every actor's count) proves all N were
  handled. Controller CPU per cast, casts per second, messages sent per cast, workers'
  CPU per cast.

The verdict compares the controller's CPU per cast at 128 and 1024 actors with that at
16: linear growth would be 8x and 64x. Nothing here asserts on speed.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _actor_workloads import Echo
from _raw_peer import cpu_ticks, rss_kib
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

from monarch.actor import endpoint, this_host
from monarch.config import configured
from monarch.core import NDSlice, Runtime, Shape, ValueMesh, current_runtime

HOSTS = 8
"""OS processes per mesh (the ``hosts`` dimension); ``gpus`` procs share each one."""
PER_PROCESS = (2, 16, 128)
"""Actors per OS process: meshes of 16, 128 and 1024 actors."""
PONG = "pong"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Worker(Echo):
    """core_bench's sync actor (each runs on a thread of its own), its ``ping`` answering
    one small str: the value every actor returns, sent once per process."""

    @endpoint
    def ping(self) -> str:
        return PONG


@dataclass(frozen=True)
class Settings:
    calls: tuple[int, ...]
    """Gathered calls per repetition, for each size of PER_PROCESS."""
    broadcasts: tuple[int, ...]
    """Fire-and-forget casts per repetition, for each size."""
    reps: int
    warmup: int
    fanout: int
    """The narrow fan-out of the extra 1024-actor variant."""


DEFAULT = Settings(calls=(400, 300, 100), broadcasts=(600, 500, 300), reps=7, warmup=1, fanout=2)
QUICK = Settings(calls=(100, 100, 30), broadcasts=(200, 200, 100), reps=3, warmup=0, fanout=2)


@dataclass(frozen=True)
class Variant:
    name: str
    per: int
    """Actors per OS process: which mesh."""
    fanout: int | None
    """``max_cast_fanout`` for the casts (None: the configured one)."""
    calls: int
    broadcasts: int

    @property
    def actors(self) -> int:
        return HOSTS * self.per


def variants(settings: Settings) -> list[Variant]:
    out = [
        Variant(f"{HOSTS * per}", per, None, calls, bcasts)
        for per, calls, bcasts in zip(PER_PROCESS, settings.calls, settings.broadcasts, strict=True)
    ]
    big = out[-1]
    out.append(replace(big, name=f"{big.actors} fan-out {settings.fanout}", fanout=settings.fanout))
    return out


FIGURES: dict[str, tuple[str, str]] = {
    "call_cpu_us": ("us", "controller CPU per gathered call"),
    "call_median_us": ("us", "gathered call latency, median"),
    "call_p99_us": ("us", "gathered call latency, p99"),
    "call_posted": ("msgs", "messages sent by the controller per call"),
    "call_received": ("msgs", "messages received by the controller per call"),
    "call_distinct_values": ("objects", "distinct value objects in the ValueMesh"),
    "call_worker_cpu_us": ("us", "workers' CPU per gathered call (all 8 processes)"),
    "bcast_cpu_us": ("us", "controller CPU per broadcast"),
    "bcast_per_s": ("casts/s", "broadcasts per second (to all actors, then 1 call)"),
    "bcast_posted": ("msgs", "messages sent by the controller per broadcast"),
    "bcast_worker_cpu_us": ("us", "workers' CPU per broadcast (all 8 processes)"),
    "local_valuemesh_us": ("us", "in-process: ValueMesh of N equal values, built"),
}
COUNTS = {"call_posted", "call_received", "call_distinct_values", "bcast_posted"}
"""Figures that are exact message or object counts (shown without a spread)."""


# -- measuring ----------------------------------------------------------------------------


class Received:
    """Counts the messages this process's runtime dispatches (benchmark instrumentation).

    Wraps the runtime's ``_deliver`` on the instance: every message read from a peer
    (and every message a process sends itself) goes through it.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.count = 0
        inner: Callable[[Any, Any, Any], str] = runtime._deliver

        def counting(envelope: Any, body: Any, payload: Any) -> str:
            self.count += 1
            return inner(envelope, body, payload)

        vars(runtime)["_deliver"] = counting


class Mesh:
    """8 OS processes, ``per`` procs each, a Worker on every proc."""

    def __init__(self, per: int, timeout: float) -> None:
        self.per = per
        self.timeout = timeout
        t0 = time.perf_counter()
        with configured(procs_per_process=per):
            self.procs = this_host().spawn_procs(per_host={"hosts": HOSTS, "gpus": per})
        try:
            self.actors = self.procs.spawn("cast", Worker)
            pids = self.actors.pid.call().get(timeout).values()
        except BaseException:
            self.procs.stop().get(timeout)
            raise
        self.spawn_s = time.perf_counter() - t0
        self.pids = sorted(set(pids))
        self.size = len(pids)

    def stop(self) -> None:
        self.procs.stop().get(self.timeout)


def gathered(
    mesh: Mesh, runtime: Runtime, received: Received, n: int, timeout: float
) -> dict[str, float]:
    call, clock = mesh.actors.ping.call, time.perf_counter
    samples = []
    posted0, received0, work0 = runtime.posted, received.count, cpu_ticks(mesh.pids)
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = clock()
        vm = call().get(timeout)
        samples.append(clock() - t0)
    cpu = time.process_time() - cpu0
    posted, got = runtime.posted - posted0, received.count - received0
    work = cpu_ticks(mesh.pids) - work0
    values = vm.values()
    if len(values) != mesh.size or any(v != PONG for v in values):
        raise AssertionError(f"gathered {len(values)} values, expected {mesh.size} x {PONG!r}")
    return {
        "call_cpu_us": cpu / n * 1e6,
        "call_median_us": percentile(samples, 50) * 1e6,
        "call_p99_us": percentile(samples, 99) * 1e6,
        "call_posted": posted / n,
        "call_received": got / n,
        "call_distinct_values": len({id(v) for v in values}),
        "call_worker_cpu_us": work / CLK_TCK / n * 1e6,
    }


def broadcasts(mesh: Mesh, runtime: Runtime, n: int, timeout: float) -> dict[str, float]:
    actors = mesh.actors
    before = actors.ticks.call().get(timeout).values()
    tick = actors.tick.broadcast
    posted0, work0 = runtime.posted, cpu_ticks(mesh.pids)
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        tick()
    after = actors.ticks.call().get(timeout).values()  # per-sender FIFO: after all N
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    posted, work = runtime.posted - posted0, cpu_ticks(mesh.pids) - work0
    grew = {a - b for a, b in zip(after, before, strict=True)}
    if grew != {n}:
        raise AssertionError(f"the closing call saw {sorted(grew)[:5]} ticks per actor, not {n}")
    return {
        "bcast_cpu_us": cpu / n * 1e6,
        "bcast_per_s": n / elapsed,
        "bcast_posted": posted / (n + 1),  # the closing call is a cast like the others
        "bcast_worker_cpu_us": work / CLK_TCK / n * 1e6,
    }


def local_valuemesh(size: int, per: int) -> dict[str, float]:
    """The controller's own O(actors) step, without messages: a ValueMesh of ``size``
    equal values (what ``call().get()`` returns; it stores each distinct object once)."""
    shape = Shape(["hosts", "gpus"], NDSlice.new_row_major([HOSTS, per]))
    values = [PONG] * size
    n = max(200, 100_000 // size)  # about 10 ms
    t0 = time.perf_counter()
    for _ in range(n):
        ValueMesh(shape, values)
    return {"local_valuemesh_us": (time.perf_counter() - t0) / n * 1e6}


def measure(
    variant: Variant, mesh: Mesh, runtime: Runtime, received: Received, timeout: float
) -> dict[str, float]:
    overrides = {} if variant.fanout is None else {"max_cast_fanout": variant.fanout}
    with configured(**overrides):
        figures = {
            **gathered(mesh, runtime, received, variant.calls, timeout),
            **broadcasts(mesh, runtime, variant.broadcasts, timeout),
        }
    if variant.fanout is None:
        figures.update(local_valuemesh(mesh.size, variant.per))
    return figures


# -- orchestration ------------------------------------------------------------------------


def _progress(started: float, text: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~20 s smoke run (fewer, smaller reps)")
    p.add_argument("--reps", type=int, help="timed repetitions per variant (after the warm-up)")
    p.add_argument("--warmup", type=int, help="untimed repetitions before the timed ones")
    p.add_argument("--fanout", type=int, help="max_cast_fanout of the extra 1024-actor variant")
    p.add_argument("--out", default=str(RESULTS_DIR / "cast.json"), help="JSON output path")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per call")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else DEFAULT
    if args.reps:
        settings = replace(settings, reps=args.reps)
    if args.warmup is not None:
        settings = replace(settings, warmup=args.warmup)
    if args.fanout:
        settings = replace(settings, fanout=args.fanout)
    started = time.perf_counter()
    progress: Callable[[str], None] = lambda text: _progress(started, text)  # noqa: E731
    todo = variants(settings)
    values: dict[tuple[str, str], list[float]] = {}
    meshes: dict[int, Mesh] = {}
    mesh_info: list[dict[str, Any]] = []
    errors: list[str] = []
    runtime = current_runtime()
    received = Received(runtime)
    try:
        for per in PER_PROCESS:
            mesh = meshes[per] = Mesh(per, args.timeout)
            progress(f"{mesh.size} actors in {len(mesh.pids)} processes: {mesh.spawn_s:.2f} s")
        for variant in todo:  # prime: threads, connections, caches
            primer = replace(variant, calls=10, broadcasts=10)
            measure(primer, meshes[variant.per], runtime, received, args.timeout)
        for per, mesh in meshes.items():
            rss = [rss_kib(pid).get("VmRSS", 0) / 1024 for pid in mesh.pids]
            threads = [_threads(pid) for pid in mesh.pids]
            mesh_info.append(
                {
                    "actors": mesh.size,
                    "processes": len(mesh.pids),
                    "actors_per_process": per,
                    "spawn_s": mesh.spawn_s,
                    "worker_rss_MiB": statistics.median(rss) if rss else None,
                    "worker_threads": statistics.median(threads) if threads else None,
                }
            )
        for rep in range(settings.warmup + settings.reps):
            warm = rep < settings.warmup
            shift = rep % len(todo)
            for variant in todo[shift:] + todo[:shift]:
                try:
                    got = measure(variant, meshes[variant.per], runtime, received, args.timeout)
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    errors.append(f"{variant.name} rep {rep}: {exc!r}")
                    continue
                if not warm:
                    for name, value in got.items():
                        values.setdefault((variant.name, name), []).append(value)
            progress(f"{'warm-up' if warm else 'repetition'} {rep + 1} done")
    finally:
        for mesh in meshes.values():
            try:
                mesh.stop()
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                errors.append(f"stopping {mesh.size} actors: {exc!r}")

    figures = []
    for variant in todo:
        for name, (unit, label) in FIGURES.items():
            reps = values.get((variant.name, name))
            if reps:
                figures.append(
                    {
                        "variant": variant.name,
                        "actors": variant.actors,
                        "fanout": variant.fanout,
                        "name": name,
                        "unit": unit,
                        "label": label,
                        **summarize(reps),
                    }
                )
    doc = {
        "benchmark": "cast",
        "machine": machine_info(),
        "packages": package_versions(["monarch-core", "monarch-transport"]),
        "settings": {
            **asdict(settings),
            "hosts": HOSTS,
            "actors_per_process": list(PER_PROCESS),
            "variants": [asdict(v) | {"actors": v.actors} for v in todo],
            "quick": args.quick,
        },
        "duration_s": round(time.perf_counter() - started, 1),
        "meshes": mesh_info,
        "figures": figures,
        "scaling": scaling(figures),
        "errors": errors,
    }
    out_path = write_json(args.out, doc)
    print(render_markdown(doc))
    print(f"\nJSON written to {out_path}", file=sys.stderr)
    return 0


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def scaling(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Controller CPU per cast at 128 and 1024 actors over 16, against linear growth."""
    median = {(f["variant"], f["name"]): f["median"] for f in figures}
    small = HOSTS * PER_PROCESS[0]
    out = []
    for name in ("call_cpu_us", "bcast_cpu_us"):
        for per in PER_PROCESS[1:]:
            actors = HOSTS * per
            entry = ratio_entry(
                f"{name} {actors}/{small}",
                actors / small,  # linear growth; sub-linear is below it
                median.get((str(actors), name)),
                median.get((str(small), name)),
                higher_is_better=False,
                figure=name,
                actors_ratio=actors / small,
            )
            ratio = entry["ratio"]
            entry["exponent"] = (
                math.log(ratio) / math.log(actors / small) if ratio and ratio > 0 else None
            )
            out.append(entry)
    return out


# -- output -------------------------------------------------------------------------------


def _count(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.2f}"


def _cell(f: dict[str, Any] | None, spread: bool = True) -> str:
    if f is None or f["median"] is None:
        return "-"
    median = f["median"]
    if not spread:  # an exact count
        return _count(median)
    text = fmt_num(median)
    if f["spread"] is not None and len(f["reps"]) > 1:
        text += f" ±{f['spread'] * 100:.0f}%"
    return text


def render_markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    s = doc["settings"]
    names = [v["name"] for v in s["variants"]]
    headers = [
        f"{v['actors']} actors" + (f", fan-out {v['fanout']}" if v["fanout"] else "")
        for v in s["variants"]
    ]
    lines = [
        f"## Casting to large meshes ({m.get('cpu_count')} CPUs, {m.get('cpu_model', '?')}, "
        f"Python {m.get('python')}, load {m.get('load_average')}, {doc['duration_s']} s)",
        "",
        f"Median of {s['reps']} repetitions (± half the min-max range, relative), interleaved "
        f"across sizes. Every mesh is {s['hosts']} OS processes; gathered calls per repetition "
        f"{', '.join(map(str, s['calls']))} and broadcasts "
        f"{', '.join(map(str, s['broadcasts']))} (16, 128, 1024 actors). "
        "Message and object counts are exact (procs of one machine send no heartbeats).",
        "",
    ]
    by_key = {(f["variant"], f["name"]): f for f in doc["figures"]}
    rows = [
        [label, unit, *(_cell(by_key.get((v, name)), name not in COUNTS) for v in names)]
        for name, (unit, label) in FIGURES.items()
    ]
    meshes = {info["actors"]: info for info in doc["meshes"]}
    for key, unit, label in (
        ("spawn_s", "s", "spawn procs + actors + first reply"),
        ("worker_rss_MiB", "MiB", "worker RSS (median of the 8)"),
        ("worker_threads", "threads", "threads per worker process"),
    ):
        row = [label, unit]
        for v in s["variants"]:
            info = meshes.get(v["actors"]) if v["fanout"] is None else None
            value = info.get(key) if info else None
            row.append(
                ""
                if value is None
                else _count(value)
                if key == "worker_threads"
                else fmt_num(value)
            )
        rows.append(row)
    lines.append(markdown_table(["figure", "unit", *headers], rows))
    lines += ["", "Controller CPU per cast, growth from 16 actors:", ""]
    scale_rows = []
    for e in doc["scaling"]:
        verdict = {True: "sub-linear", False: "NOT sub-linear", None: "-"}[e["pass"]]
        scale_rows.append(
            [
                FIGURES[e["figure"]][1],
                e["name"].split()[-1],
                f"{fmt_num(e['actors_ratio'])}x",
                f"{fmt_num(e['ratio'])}x" if e["ratio"] is not None else "-",
                fmt_num(e["exponent"]) if e["exponent"] is not None else "-",
                verdict,
            ]
        )
    lines.append(
        markdown_table(
            ["figure", "actors", "actor ratio", "CPU ratio", "exponent", "verdict"], scale_rows
        )
    )
    verdicts = [e["pass"] for e in doc["scaling"]]
    lines += [
        "",
        "exponent: k in CPU ~ actors^k between the two sizes (1 is linear). "
        + (
            "Controller CPU per cast grows sub-linearly with the number of actors."
            if verdicts and all(verdicts)
            else "Controller CPU per cast does NOT grow sub-linearly everywhere."
        ),
    ]
    if doc["errors"]:
        lines += ["", *(f"- error: {e}" for e in doc["errors"])]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
