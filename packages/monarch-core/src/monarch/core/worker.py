"""``python -m monarch.core.worker --listen ADDR``: ``monarch worker`` for launchers.

The same subcommand, arguments and behaviour as ``monarch worker``, registered straight
from monarch-core, without the ``monarch`` command's discovery of plug-ins: what job
backends (local, SSH, Slurm) start on each host, which needs only monarch-core installed.
``main(argv)`` serves in the calling process (a launcher that forks its workers).
"""

import sys

from ._host._worker import worker_main as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
