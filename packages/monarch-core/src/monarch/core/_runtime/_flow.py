"""Flow control of what peers send: fair turns for the reader, backpressure for senders.

A receiver that reads and decodes everything its peers send before anything else runs
starves its own consumers under a flood, and its memory grows as fast as the senders
send. So:

- **Turns.** A connection delivers at most ``TURN_MESSAGES`` messages (``TURN_BYTES``)
  per loop turn, then stops reading until its next turn: the loop runs what waits (the
  endpoint awaiting a ``recv()``), and other connections get theirs.
- **Lanes.** Values for a port opened with ``Channel`` (an *inbox*: whoever consumes it
  may be slower than its senders) go to a peer on a connection of their own, its *lane*;
  everything else (calls, replies, control, supervision) on the main one, never held up
  by a full inbox. A lane that has delivered more than ``HIGH_WATER`` bytes its inboxes
  have not consumed is not read until they are down to ``LOW_WATER``: its frames wait in
  the kernel's buffers, undecoded, and then in the sender's.
- **Senders slow down.** A thread whose lane to a peer holds more than ``SEND_HIGH``
  bytes waits until it is below ``SEND_LOW``, ``STALL`` seconds at most: bounded, so
  two processes flooding each other (each waiting for the other to read) only slow
  down, never deadlock.
- **A waiting receiver is never starved by a held lane.** While some ``recv()`` waits
  on an empty inbox, its message may be behind a lane held for another inbox: held
  lanes are read on, up to ``HARD_LIMIT`` each (the bound on a receiver's memory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

TURN_MESSAGES: Final = 256
"""Messages one connection delivers per loop turn (a full ``Batch`` frame is one turn)."""
TURN_BYTES: Final = 1024 * 1024
"""Bytes one connection delivers per loop turn."""
HIGH_WATER: Final = 16 * 1024 * 1024
"""Bytes a lane may have delivered unconsumed before it is held (not read)."""
LOW_WATER: Final = 4 * 1024 * 1024
"""A held lane is read again once its unconsumed bytes are down to this."""
HARD_LIMIT: Final = 128 * 1024 * 1024
"""Unconsumed bytes past which a lane is held even for a waiting receiver."""
MESSAGE_COST: Final = 512
"""Bytes counted per message beyond its payload: the objects that hold it."""
SEND_HIGH: Final = 32 * 1024 * 1024
"""Bytes queued or lent to a peer's lane past which a sending thread waits."""
SEND_LOW: Final = 8 * 1024 * 1024
"""What a waiting sender waits for the lane's backlog to come down to."""
STALL: Final = 0.05
"""The longest a sender waits per message (seconds)."""


class Flow:
    """What one lane has delivered to inboxes and they have not consumed yet (bytes).

    ``hold`` when a value is queued in an inbox, ``release`` when it is taken out (on
    the loop). Once ``held`` goes past the high-water mark the lane's reader calls
    ``hold_up``; ``resume`` is called once it is down to the low-water mark.
    """

    __slots__ = ("held", "held_up", "resume", "wanted")

    def __init__(self, resume: Callable[[], None]) -> None:
        self.held = 0
        self.held_up = False
        """The lane is not being read (set by its reader, cleared by ``resume``)."""
        self.resume = resume
        self.wanted = 0
        """Receivers waiting on an empty inbox this lane has fed before."""

    def hold(self, size: int) -> None:
        self.held += size

    def release(self, size: int) -> None:
        self.held -= size
        if self.held_up and self.held <= LOW_WATER:
            self.held_up = False
            self.resume()

    def over(self, wanted: bool) -> bool:
        """Whether the lane must be held now (``wanted``: a receiver may wait on it)."""
        return self.held > (HARD_LIMIT if wanted else HIGH_WATER)
