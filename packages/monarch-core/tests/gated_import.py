"""An actor whose module takes as long to import as a test wants, in procs told to wait.

In a process whose ``MONARCH_TEST_IMPORT_GATE`` names a FIFO, importing this module
blocks until a byte comes through it: a stand-in for an actor module that imports torch
(seconds; tens of them on a busy machine).
"""

from __future__ import annotations

import os

from monarch.actor import Actor, endpoint

_gate = os.environ.get("MONARCH_TEST_IMPORT_GATE")
if _gate:
    _fd = os.open(_gate, os.O_RDONLY)
    try:
        os.read(_fd, 1)
    finally:
        os.close(_fd)


class Gated(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def ping(self) -> str:
        return "imported"

    @endpoint
    def number(self) -> int:
        """How many calls of this endpoint came before this one: their order."""
        self.calls += 1
        return self.calls - 1
