"""A process's limit of open files, raised to what the system allows.

Each proc is a connection at its host agent (and two pipes more when its output is read),
and a spawner holds a connection to each proc it calls directly: a 1,024-proc mesh on one
machine needs more than the 1,024 open files that most desktops allow a process by default
(its soft limit), and failed to spawn there. So a Monarch process raises its soft limit to
its hard limit (what the user may raise it to without privileges) as its runtime starts;
procs inherit it.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Final

resource: ModuleType | None
try:  # imported with the core (a zygote's forks find it loaded), not at each proc's start
    import resource
except ImportError:  # Windows
    resource = None

ENOUGH_WITHOUT_LIMIT: Final = 1 << 20
"""What a process asks for where its hard limit is "unlimited" (macOS; Linux caps it)."""


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit; returns the soft
    limit in effect (-1 where there is none to raise: no ``resource`` module)."""
    if resource is None:
        return -1
    limits: tuple[int, int] = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = limits
    wanted = ENOUGH_WITHOUT_LIMIT if hard == resource.RLIM_INFINITY else hard
    for target in (wanted, 10240):  # 10240: macOS's OPEN_MAX, where the first is refused
        if soft == resource.RLIM_INFINITY or soft >= target:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        logging.getLogger("monarch.core").debug("open files limit raised %d -> %d", soft, target)
        return target
    return soft
