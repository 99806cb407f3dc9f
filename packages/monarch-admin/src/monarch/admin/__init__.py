"""monarch.admin: a live job's hosts, procs, actors and stacks, for people.

``start_admin()`` in the client starts an HTTP server (``AdminServer``, loopback by
default, token-protected) that asks the job's procs what they run whenever it is asked
(``monarch.core.inspect_proc``); ``monarch top`` shows it in a terminal, and its ``/``
is a dashboard page. Jobs start one with ``job.enable_admin(MeshAdminConfig())``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._server import AdminServer, Query, parse_addr
from ._view import JobView


@dataclass
class MeshAdminConfig:
    """Upstream's: start an admin server when the job's ``state()`` is taken.

    ``admin_addr`` ``None`` is the ``mesh_admin_addr`` key (ours: loopback, port 1729,
    another free port when taken)."""

    admin_addr: str | None = None


def start_admin(
    addr: str | None = None,
    token: str | None = None,
    *,
    timeout: float = 2.0,
    query: Query | None = None,
    quiet: bool = False,
    job: str | None = None,
) -> AdminServer:
    """Start an admin server over this client's job and say where (stderr) unless
    ``quiet``; ``close()`` it, or let the process end. ``query``: SQL for ``/v1/query``
    and the dashboard (default: the tables of ``enable_telemetry()``); ``job``: the saved
    job served (see ``AdminServer``)."""
    server = AdminServer(addr, token, timeout=timeout, query=query, job=job)
    if not quiet:
        server.announce()
    return server


__all__ = ["AdminServer", "JobView", "MeshAdminConfig", "parse_addr", "start_admin"]
