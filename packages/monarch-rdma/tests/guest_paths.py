"""What of this machine the soft-RoCE VM's guest cannot see (rxevm/build-initramfs.sh).

The guest mounts this machine's root file system, then tmpfs file systems of its own over
``/tmp`` and ``/run``: an interpreter (or its packages) under either is missing there, and
the guest's scripts would end with status 127. test_verbs_vm.py skips, saying so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import PurePosixPath
from typing import Final

GUEST_OWN: Final = ("/tmp", "/run")
"""Directories the guest mounts its own (empty) file systems over."""

_ASK = (
    "import json, os, sys, sysconfig; p = sysconfig.get_paths(); print(json.dumps(["
    "sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix,"
    " p['stdlib'], p['purelib'], p['platlib']]))"
)


def hidden_from_guest(python: str) -> list[str]:
    """The paths ``python`` runs from (itself, its prefix, its libraries) that the guest
    cannot see."""
    said = subprocess.run([python, "-c", _ASK], capture_output=True, text=True, check=True)
    paths: list[str] = json.loads(said.stdout)
    hidden = []
    for path in dict.fromkeys(paths):
        real = PurePosixPath(path)
        if any(real.is_relative_to(own) for own in GUEST_OWN):
            hidden.append(path)
    return hidden
