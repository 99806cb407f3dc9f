"""A module whose import waits for a gate (test_zygote.py): as torch's takes seconds, so that
requests can reach a successor zygote while it is still importing.

It waits until the file named by ``ZYGOTE_GATE`` exists (at most two minutes). It imports
monarch.actor, as monarch.tensor (a preload of ``auto``) does."""

import os
import time

import monarch.actor  # noqa: F401 - what a preload may import: no zygote may start there

GATE = os.environ["ZYGOTE_GATE"]
_deadline = time.monotonic() + 120
while not os.path.exists(GATE) and time.monotonic() < _deadline:
    time.sleep(0.01)
IMPORTED_BY = os.getpid()
