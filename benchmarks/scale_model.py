"""The model of a job of 10,000 hosts x 8 procs (and of 32 x 8, to set beside its run).

Run with ``hatch run bench:scale-model [--out PATH] [--doc docs/scale.md]``. Every figure is
computed here from three sources, named in the JSON:

- the code itself: the cast tree is ``_runtime._cast.split`` applied as ``fan_out`` does,
  with the ``max_cast_fanout``, ``heartbeat_interval`` and ``heartbeat_timeout`` of the
  configuration; a message's bytes are its real wire structs (``Envelope``, ``Call``,
  ``PortValue``, ``Beat``) encoded, plus the transport's framing;
- measured costs: ``results/core.json`` (bench:core: a hop's latency, the CPU a message
  costs) and ``results/scale.json`` + ``results/scale_1024.json`` (bench:scale: the
  controller's CPU per gathered cast and its memory, against the number of procs);
- where present, the 32-host run's figures (``results/hosts34_*.json``, helper hosts34's
  netns hosts) next to the model's prediction for 32 hosts.

Replies and supervision are modelled both ways: "direct" (each proc answers the caller
itself; each host's agent beats to the controller and watches its procs for it, helper
fanin34's change; before it, "per proc": the controller beat every proc too) and "tree"
(they fan in through the cast tree, ``max_cast_fanout`` per node). ``--doc`` rewrites the
generated tables of ``docs/scale.md`` (between its ``<!-- model -->`` markers).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import RESULTS_DIR, fmt_num, markdown_table, write_json

from monarch.core import current_config
from monarch.core.lowlevel import (
    TO_ACTOR,
    TO_PORT,
    Beat,
    Call,
    Envelope,
    PortRef,
    PortValue,
    ShapeSpec,
    dumps,
)
from monarch.core.lowlevel import encode_message as encode
from monarch.core.lowlevel import split_cast as split
from monarch.transport.wire import SEAL_SIZE

ROOT = Path(__file__).resolve().parent.parent
SCALES = {"10000x8": (10_000, 8), "32x8": (32, 8)}
ADDRESS = "tls://10.123.45.67:41651"
"""A proc's address on another host, as long as a real one (``tls://`` + IPv4 + port)."""
NETWORK_ONE_WAY_MS = 0.05
"""Assumed: one way between two hosts of a data centre (bench:core's hop is on one host)."""
SEQ = 100_000
"""A sequence number far into a job (3 bytes of msgpack: the common size)."""


def framed(parts: Sequence[bytes]) -> int:
    """Bytes on the wire of a frame of ``parts``: count, lengths, parts, seal (MAC)."""
    return 4 + 8 * len(parts) + sum(len(p) for p in parts) + SEAL_SIZE


def call_bytes(dims: tuple[int, int], below: int) -> int:
    """A cast's message to a head with ``below`` procs to relay to (``fan_out``)."""
    return _call_bytes(dims, below)


@cache
def _call_bytes(dims: tuple[int, int], below: int) -> int:
    hosts, per_host = dims
    shape = ShapeSpec(("hosts", "gpus"), 0, (hosts, per_host), (per_host, 1))
    reply = PortRef(ADDRESS, 1234)
    call = Call(
        "trainers", "step", shape, reply, False, ADDRESS, (SEQ,) * (below + 1),
        (ADDRESS,) * below, True,
    )  # fmt: skip
    envelope = Envelope(TO_ACTOR, "trainers", ADDRESS)
    return framed([encode(envelope), encode(call), *map(bytes, dumps(((), {})))])


def reply_bytes() -> int:
    """One rank's reply (``None``) to a gathered call."""
    envelope = Envelope(TO_PORT, "1234", ADDRESS)
    return framed([encode(envelope), encode(PortValue(7)), *map(bytes, dumps(None))])


def beat_bytes() -> int:
    return framed([encode(Beat())])


def tree(procs: int, fanout: int, dims: tuple[int, int]) -> list[dict[str, Any]]:
    """The cast tree's levels: messages, and their bytes, sent at each depth."""
    levels: list[dict[str, Any]] = []
    frontier: list[int] = [procs]  # sizes of the target lists a sender splits
    while frontier:
        sizes: list[int] = []
        for targets in frontier:
            sizes += [len(chunk) for chunk in split([ADDRESS] * targets, fanout)]
        sent = [call_bytes(dims, size - 1) for size in sizes]
        levels.append(
            {
                "level": len(levels) + 1,
                "messages": len(sizes),
                "bytes": sum(sent),
                "bytes_max": max(sent),
                "relayed_max": max(sizes) - 1,
            }
        )
        frontier = [size - 1 for size in sizes if size > 1]
    return levels


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def figure(doc: dict[str, Any], name: str, impl: str = "monarch") -> float:
    for f in doc["figures"]:
        if f["name"] == name and f.get("impl", impl) == impl and f.get("median") is not None:
            return float(f["median"])
    raise KeyError(f"{name} ({impl}) not in {doc.get('benchmark')}'s results")


def measured_inputs(results: Path, network_one_way_ms: float) -> dict[str, Any]:
    """The per-message costs the model uses, from bench:core and bench:scale's JSON."""
    core = json.loads((results / "core.json").read_text())
    scale_points: dict[str, list[tuple[float, float]]] = {"cpu": [], "rss": []}
    sources = ["core.json"]
    for name in ("scale.json", "scale_1024.json"):
        path = results / name
        if not path.exists():
            continue
        sources.append(name)
        for f in json.loads(path.read_text())["figures"]:
            if f["side"] == "ours" and f["name"] == "call_cpu_ms":
                scale_points["cpu"].append((f["procs"], f["median"]))
            if f["side"] == "ours" and f["name"] == "controller_rss_MiB":
                scale_points["rss"].append((f["procs"], f["median"]))
    cpu0, cpu_per_proc = fit(scale_points["cpu"])
    rss0, rss_per_proc = fit(scale_points["rss"])
    return {
        "sources": sources,
        "hop_ms": figure(core, "roundtrip_sync_median_us") / 2e3,
        "network_one_way_ms": network_one_way_ms,
        "message_cpu_ms": 1e3 / figure(core, "fire_and_forget_msgs_per_s"),
        "cast_cpu_ms_fixed": cpu0,
        "cast_cpu_ms_per_reply": cpu_per_proc,
        "controller_rss_MiB_fixed": rss0,
        "controller_rss_KiB_per_proc": rss_per_proc * 1024,
        "scale_points": scale_points,
    }


def model(hosts: int, per_host: int, inputs: dict[str, Any]) -> dict[str, Any]:
    config = current_config()
    fanout, interval = config.max_cast_fanout, config.heartbeat_interval
    timeout = config.heartbeat_timeout
    procs = hosts * per_host
    levels = tree(procs, fanout, (hosts, per_host))
    depth = len(levels)
    hop = inputs["hop_ms"] + inputs["network_one_way_ms"]
    msg_cpu, reply_cpu = inputs["message_cpu_ms"], inputs["cast_cpu_ms_per_reply"]
    # a node of the tree sends up to ``fanout`` messages, one after another
    down_ms = sum(hop + min(fanout, lv["messages"]) * msg_cpu for lv in levels)
    # gathered up the tree, a node merges up to ``fanout`` replies before it answers
    up_ms = sum(hop + min(fanout, lv["messages"]) * reply_cpu for lv in levels)
    reply = reply_bytes()
    beat = beat_bytes()
    replies = {
        "direct": {
            "controller_messages": procs,
            "controller_bytes": procs * reply,
            "controller_connections": procs,
            "controller_cpu_ms": inputs["cast_cpu_ms_fixed"]
            + inputs["cast_cpu_ms_per_reply"] * procs,
            "latency_ms": down_ms + hop + procs * reply_cpu,
        },
        "tree": {
            "controller_messages": min(fanout, procs),
            "controller_bytes": min(fanout, procs) * reply,  # a batch of equal values: one
            "controller_connections": min(fanout, procs),
            "controller_cpu_ms": inputs["cast_cpu_ms_fixed"]
            + inputs["cast_cpu_ms_per_reply"] * min(fanout, procs),
            "latency_ms": down_ms + up_ms,
        },
    }
    # Heartbeats the controller receives: "per proc" (before helper fanin34: it watched
    # every proc and every agent itself), "direct" (the agents watch their procs for it:
    # each host's agent beats to the controller; the code now), "tree" (through the tree).
    beats_per_proc = (procs + hosts) / interval
    beats_direct = hosts / interval
    beats_tree = min(fanout, hosts) / interval
    return {
        "hosts": hosts,
        "procs_per_host": per_host,
        "procs": procs,
        "fanout": fanout,
        "depth": depth,
        "levels": levels,
        "cast_messages": sum(lv["messages"] for lv in levels),
        "cast_bytes": sum(lv["bytes"] for lv in levels),
        "controller_cast_messages": levels[0]["messages"],
        "controller_cast_bytes": levels[0]["bytes"],
        "cast_down_ms": down_ms,
        "replies": replies,
        "reply_bytes": reply,
        "heartbeat": {
            "interval_s": interval,
            "timeout_s": timeout,
            "beat_bytes": beat,
            "per_proc_per_s": beats_per_proc,
            "direct_per_s": beats_direct,
            "direct_bytes_per_s": beats_direct * beat,
            "direct_cpu_share": beats_direct * msg_cpu / 1e3,
            "tree_per_s": beats_tree,
            "tree_bytes_per_s": beats_tree * beat,
            "tree_cpu_share": beats_tree * msg_cpu / 1e3,
        },
        "controller_memory": {
            "KiB_per_proc": inputs["controller_rss_KiB_per_proc"],
            "total_MiB": inputs["controller_rss_MiB_fixed"]
            + inputs["controller_rss_KiB_per_proc"] * procs / 1024,
        },
        "host_loss": {
            # killed: its peers' connections close at once; the report climbs the tree
            "killed_detect_ms": hop,
            "killed_report_ms": hop + depth * hop,
            # partitioned: silence for heartbeat_timeout since the last beat, which came
            # up to an interval before the partition; the silence is checked each interval
            "partition_detect_s_min": timeout - interval,
            "partition_detect_s_max": timeout + interval,
            "partition_report_s": timeout + interval + (depth * hop) / 1e3,
            "supervision_messages_direct": per_host,
            "supervision_messages_tree": 1,
        },
    }


def check(m: dict[str, Any]) -> list[str]:
    """What must hold between the figures (the test runs this)."""
    problems = []
    levels = m["levels"]
    if sum(lv["messages"] for lv in levels) != m["procs"]:
        problems.append("messages per level do not sum to one per proc")
    if m["cast_messages"] != m["procs"] or m["cast_bytes"] != sum(lv["bytes"] for lv in levels):
        problems.append("totals are not the sums of the levels")
    if m["depth"] != len(levels) or m["depth"] > math.ceil(math.log(m["procs"], 2)) + 1:
        problems.append("depth")
    if m["controller_cast_messages"] != min(m["fanout"], m["procs"]):
        problems.append("the controller sends more than fan-out messages per cast")
    for lv in levels:
        if lv["messages"] > m["fanout"] ** lv["level"]:
            problems.append(f"level {lv['level']} has more than fanout^level messages")
    tree_, direct = m["replies"]["tree"], m["replies"]["direct"]
    if tree_["controller_messages"] > m["fanout"] or direct["controller_messages"] != m["procs"]:
        problems.append("reply counts")
    return problems


def hosts34(results: Path) -> dict[str, Any] | None:
    """The 32-host run's figures (helper hosts34's JSON), when it has been written."""
    return run_figures(sorted(results.glob("hosts34_*.json")), completed=True)


def fanin34(results: Path, when: str = "after") -> dict[str, Any] | None:
    """The 32-host run with procs watched by their agents (helper fanin34's JSON; ``when``
    "before": the code before, run beside it on the same loaded machine)."""
    return run_figures([results / f"fanin34_32x8_{when}.json"], completed=True)


def run_figures(paths: Sequence[Path], completed: bool = False) -> dict[str, Any] | None:
    """The figures of the first 32-host run in ``paths`` (bench:hosts JSONs; ``completed``:
    only a run that did not fail)."""
    for path in paths:
        if not path.exists():
            continue
        for run in (json.loads(path.read_text()).get("runs") or {}).values():
            if not isinstance(run, dict) or run.get("hosts") != 32:
                continue
            if completed and "failed" in run:
                continue
            calls = (run.get("calls") or {}).get("call_ms") or []
            idle = run.get("traffic_idle") or {}
            return {
                "source": path.name,
                "call_ms": sorted(calls)[len(calls) // 2] if calls else None,
                "controller_connections": idle.get("connections"),
                "controller_busy_connections_idle": idle.get("busy_connections"),
                "controller_rx_per_s_idle": idle.get("rx_pps"),
                "killed_client_ms": _ms((run.get("killed") or {}).get("client_s")),
                "partition_client_s": (run.get("partitioned") or {}).get("client_s"),
            }
    return None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def render(doc: dict[str, Any]) -> str:
    big, small = doc["models"]["10000x8"], doc["models"]["32x8"]
    lines = [
        f"Fan-out {big['fanout']}, heartbeat every {big['heartbeat']['interval_s']} s, "
        f"timeout {big['heartbeat']['timeout_s']} s; inputs from "
        f"{', '.join(doc['inputs']['sources'])}: a hop {fmt_num(doc['inputs']['hop_ms'])} ms "
        f"(+ {fmt_num(doc['inputs']['network_one_way_ms'])} ms assumed between hosts), "
        f"{fmt_num(doc['inputs']['message_cpu_ms'] * 1e3)} us of CPU to send a message, "
        f"{fmt_num(doc['inputs']['cast_cpu_ms_per_reply'] * 1e3)} us of the controller's CPU "
        "per reply gathered.",
        "",
        f"The cast tree of {big['procs']:,} procs (10,000 hosts x 8):",
        "",
        markdown_table(
            ["level", "messages", "bytes", "largest message, bytes", "procs it relays to"],
            [
                *map(level_row, big["levels"]),
                ["total", f"{big['cast_messages']:,}", f"{big['cast_bytes']:,}", "", ""],
            ],
        ),
        "",
    ]
    rows = []
    for label, key in (("10,000 x 8", "10000x8"), ("32 x 8", "32x8")):
        m = doc["models"][key]
        for mode in ("direct", "tree"):
            r, hb = m["replies"][mode], m["heartbeat"]
            rows.append(
                [
                    label,
                    mode,
                    m["depth"],
                    f"{r['controller_messages']:,}",
                    f"{r['controller_connections']:,}",
                    fmt_num(r["controller_cpu_ms"]),
                    fmt_num(r["latency_ms"]),
                    fmt_num(hb[f"{mode}_per_s"]),
                    fmt_num(hb[f"{mode}_bytes_per_s"]),
                    fmt_num(m["controller_memory"]["total_MiB"]),
                    fmt_num(m["host_loss"]["killed_report_ms"]),
                    f"{fmt_num(m['host_loss']['partition_detect_s_min'])}-"
                    f"{fmt_num(m['host_loss']['partition_report_s'])}",
                ]
            )
    lines += [
        markdown_table(
            [
                "job",
                "replies, beats",
                "depth",
                "controller msgs per gathered cast",
                "controller connections",
                "controller CPU per cast, ms",
                "cast + replies, ms",
                "beats at controller /s",
                "beat bytes /s",
                "controller RSS, MiB",
                "host killed: reported, ms",
                "host partitioned: reported, s",
            ],
            rows,
        ),
        "",
        f"Controller memory: {fmt_num(big['controller_memory']['KiB_per_proc'])} KiB per "
        f"proc (fit of bench:scale's controller RSS against procs).",
        "",
        "<!-- hosts34: the 32-host run (benchmarks/results/hosts34_*.json) -->",
        "",
    ]
    runs = [doc.get("hosts34"), doc.get("fanin34_before"), doc.get("fanin34")]
    tree32 = small["replies"]["tree"]
    direct32 = small["replies"]["direct"]
    beats32 = small["heartbeat"]
    lines.append(
        markdown_table(
            [
                "32 hosts x 8",
                "model (direct / tree)",
                "measured (hosts34)",
                "fanin34: before",
                "fanin34: agents watch procs",
            ],
            [
                [
                    "gathered call, ms",
                    f"{fmt_num(direct32['latency_ms'])} / {fmt_num(tree32['latency_ms'])}",
                    *_each(runs, "call_ms"),
                ],
                [
                    "controller connections",
                    f"{direct32['controller_connections']} / {tree32['controller_connections']}",
                    *_each(runs, "controller_connections"),
                ],
                [
                    "of which carry traffic, idle",
                    f"{fmt_num(2 * small['hosts'])} (agents, both ways) / "
                    f"{fmt_num(2 * min(small['fanout'], small['hosts']))}",
                    *_each(runs, "controller_busy_connections_idle"),
                ],
                [
                    "controller beats received /s, idle (per proc / agents / tree)",
                    f"{fmt_num(beats32['per_proc_per_s'])} / "
                    f"{fmt_num(beats32['direct_per_s'])} / {fmt_num(beats32['tree_per_s'])}",
                    *["-"] * len(runs),
                ],
                [
                    "controller packets received /s, idle (beats + ACKs)",
                    f"{fmt_num(2 * beats32['per_proc_per_s'])} / "
                    f"{fmt_num(2 * beats32['direct_per_s'])} / "
                    f"{fmt_num(2 * beats32['tree_per_s'])}",
                    *_each(runs, "controller_rx_per_s_idle"),
                ],
                [
                    "host killed: the client told, ms",
                    fmt_num(small["host_loss"]["killed_report_ms"]),
                    *_each(runs, "killed_client_ms"),
                ],
                [
                    "host partitioned: the client told, s",
                    f"{fmt_num(small['host_loss']['partition_detect_s_min'])}-"
                    f"{fmt_num(small['host_loss']['partition_report_s'])}",
                    *_each(runs, "partition_client_s"),
                ],
            ],
        )
    )
    sources = [m["source"] for m in runs if m is not None]
    lines += ["", f"(measured: {', '.join(sources) or 'not yet'})"]
    return "\n".join(lines)


def level_row(lv: dict[str, Any]) -> list[str]:
    keys = ("messages", "bytes", "bytes_max", "relayed_max")
    return [str(lv["level"]), *(f"{lv[key]:,}" for key in keys)]


def _each(runs: Sequence[dict[str, Any] | None], key: str) -> list[str]:
    """``key`` of each measured run, "-" where there is none."""
    return ["-" if run is None else fmt_num(run.get(key)) for run in runs]


def build(results: Path, network_one_way_ms: float = NETWORK_ONE_WAY_MS) -> dict[str, Any]:
    inputs = measured_inputs(results, network_one_way_ms)
    models = {name: model(h, p, inputs) for name, (h, p) in SCALES.items()}
    return {
        "benchmark": "scale-model",
        "inputs": inputs,
        "models": models,
        "problems": {name: check(m) for name, m in models.items()},
        "hosts34": hosts34(results),
        "fanin34": fanin34(results),
        "fanin34_before": fanin34(results, "before"),
    }


def write_doc(path: Path, text: str) -> None:
    """Replace what lies between ``<!-- model -->`` and ``<!-- /model -->`` in ``path``."""
    doc = path.read_text()
    start, end = "<!-- model -->", "<!-- /model -->"
    head, _, rest = doc.partition(start)
    _, _, tail = rest.partition(end)
    if not rest or end not in rest:
        raise ValueError(f"{path} has no {start} ... {end} section")
    path.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--results", default=str(RESULTS_DIR), help="where the benches' JSON is")
    p.add_argument("--out", default=str(RESULTS_DIR / "actors34_scale_model.json"))
    p.add_argument("--doc", default="", help="rewrite this document's model section")
    p.add_argument(
        "--network-ms",
        type=float,
        default=NETWORK_ONE_WAY_MS,
        help="one-way network latency between hosts, added to the measured hop",
    )
    args = p.parse_args(argv)
    doc = build(Path(args.results), args.network_ms)
    write_json(args.out, doc)
    text = render(doc)
    print(text)
    if args.doc:
        write_doc(Path(args.doc), text)
    problems = [f"{name}: {p}" for name, ps in doc["problems"].items() for p in ps]
    for problem in problems:
        print(f"inconsistent: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
