"""Entry point of a worker proc: ``python -m monarch.core._proc``, started by a host agent.

Reads its parent's address and the job secret from its environment (never its
command line), listens, reports where to whoever asked for it, and serves until told
to stop or until its parent dies (PR_SET_PDEATHSIG, plus the parent connection
closing), so no proc outlives its job.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import signal
import sys
import threading

from ._future import set_loop_thread
from ._host import LISTEN_ENV, PARENT_ENV, RANK_ENV, READY_ENV
from ._messages import PortRef, ProcReady
from ._runtime import Runtime, install_runtime, job_secret, new_event_loop


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


async def serve() -> None:
    parent = os.environ[PARENT_ENV]
    ready_proc, _, ready_port = os.environ[READY_ENV].rpartition("#")
    runtime = Runtime(asyncio.get_running_loop(), job_secret())
    await runtime.start(os.environ.get(LISTEN_ENV, "unix://@"))
    install_runtime(runtime)
    set_loop_thread(threading.current_thread())
    from ._services import install

    install(runtime)
    # What booting made (modules, the runtime) lives as long as the process: out of the
    # collector's sight, a full collection walks only what actors made since, not the
    # whole heap (under a stream of messages those cost a third of a proc's time).
    gc.freeze()
    runtime.watch_peer(parent, lambda address, exc: runtime.stopped.set())
    ready = ProcReady(runtime.address, os.getpid(), int(os.environ[RANK_ENV]))
    runtime.send_to_port(PortRef(ready_proc, int(ready_port)), ready)
    await runtime.stopped.wait()
    await runtime.aclose()


def main() -> None:
    die_with_parent()
    if os.getppid() == 1:
        sys.exit("monarch proc: parent already gone")
    loop = new_event_loop()
    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()


if __name__ == "__main__":
    main()
