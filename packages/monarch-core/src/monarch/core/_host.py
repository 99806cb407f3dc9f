"""The host agent: starts and watches the procs of one machine.

On the controller's machine the agent is the controller's own runtime; on another
machine it is a ``monarch worker`` process. Either way it is the parent of the procs
it starts, so it is the first to see one exit, and it tells the proc mesh's owner.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Final

from monarch.transport import Address, Buffer

from ._messages import PortRef, ProcExited, SpawnFailed, SpawnProcs
from ._runtime import SECRET_ENV, Runtime

PARENT_ENV: Final = "MONARCH_PARENT_ADDRESS"
READY_ENV: Final = "MONARCH_READY_PORT"
"""``<proc address>#<port>``: where a new proc reports that it is listening."""
RANK_ENV: Final = "MONARCH_PROC_RANK"
LISTEN_ENV: Final = "MONARCH_LISTEN"

_children: list[subprocess.Popen[bytes]] = []


def child_listen_address(agent: str) -> str:
    """Procs listen like their agent: a network agent's procs must be reachable too."""
    address = Address.parse(agent)
    if address.scheme == "unix":
        return "unix://@"
    return str(Address(address.scheme, address.host, 0))


def handle_spawn_procs(
    runtime: Runtime, body: SpawnProcs, payload: Sequence[Buffer], sender: str
) -> None:
    env = {
        **os.environ,
        # What this process can import, its procs can: actor classes pickled by
        # reference (from the user's modules) must import the same way there.
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        SECRET_ENV: runtime.secret.hex(),
        PARENT_ENV: runtime.address,
        READY_ENV: f"{body.ready.proc}#{body.ready.port}",
        LISTEN_ENV: child_listen_address(runtime.address),
    }
    env.update(body.env)
    for rank in range(body.base_rank, body.base_rank + body.count):
        try:
            child = subprocess.Popen(
                [body.python or sys.executable, "-m", "monarch.core._proc"],
                env={**env, RANK_ENV: str(rank)},
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            runtime.send_to_port(body.events, SpawnFailed(rank, f"cannot start a proc: {exc}"))
            continue
        _children.append(child)
        _watch(runtime, child, rank, body.events)


def _watch(runtime: Runtime, child: subprocess.Popen[bytes], rank: int, events: PortRef) -> None:
    """Report the child's exit the moment it happens (a thread blocked in wait)."""

    def wait() -> None:
        code = child.wait()
        how = f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
        exited = ProcExited(rank, child.pid, how)
        if not runtime.loop.is_closed():
            runtime.send_to_port(events, exited)

    threading.Thread(target=wait, name=f"monarch-wait-{child.pid}", daemon=True).start()


def kill_children() -> None:
    """Kill the procs this process started that are still running: at exit, after
    ``shutdown_context`` has asked them to stop (see ``_proc_mesh``)."""
    for child in _children:
        if child.poll() is None:
            child.kill()
