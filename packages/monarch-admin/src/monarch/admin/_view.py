"""The job as the admin server shows it: hosts, their procs, the procs' actors.

``JobView.collect()`` asks every live proc this client spawned (and the client itself)
for its snapshot at once (``monarch.core.snapshot_procs``) and waits at most ``timeout``
for them all: a proc that does not answer is shown as ``not answering`` with what it
said last, a dead one as ``died`` (or ``stopped``, when it exited cleanly) with its last
actors marked ``lost``. Rates (messages per second, CPU) are the differences between a
snapshot and an earlier one at least ``RATE_WINDOW`` seconds older.

Every node has a reference (``root``, ``host:ADDRESS``, ``proc:ADDRESS``,
``actor:ACTOR_ID``): opaque strings that the routes take back (URL-encoded).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

from monarch.core import (
    ActorState,
    PeerLost,
    ProcSnapshot,
    SpawnedProc,
    current_runtime,
    inspect_proc,
    snapshot_procs,
    spawned_procs,
)

from ._stacks import own_threads, pyspy_dump, pyspy_path

ROOT: Final = "root"
RATE_WINDOW: Final = 0.5
"""Seconds between the samples a rate is computed from, at least."""
CLIENT_MESH: Final = "client"
"""The client's own proc: the mesh name it is shown under."""

Json = dict[str, Any]


class NotFound(LookupError):
    """No node has this reference (it may have gone)."""


class NotAnswering(TimeoutError):
    """The proc did not answer in time."""


class JobView:
    """Collects what the procs of this client say of themselves (see the module docstring)."""

    def __init__(self, timeout: float = 2.0) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._last: dict[str, ProcSnapshot] = {}
        """What each proc said last, by address."""
        self._handled: dict[str, tuple[float, int, float]] = {}
        """Per actor: when its count was sampled, the count, and the rate then."""
        self._cpu: dict[str, tuple[float, float, float]] = {}

    # -- collecting ---------------------------------------------------------------------

    def procs(self) -> list[SpawnedProc]:
        """The client's own proc, then every proc it spawned."""
        runtime = current_runtime()
        me = SpawnedProc(CLIENT_MESH, 0, runtime.address, runtime.address, os.getpid(), None)
        return [me, *spawned_procs()]

    def collect(self) -> Json:
        """A snapshot of the whole job (the ``/v1/snapshot`` document)."""
        procs = self.procs()
        live = (p.address for p in procs if p.address is not None and p.exited is None)
        now = time.time()
        answers = snapshot_procs(live, self.timeout)
        client = current_runtime().address
        hosts: dict[str, Json] = {}
        for proc in procs:
            host = hosts.get(proc.host)
            if host is None:
                host = hosts[proc.host] = {
                    "ref": f"host:{proc.host}",
                    "address": proc.host,
                    "hostname": "",
                    "local": proc.host == client,
                    "procs": [],
                }
            node = self._proc(proc, answers.get(proc.address or ""), now)
            if node["hostname"] and not host["hostname"]:
                host["hostname"] = node["hostname"]
            host["procs"].append(node)
        for host in hosts.values():
            if not host["hostname"]:
                host["hostname"] = socket.gethostname() if host["local"] else host["address"]
        every = [actor for host in hosts.values() for p in host["procs"] for actor in p["actors"]]
        every_proc = [p for host in hosts.values() for p in host["procs"]]
        self._forget(
            {proc.address for proc in procs if proc.address},
            {actor["actor_id"] for actor in every},
        )
        return {
            "time": now,
            "client": client,
            "summary": {
                "hosts": len(hosts),
                "procs": len(every_proc),
                "actors": len(every),
                "failed": sum(actor["state"] == "failed" for actor in every),
                "not_answering": sum(p["state"] == "not answering" for p in every_proc),
                "died": sum(p["state"] == "died" for p in every_proc),
            },
            "hosts": list(hosts.values()),
        }

    def _forget(self, addresses: set[str], actor_ids: set[str]) -> None:
        """Let go of what belongs to procs no longer listed (``spawned_procs`` keeps the
        newest ended ones only) and to their actors."""
        with self._lock:
            for table, keep in ((self._last, addresses), (self._cpu, addresses)):
                for key in [key for key in table if key not in keep]:
                    del table[key]
            for key in [key for key in self._handled if key not in actor_ids]:
                del self._handled[key]

    def _proc(
        self, proc: SpawnedProc, answer: ProcSnapshot | BaseException | None, now: float
    ) -> Json:
        address = proc.address
        ref = f"proc:{address}" if address else f"proc:{proc.host}/{proc.mesh}/{proc.rank}"
        node: Json = {
            "ref": ref,
            "mesh": proc.mesh,
            "rank": proc.rank,
            "host": proc.host,
            "address": address,
            "pid": proc.pid,
            "state": "running",
            "error": "",
            "hostname": "",
            "cpu_user": None,
            "cpu_system": None,
            "cpu_percent": None,
            "rss": None,
            "threads": None,
            "uptime": None,
            "actors": [],
        }
        with self._lock:
            last = self._last.get(address or "")
            if isinstance(answer, ProcSnapshot):
                self._last[answer.address] = answer
                last = answer
        if proc.exited is not None:
            clean = proc.exited == "exited with code 0"
            node["state"], node["error"] = ("stopped" if clean else "died"), proc.exited
        elif address is None:
            node["state"] = "starting"
        elif isinstance(answer, TimeoutError):
            node["state"], node["error"] = "not answering", str(answer)
        elif isinstance(answer, PeerLost):
            node["state"], node["error"] = "died", str(answer)
        elif isinstance(answer, BaseException):
            node["state"], node["error"] = "not answering", f"{type(answer).__name__}: {answer}"
        if last is not None:
            node.update(
                hostname=last.hostname,
                pid=last.pid,
                cpu_user=last.cpu_user,
                cpu_system=last.cpu_system,
                rss=last.rss,
                threads=last.threads,
                uptime=last.uptime,
            )
            fresh = last is answer
            if fresh:
                node["cpu_percent"] = self._cpu_rate(address or "", last)
            node["stale"] = not fresh
            state = node["state"]
            node["actors"] = [self._actor(actor, now, fresh, state) for actor in last.actors]
        return node

    def _cpu_rate(self, address: str, snap: ProcSnapshot) -> float | None:
        used = snap.cpu_user + snap.cpu_system
        t = time.monotonic()
        with self._lock:
            before = self._cpu.get(address)
            if before is None or t - before[0] >= RATE_WINDOW:
                rate = None if before is None else 100.0 * (used - before[1]) / (t - before[0])
                self._cpu[address] = (t, used, rate if rate is not None else -1.0)
                return rate
            return before[2] if before[2] >= 0 else None

    def _actor(self, actor: ActorState, now: float, fresh: bool, proc_state: str) -> Json:
        state = actor.state
        if proc_state in ("died", "stopped") and state in ("running", "starting"):
            state = "lost" if proc_state == "died" else "stopped"
        node: Json = {
            "ref": f"actor:{actor.actor_id}",
            "actor_id": actor.actor_id,
            "mesh": actor.mesh,
            "class_name": actor.class_name,
            "rank": actor.rank,
            "point": actor.point,
            "state": state,
            "error": actor.error,
            "handled": actor.handled,
            "queued": actor.queued,
            "current": actor.current,
            "busy_for": actor.busy_for,
            "idle_for": actor.idle_for,
            "last_active": now - actor.idle_for if actor.idle_for >= 0 else None,
            "thread": actor.thread,
            "rate": self._rate(actor) if fresh else 0.0,
        }
        return node

    def _rate(self, actor: ActorState) -> float:
        t = time.monotonic()
        with self._lock:
            before = self._handled.get(actor.actor_id)
            if before is None:
                self._handled[actor.actor_id] = (t, actor.handled, 0.0)
                return 0.0
            if t - before[0] < RATE_WINDOW:
                return before[2]
            rate = max(0.0, (actor.handled - before[1]) / (t - before[0]))
            self._handled[actor.actor_id] = (t, actor.handled, rate)
            return rate

    # -- references ---------------------------------------------------------------------

    def node(self, ref: str, snapshot: Json | None = None) -> Json:
        """The ``NodePayload`` of ``ref`` (upstream's shape: identity, properties,
        children, parent); raises ``NotFound``."""
        snap = snapshot if snapshot is not None else self.collect()
        if ref == ROOT:
            properties = {"kind": "root", "client": snap["client"], **snap["summary"]}
            children = [host["ref"] for host in snap["hosts"]]
            return _payload(ref, properties, children, None)
        for kind, item, parent in walk(snap):
            if item["ref"] == ref:
                key = {"host": "procs", "proc": "actors"}.get(kind)
                properties = {k: v for k, v in item.items() if k not in ("ref", key)}
                children = [child["ref"] for child in item.get(key or "", [])]
                return _payload(ref, {"kind": kind, **properties}, children, parent)
        raise NotFound(ref)

    def stacks(self, ref: str, source: str = "auto") -> Json:
        """The Python stacks of the proc ``ref`` (or of the proc an actor ref is on):
        ``source`` ``auto`` (py-spy when installed and the proc is on this machine, else
        its own dump), ``py-spy`` or ``self``. Raises ``NotFound``, ``NotAnswering``."""
        if source not in ("auto", "py-spy", "self"):
            raise ValueError(f"source must be auto, py-spy or self, not {source!r}")
        proc, actors = self._find_proc(ref)
        address = proc.address
        if address is None:
            raise NotAnswering(f"{ref} has not started")
        if proc.exited is not None:
            raise NotFound(f"{ref} {proc.exited}")
        result: Json = {"proc": f"proc:{address}", "address": address, "pid": proc.pid}
        program = pyspy_path()
        is_client = address == current_runtime().address
        note = ""
        if source != "self" and not is_client and self.is_local(proc):
            if program is None:
                note = "py-spy is not installed (pyspy_bin, PYSPY_BIN, PATH)"
            else:
                try:
                    threads = pyspy_dump(proc.pid, program)
                except RuntimeError as exc:
                    note = str(exc)
                else:
                    return {**result, "source": "py-spy", "threads": _mark(threads, actors)}
        elif source == "py-spy":
            note = "py-spy reads only procs of this machine, not the client itself"
        if source == "py-spy":
            raise NotAnswering(note)
        try:
            snap = inspect_proc(address, stacks=True, timeout=self.timeout).get()
        except TimeoutError as exc:
            raise NotAnswering(f"{exc}{'; ' + note if note else ''}") from None
        except PeerLost as exc:
            raise NotFound(str(exc)) from None
        threads = _mark(own_threads(snap.stacks), snap.actors)
        return {**result, "source": "self", "note": note, "threads": threads}

    def _find_proc(self, ref: str) -> tuple[SpawnedProc, list[ActorState]]:
        procs = self.procs()
        if ref.startswith("actor:"):
            actor_id = ref[len("actor:") :]
            with self._lock:
                for address, snap in self._last.items():
                    mine = [a for a in snap.actors if a.actor_id == actor_id]
                    if mine:
                        ref = f"proc:{address}"
                        break
                else:
                    _, _, address = actor_id.rpartition("]@")
                    ref = f"proc:{address}"
        for proc in procs:
            if proc.address is not None and ref in (f"proc:{proc.address}", proc.address):
                with self._lock:
                    last = self._last.get(proc.address)
                return proc, list(last.actors) if last is not None else []
        raise NotFound(ref)

    def is_local(self, proc: SpawnedProc) -> bool:
        """Whether ``proc`` runs on this machine (its pid means something here)."""
        address = proc.address or ""
        if address.startswith("unix:"):
            return True
        with self._lock:
            last = self._last.get(address)
        return last is not None and last.hostname == socket.gethostname()


def walk(snap: Json) -> Iterator[tuple[str, Json, str]]:
    """(kind, node, parent ref) of every host, proc and actor of a snapshot."""
    for host in snap["hosts"]:
        yield "host", host, ROOT
        for proc in host["procs"]:
            yield "proc", proc, host["ref"]
            for actor in proc["actors"]:
                yield "actor", actor, proc["ref"]


def _payload(ref: str, properties: Json, children: list[str], parent: str | None) -> Json:
    return {"identity": ref, "properties": properties, "children": children, "parent": parent}


def _mark(threads: list[Json], actors: list[ActorState]) -> list[Json]:
    """Each thread with the actors whose code it runs."""
    by_thread: dict[int, list[str]] = {}
    for actor in actors:
        by_thread.setdefault(actor.thread, []).append(actor.actor_id)
    return [{**thread, "actors": by_thread.get(thread["ident"], [])} for thread in threads]


def tree_text(snap: Json) -> str:
    """The snapshot as an indented text tree (``/v1/tree``)."""
    lines = [f"root  ({_summary(snap['summary'])})"]
    for host in snap["hosts"]:
        lines.append(f"  host {host['hostname']}  {host['address']}")
        for proc in host["procs"]:
            extra = f"  {proc['error']}" if proc["error"] else ""
            lines.append(
                f"    proc {proc['mesh']}[{proc['rank']}] pid {proc['pid']}  {proc['state']}{extra}"
            )
            for actor in proc["actors"]:
                doing = actor["current"] and f"  in {actor['current']} for {actor['busy_for']:.1f}s"
                error = f"  {last_line(actor['error'])}" if actor["error"] else ""
                lines.append(
                    f"      actor {actor['mesh']}{actor['point']} {actor['class_name']}  "
                    f"{actor['state']}  handled {actor['handled']}  queued {actor['queued']}"
                    f"{doing}{error}"
                )
    return "\n".join(lines) + "\n"


def last_line(text: str) -> str:
    """The last line that says something (a traceback's exception)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _summary(summary: Json) -> str:
    return ", ".join(f"{value} {key.replace('_', ' ')}" for key, value in summary.items())
