"""Supervision: failures travel up the ownership tree to whoever can handle them.

Every mesh is owned by the actor that spawned it (the client is the root). When an
actor of a mesh fails, or a proc under it dies, the owner gets a :class:`MeshFailure`
in ``__supervise__``: a truthy return handles it; anything else fails the owner too,
and the failure climbs to the owner's owner. At the root, nobody handled it, and it
goes to ``monarch.actor.unhandled_fault_hook`` (by default: report and end the client).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import replace
from datetime import datetime
from typing import Any, Final

from monarch.core._errors import MeshFailure

from ._client_end import end_client
from ._reports import FailureCause, failure_cause

log = logging.getLogger("monarch.actor")
records = logging.getLogger("monarch.supervision")

SUPERVISION_SCHEMA: Final = "monarch.supervision/1"
"""The version of ``failure_record``'s shape (monarch-core's README)."""


def failure_cause_of(failure: MeshFailure) -> FailureCause:
    """Where ``failure`` began (in a cascade: the first failure) and its category."""
    cause = failure_cause(failure.report())
    if not cause.actor:  # a report in no upstream form: the event names it
        cause = failure_cause(failure.event)
    if not cause.propagated and "did not handle a supervision event" in failure.event:
        cause = replace(cause, propagated=True)
    return cause


def failure_record(failure: MeshFailure) -> dict[str, Any]:
    """``failure`` as a structured record: what the system log's JSON lines hold."""
    cause = failure_cause_of(failure)
    return {
        "schema": SUPERVISION_SCHEMA,
        "mesh": failure.mesh_name,
        "ranks": failure.crashed_ranks,
        "category": cause.category,
        "kind": cause.kind,
        "root_cause": {"actor": cause.actor, "reason": cause.reason},
        "propagated": cause.propagated,
        "report": failure.report(),
    }


def log_failure(failure: MeshFailure) -> None:
    """The failure's structured record as one JSON line (the message of an info record of
    ``monarch.supervision``: the job's system log), for filtering by machine."""
    if records.isEnabledFor(logging.INFO):
        import json  # here: only a failure logged needs it, not every process at its start

        stamp = datetime.now().astimezone().isoformat()
        line = {"time": stamp, "pid": os.getpid(), "host": socket.gethostname()}
        records.info("%s", json.dumps(line | failure_record(failure)))


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Leave the failure unhandled, as upstream's does (``sys.exit(1)``): the client ends."""
    sys.exit(1)


def call_fault_hook(failure: MeshFailure, reported_elsewhere: bool = False) -> None:
    """Call ``monarch.actor.unhandled_fault_hook`` as it is now (users reassign it).

    As upstream's: a hook that returns drops the failure; one that raises (the default
    exits) leaves it unhandled, which is reported on stderr once and ends the client
    (``_client_end``: ``SystemExit(1)`` in the main thread, even in a blocking wait).
    ``reported_elsewhere``: the same death fails a mesh of the user's, whose failure
    reports it and ends the client (a proc mesh's internal ``logger-<uid>``).
    """
    actor_module = sys.modules.get("monarch.actor")
    hook = getattr(actor_module, "unhandled_fault_hook", default_unhandled_fault_hook)
    try:
        hook(failure)
    except BaseException:
        log.debug("unhandled_fault_hook raised", exc_info=True)
        if reported_elsewhere:
            return
        end_client(
            f"Unhandled monarch error on the root actor, hostname={socket.gethostname()}, "
            f"PID={os.getpid()} at time {datetime.now()}:\n{failure.report()}\n"
        )
