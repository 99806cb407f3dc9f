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
import signal
import socket
import sys
import threading
from datetime import datetime

from ._errors import MeshFailure

log = logging.getLogger("monarch.actor")


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Leave the failure unhandled, as upstream's does (``sys.exit(1)``): the client ends."""
    sys.exit(1)


def call_fault_hook(failure: MeshFailure) -> None:
    """Call ``monarch.actor.unhandled_fault_hook`` as it is now (users reassign it).

    As upstream's: a hook that returns drops the failure; one that raises (the default
    exits) leaves it unhandled, which is reported on stderr and ends the client: a real
    SIGINT to the main thread, which interrupts a blocking wait there too, and ends the
    process with status 130 (an uncaught KeyboardInterrupt).
    """
    actor_module = sys.modules.get("monarch.actor")
    hook = getattr(actor_module, "unhandled_fault_hook", default_unhandled_fault_hook)
    try:
        hook(failure)
    except BaseException:
        sys.stderr.write(
            f"Unhandled monarch error on the root actor, hostname={socket.gethostname()}, "
            f"PID={os.getpid()} at time {datetime.now()}:\n{failure.report()}\n"
        )
        sys.stderr.flush()
        log.debug("unhandled_fault_hook raised", exc_info=True)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
