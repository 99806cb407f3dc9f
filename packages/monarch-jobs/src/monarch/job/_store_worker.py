"""The worker a ``StoreJob`` rank starts: ``monarch worker`` that ends with that rank.

``python -m monarch.job._store_worker PARENT --listen ADDRESS``: it first asks the kernel
for a SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux), then checks that
its parent is still ``PARENT`` (it may have died already), then serves as ``monarch
worker`` (whose SIGTERM stops its procs and exits). A worker thus never outlives the
torchrun job whose allocation it runs in, however that job ends (SIGKILL included).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Final

from monarch.core.worker import main as worker_main

PR_SET_PDEATHSIG: Final = 1


def main(argv: list[str]) -> int:
    parent = int(argv[0])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        print(f"monarch worker: prctl: {os.strerror(error)}", file=sys.stderr)
        return 2
    if os.getppid() != parent:
        return 0  # its rank ended before it could ask
    return worker_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
