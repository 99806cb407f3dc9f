"""Supervision: failures travel up the ownership tree to whoever can handle them.

Every mesh is owned by the actor that spawned it (the client is the root). When an
actor of a mesh fails, or a proc under it dies, the owner gets a :class:`MeshFailure`
in ``__supervise__``: a truthy return handles it; anything else fails the owner too,
and the failure climbs to the owner's owner. At the root, nobody handled it, and it
goes to ``monarch.actor.unhandled_fault_hook`` (by default: report and end the client).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from ._errors import MeshFailure

log = logging.getLogger("monarch.actor")


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Report the failure and end the client, as upstream does (exit code 130)."""
    print(
        f"Unhandled monarch error on the root actor, the client will exit: {failure.report()}",
        file=sys.stderr,
        flush=True,
    )
    # A real SIGINT to the main thread: it interrupts a blocking wait there too, and an
    # uncaught KeyboardInterrupt ends the process with status 130.
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def call_fault_hook(failure: MeshFailure) -> None:
    """Call ``monarch.actor.unhandled_fault_hook`` as it is now (users reassign it)."""
    actor_module = sys.modules.get("monarch.actor")
    hook = getattr(actor_module, "unhandled_fault_hook", default_unhandled_fault_hook)
    try:
        hook(failure)
    except Exception:
        log.exception("unhandled_fault_hook raised while handling %s", failure)
