"""``monarch worker`` as a local job starts it: without the ``monarch`` command's discovery.

``monarch worker`` (``monarch.core._cli``) first reads every installed distribution's entry
points and imports every ``monarch.commands`` plug-in, which a worker never needs: a tenth
of a worker's start (about 30-40 ms of 0.25 s here). Where ``ProcessJob`` cannot fork its
workers (``_fork``), it runs this module instead (``python -m monarch.job._worker --listen
...``): the same subcommand, registered straight from monarch-core, with the same
arguments and behaviour. Remote backends (SSH, Slurm) keep the ``monarch.core._cli``
spelling: their hosts need only monarch-core.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from monarch.core._worker import register


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monarch")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["worker", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
