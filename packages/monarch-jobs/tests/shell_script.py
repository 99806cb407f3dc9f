"""Opens ``monarch.job.shell`` on this host from a script, as a user would:

    python shell_script.py [--workdir DIR] [--env NAME=VALUE]

Exits with the remote shell's status; an error is one line on stderr and status 3.
"""

from __future__ import annotations

import argparse
import sys

from monarch.actor import this_host
from monarch.job import shell

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir")
    parser.add_argument("--env", action="append", default=[])
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    try:
        status = shell(this_host(), env=env or None, workdir=args.workdir)
    except Exception as exc:  # noqa: BLE001 - reported as a user would see it
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)
    sys.exit(status)
