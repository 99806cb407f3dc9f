"""The actor of test_gather_tree.py, in a module of its own: 64 procs import it, and the
test module's imports (pytest, hypothesis) would cost each of them a second or more."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from monarch.actor import Actor, current_rank, endpoint


class Member(Actor):
    def __init__(self) -> None:
        self.me = current_rank().rank
        """Its rank in the whole mesh (a call to a slice numbers its ranks from 0)."""

    @endpoint
    def rank(self) -> int:
        return self.me

    @endpoint
    def value(self, modulus: int) -> tuple[int, str]:
        """Equal for ranks equal modulo ``modulus`` (relays keep an equal value once)."""
        return self.me % modulus, "x" * (self.me % modulus)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def fail_on(self, rank: int) -> int:
        if current_rank().rank == rank:
            raise ValueError(f"rank {rank} says no")
        return current_rank().rank

    @endpoint
    def hang_on(self, rank: int, mark: str) -> int:
        """Rank ``rank`` says it is in the call (a file), then waits to be killed."""
        if current_rank().rank == rank:
            Path(mark).write_text("in")
            threading.Event().wait(120)
        return current_rank().rank
