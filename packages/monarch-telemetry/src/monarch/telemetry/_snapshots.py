"""Periodic snapshots of the job's procs and actors into upstream's snapshot tables.

Every ``snapshot_interval_secs`` a thread of the client asks every live proc it spawned
(and the client's own) what it hosts, all at once, through the core's introspection
(``snapshot_procs``, ``spawned_procs``: what monarch-admin shows), and writes one snapshot:
``snapshots``, ``nodes`` (root, hosts, procs, actors), ``children`` (root > host > proc >
actor), the kind tables and ``actor_failures`` for the actors failed at that time. A proc
that does not answer within ``inspect_proc``'s timeout is an ``error`` node with a
``resolution_errors`` row, as upstream's unresolved nodes: it delays a snapshot by that
timeout at most. A proc that has ended is listed with the actors lost with it (the
supervision hook's report of them, ``remember_lost``).

Node ids are monarch-admin's references: ``root``, ``host:ADDRESS``, ``proc:ADDRESS``,
``actor:ACTOR_ID`` (``ACTOR_ID`` is ``MESH_ID[RANK]@ADDRESS``; ``MESH_ID[RANK]`` is the
``full_name`` of the ``actors`` table).
"""

from __future__ import annotations

import getpass
import os
import threading
import uuid
from collections.abc import Sequence
from typing import Any, Final

from monarch.core import (
    ActorState,
    ProcSnapshot,
    SpawnedProc,
    running_runtime,
    snapshot_procs,
    spawned_procs,
)

from ._observed import sample_rows
from ._sql import Row, TelemetryStore, now_us, split_actor_id, stop_at_exit

ANSWER_TIMEOUT: Final = 2.0
"""Seconds a snapshot waits for the procs' answers, all together."""
CLIENT_MESH: Final = "client"
"""The client's own proc: the name it is listed under (monarch-admin's)."""

_lost_lock = threading.Lock()
_lost: dict[str, list[tuple[str, str, int]]] = {}
"""Actors lost with their proc, by its address: (actor id, report, when)."""


def remember_lost(actor_ids: Sequence[str], report: str) -> None:
    """Actors ``actor_ids`` (``MESH_ID[RANK]@ADDRESS``) were lost with their proc."""
    stamp = now_us()
    with _lost_lock:
        for actor in actor_ids:
            _lost.setdefault(split_actor_id(actor)[1], []).append((actor, report, stamp))


def _lost_at(address: str) -> list[tuple[str, str, int]]:
    with _lost_lock:
        return list(_lost.get(address, ()))


def _forget_lost(keep: set[str]) -> None:
    """Let go of the procs ``spawned_procs`` no longer lists."""
    with _lost_lock:
        for address in [a for a in _lost if a not in keep]:
            del _lost[address]


class Snapshots:
    """The thread that takes a snapshot every ``every`` seconds into ``store``."""

    def __init__(self, store: TelemetryStore, every: float) -> None:
        self.store = store
        self.every = every
        self.started = now_us()
        self.user = getpass.getuser()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monarch-snapshots", daemon=True)
        self._thread.start()
        stop_at_exit(self._thread, self.stop)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.take()
            except Exception:  # noqa: BLE001 - the next snapshot may succeed
                if running_runtime() is None:
                    return  # the client is stopping
            self._stop.wait(self.every)

    def take(self) -> str | None:
        """One snapshot (its id), or None when the client's runtime is not running."""
        runtime = running_runtime()
        if runtime is None:
            return None
        stamp = now_us()  # the snapshot's time: when its procs were asked, not written
        me = SpawnedProc(CLIENT_MESH, 0, runtime.address, runtime.address, os.getpid(), None)
        procs = [me, *(p for p in spawned_procs() if p.address is not None)]
        answers = self._ask(procs)
        _forget_lost({p.address for p in procs if p.address})
        if self._stop.is_set():
            return None  # the process ends: DuckDB is not to be entered again
        return self._write(stamp, procs, answers)

    def _ask(self, procs: list[SpawnedProc]) -> dict[str, ProcSnapshot | BaseException]:
        """Every live proc's answer, or why there is none: all asked at once, waited for
        ``ANSWER_TIMEOUT`` (and a second for the replies in flight) at most."""
        live = (p.address for p in procs if p.address and p.exited is None)
        return snapshot_procs(live, ANSWER_TIMEOUT)

    def _write(
        self,
        stamp: int,
        procs: list[SpawnedProc],
        answers: dict[str, ProcSnapshot | BaseException],
    ) -> str:
        snap = str(uuid.uuid4())
        known = {  # what the tables say of each actor: when created, its class, if system
            row["k"]: (row["t"], row["c"], bool(row["s"]))
            for row in self.store.query(
                "SELECT a.full_name AS k, a.timestamp_us AS t, m.class AS c, a.is_system AS s "
                "FROM actors a LEFT JOIN meshes m ON m.id = a.mesh_id"
            )["rows"]
        }
        failed_at = {
            row["k"]: row["t"]
            for row in self.store.query(
                "SELECT a.full_name AS k, min(e.timestamp_us) AS t FROM actor_status_events e "
                "JOIN actors a ON a.id = e.actor_id WHERE e.new_status = 'Failed' GROUP BY 1"
            )["rows"]
        }
        rows: list[Row] = [("snapshots", (snap, stamp)), ("nodes", (snap, "root", "root", stamp))]
        hosts: dict[str, list[SpawnedProc]] = {}
        for proc in procs:
            hosts.setdefault(proc.host, []).append(proc)
        rows.append(("root_nodes", (snap, "root", len(hosts), self.started, self.user)))
        for h, (host, on_host) in enumerate(hosts.items()):
            host_id = f"host:{host}"
            rows += [
                ("nodes", (snap, host_id, "host", stamp)),
                ("host_nodes", (snap, host_id, host, len(on_host))),
                ("children", (snap, "root", host_id, h, False, False)),
            ]
            for p, proc in enumerate(on_host):
                proc_id = f"proc:{proc.address}"
                rows.append(("children", (snap, host_id, proc_id, p, False, False)))
                answer = answers.get(proc.address or "")
                if isinstance(answer, ProcSnapshot):
                    rows += self._live(snap, stamp, proc, answer, known, failed_at)
                    rows += sample_rows(stamp, answer.address, answer)
                elif answer is not None:
                    code = "timeout" if isinstance(answer, TimeoutError) else "unreachable"
                    rows += [
                        ("nodes", (snap, proc_id, "error", stamp)),
                        ("resolution_errors", (snap, proc_id, code, str(answer))),
                    ]
                else:
                    rows += self._ended(snap, stamp, proc, known)
        self.store.add(rows)
        return snap

    def _live(
        self,
        snap: str,
        stamp: int,
        proc: SpawnedProc,
        answer: ProcSnapshot,
        known: dict[str, tuple[int, str, bool]],
        failed_at: dict[str, int],
    ) -> list[Row]:
        proc_id = f"proc:{proc.address}"
        actors: list[ActorState] = answer.actors
        failed = sum(a.state == "failed" for a in actors)
        live = sum(a.state != "stopped" for a in actors)
        rows: list[Row] = [
            ("nodes", (snap, proc_id, "proc", stamp)),
            ("proc_nodes", (snap, proc_id, proc.mesh, live, False, failed)),
        ]
        for i, actor in enumerate(actors):
            actor_id = f"actor:{actor.actor_id}"
            name = split_actor_id(actor.actor_id)[0]
            created, _, system = known.get(name, (None, "", False))
            status = f"{actor.state}:{actor.error}" if actor.error else actor.state
            rows += [
                ("nodes", (snap, actor_id, "actor", stamp)),
                ("children", (snap, proc_id, actor_id, i, system, actor.state == "stopped")),
                (
                    "actor_nodes",
                    (
                        snap,
                        actor_id,
                        status,
                        actor.class_name,
                        actor.handled,
                        created,
                        actor.current or None,
                        actor.queued,
                        system,
                    ),
                ),
            ]
            if actor.state == "failed":
                values = (snap, actor_id, actor.error, failed_at.get(name))
                rows.append(("actor_failures", values))
        return rows

    def _ended(
        self, snap: str, stamp: int, proc: SpawnedProc, known: dict[str, tuple[int, str, bool]]
    ) -> list[Row]:
        """A proc that has ended, with the actors lost with it."""
        proc_id = f"proc:{proc.address}"
        lost = _lost_at(proc.address or "")
        clean = (proc.exited or "").endswith("exited with code 0")
        rows: list[Row] = [
            ("nodes", (snap, proc_id, "proc", stamp)),
            ("proc_nodes", (snap, proc_id, proc.mesh, 0, not clean, len(lost))),
        ]
        for i, (actor, report, when) in enumerate(lost):
            actor_id = f"actor:{actor}"
            created, cls, system = known.get(split_actor_id(actor)[0], (None, "", False))
            values: tuple[Any, ...] = (snap, actor_id, f"failed:{report}", cls, None, created)
            rows += [
                ("nodes", (snap, actor_id, "actor", stamp)),
                ("children", (snap, proc_id, actor_id, i, system, False)),
                ("actor_nodes", (*values, None, 0, system)),
                ("actor_failures", (snap, actor_id, report, when)),
            ]
        return rows


_running: list[Snapshots] = []


def start_snapshots(store: TelemetryStore) -> None:
    """Snapshot the job into ``store`` every ``snapshot_interval_secs`` of its
    configuration (once per process; 0: never)."""
    every = store.config.snapshot_interval_secs
    if every and not _running:
        _running.append(Snapshots(store, every))
