"""RDMA buffers between actors of two procs: ours (shared-memory and TCP planes) against a
memcpy, a raw loopback TCP stream and upstream torchmonarch 0.7.0, all in one run.

    hatch run bench:rdma [--quick] [--reps N] [--upstream-python PATH] [--out FILE]

The workloads (``_rdma_workloads.py``) use upstream's API only and run in a process of
their own: with our monarch (``monarch``: the planes as chosen, shared memory here;
``monarch-tcp``: the TCP plane forced with ``read_peer_buffers=False``; ``monarch-tcp-untagged``:
the same with ``rdma_tcp_integrity=False``), and with upstream
when its venv exists (``benchmarks/.venvs/upstream``, see ``baselines.py``; its fallback is
TCP). The memcpy and the raw TCP stream are measured by this process in the same run.
Figures are medians of ``--reps`` repetitions; the JSON (``results/rdma.json``) keeps every
repetition. The ``targets`` compare ratios taken in this run (issue 14):

- within a host, read_into/write_from of 128 MiB >= 0.5x a memcpy of the same size, and
  >= 10x upstream's;
- over the TCP plane, >= 0.7x a raw loopback socket stream of the same size;
- an RDMAAction of 8 x 16 MiB reads at least as fast as the 8 reads one after another;
- registering and dropping 1 GiB copies nothing: a few ms at most.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import (
    RESULTS_DIR,
    machine_info,
    memcpy_bandwidth,
    package_versions,
    print_report,
    ratio_entry,
    summarize,
    write_json,
)
from baselines import default_python

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024


def progress(started: float, text: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f}s] {text}", flush=True)


def run_workloads(
    python: str, extra: list[str], reps: int, quick: bool, timeout: float
) -> dict[str, Any]:
    """The workloads in another process (its JSON document)."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MONARCH_JOB_SECRET", "MONARCH_ROOT_ADDRESS"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    with tempfile.TemporaryDirectory(prefix="rdma-bench-") as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [python, str(HERE / "_rdma_workloads.py"), "--json", str(out), "--reps", str(reps)]
        cmd += extra + (["--quick"] if quick else [])
        done = subprocess.run(
            cmd,
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"exited with {done.returncode}: {done.stdout[-800:]} {done.stderr[-1500:]}"
            )
        doc: dict[str, Any] = json.loads(out.read_text())
        return doc


def tcp_stream(size: int, reps: int) -> dict[str, Any]:
    """A raw loopback TCP stream of ``size`` bytes (sendall -> recv_into), in MiB/s."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    data = memoryview(bytearray(b"\x5a") * size)

    def sink() -> None:
        conn, _ = server.accept()
        into = memoryview(bytearray(size))
        with conn:
            for _ in range(reps + 1):
                got = 0
                while got < size:
                    got += conn.recv_into(into[got:], size - got)
                conn.sendall(b"k")

    thread = threading.Thread(target=sink, daemon=True)
    thread.start()
    figures = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            sock.sendall(data)
            sock.recv(1)
            figures.append(size / MIB / (time.perf_counter() - t0))
    thread.join(30)
    server.close()
    return {"unit": "MiB/s", "size": size, **summarize(figures[1:])}


def mibps(size_mib: int, seconds: list[float]) -> dict[str, Any]:
    return {"unit": "MiB/s", **summarize([size_mib / s for s in seconds if s > 0])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="16 and 1 MiB only, 4 buffers a batch")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--upstream-python", help="torchmonarch 0.7.0's interpreter (default: its venv)")
    p.add_argument("--no-upstream", action="store_true")
    p.add_argument("--out", default=str(RESULTS_DIR / "rdma.json"))
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument(
        "--only", help="comma-separated implementations to run (monarch, monarch-tcp, ...)"
    )
    args = p.parse_args(argv)
    started = time.perf_counter()
    sizes = [16, 1] if args.quick else [128, 16, 1]
    batch = 4 if args.quick else 8
    register_mib = 256 if args.quick else 1024

    impls: dict[str, tuple[str, list[str]]] = {
        "monarch": (sys.executable, []),
        "monarch-tcp": (sys.executable, ["--tcp"]),
        "monarch-tcp-untagged": (sys.executable, ["--tcp", "--untagged"]),
    }
    notes: list[str] = []
    upstream = args.upstream_python or (None if args.no_upstream else default_python("upstream"))
    if upstream and Path(upstream).exists():
        impls["upstream"] = (str(upstream), [])
    elif not args.no_upstream:
        notes.append(
            "upstream: not measured, no benchmarks/.venvs/upstream (hatch run bench:baselines)"
        )

    if args.only:
        keep = set(args.only.split(","))
        impls = {name: impl for name, impl in impls.items() if name in keep}
    results: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    for name, (python, extra) in impls.items():
        progress(started, f"{name}: running the workloads")
        try:
            doc = run_workloads(python, extra, args.reps, args.quick, args.timeout)
        except Exception as error:  # noqa: BLE001 - recorded; the others still run
            errors[name] = repr(error)[:2000]
            continue
        results[name] = doc["figures"]
        if doc["errors"]:
            errors[name] = doc["errors"]
    progress(started, "memcpy and raw TCP stream")
    memcpy = {mib: memcpy_bandwidth(mib * MIB, max(3, args.reps)) for mib in sizes}
    stream = tcp_stream(sizes[0] * MIB, max(3, args.reps))

    figures: dict[str, dict[str, Any]] = {}
    for name, got in results.items():
        for mib in sizes:
            for op in ("read", "write"):
                seconds = got.get(f"{op}_{mib}MiB_s")
                if seconds:
                    figures[f"{name}/{op}_{mib}MiB"] = {
                        **mibps(mib, seconds),
                        "ms_per_op": 1000 * summarize(seconds)["median"],
                    }
        batch_figs = got.get(f"batch_{batch}x16MiB_s")
        if batch_figs:
            for kind in ("action", "sequential"):
                figures[f"{name}/batch_{batch}x16MiB_{kind}"] = {
                    "unit": "ms",
                    **summarize([1000 * s for s in batch_figs[kind]]),
                }
        reg = got.get(f"register_{register_mib}MiB_s")
        if reg:
            for kind in ("register", "drop"):
                figures[f"{name}/{kind}_{register_mib}MiB"] = {
                    "unit": "ms",
                    **summarize([1000 * s for s in reg[kind]]),
                }
        if got.get("first_buffer_s") is not None:
            figures[f"{name}/first_buffer"] = {"unit": "ms", "median": 1000 * got["first_buffer_s"]}
    for mib, fig in memcpy.items():
        figures[f"memcpy_{mib}MiB"] = fig
    figures[f"tcp_stream_{sizes[0]}MiB"] = stream

    def med(key: str) -> float | None:
        fig = figures.get(key)
        return None if fig is None else fig.get("median")

    big = sizes[0]
    targets = []
    for op in ("read", "write"):
        targets.append(
            ratio_entry(
                f"{op} {big} MiB vs memcpy",
                0.5,
                med(f"monarch/{op}_{big}MiB"),
                med(f"memcpy_{big}MiB"),
            )
        )
        targets.append(
            ratio_entry(
                f"{op} {big} MiB vs upstream",
                10.0,
                med(f"monarch/{op}_{big}MiB"),
                med(f"upstream/{op}_{big}MiB"),
            )
        )
        targets.append(
            ratio_entry(
                f"{op} {big} MiB, TCP plane vs raw TCP stream",
                0.7,
                med(f"monarch-tcp/{op}_{big}MiB"),
                med(f"tcp_stream_{big}MiB"),
            )
        )
        targets.append(
            ratio_entry(
                f"{op} {big} MiB, TCP plane, bytes untagged, vs raw TCP stream",
                0.7,
                med(f"monarch-tcp-untagged/{op}_{big}MiB"),
                med(f"tcp_stream_{big}MiB"),
            )
        )
    targets.append(
        ratio_entry(
            f"RDMAAction {batch}x16 MiB vs sequential reads (time)",
            1.0,
            med(f"monarch/batch_{batch}x16MiB_action"),
            med(f"monarch/batch_{batch}x16MiB_sequential"),
            higher_is_better=False,
        )
    )
    reg_ms = med(f"monarch/register_{register_mib}MiB")
    drop_ms = med(f"monarch/drop_{register_mib}MiB")
    per_gib = (
        None if reg_ms is None or drop_ms is None else (reg_ms + drop_ms) * 1024 / register_mib
    )
    targets.append(
        {
            "name": "register+drop ms per GiB",
            "op": "<=",
            "target": 5.0,
            "ours": per_gib,
            "pass": None if per_gib is None else per_gib <= 5.0,
        }
    )
    doc = {
        "benchmark": "rdma",
        "machine": machine_info(),
        "versions": package_versions(["monarch-core", "monarch-rdma"]),
        "settings": {"reps": args.reps, "quick": args.quick, "sizes_mib": sizes, "batch": batch},
        "figures": figures,
        "targets": targets,
        "errors": errors,
        "notes": notes,
    }
    path = write_json(args.out, doc)
    print_report(figures, targets, notes, errors, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
