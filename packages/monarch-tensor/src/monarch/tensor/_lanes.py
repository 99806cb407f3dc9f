"""A worker's streams: each runs its commands in order on a thread of its own, so the work
of one stream overlaps another's (upstream's streams), and the worker's actor thread stays
free to take the next batch or a fetch while they run.

A stream's commands wait for another stream's only where the controller's program needs
it (``TensorWorker`` says where, by tensor id): ``Lane.push`` takes, with a segment of
commands, the other lanes and how many segments of each must be done before it starts,
as a CUDA stream waits on an event recorded on another.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._commands import Command

logger = logging.getLogger(__name__)

Needs = Sequence[tuple["Lane", int]]
"""Other lanes, and how many segments each must have done first."""


class Lane:
    """One stream of one worker: segments of commands, run in order by its thread."""

    def __init__(
        self,
        sid: int,
        execute: Callable[[list[Command]], None],
        changed: threading.Condition,
    ) -> None:
        self.sid = sid
        self.pushed = 0
        """Segments pushed (read and written on the worker's actor thread, under ``changed``)."""
        self.done = 0
        """Segments run."""
        self._segments: deque[tuple[contextvars.Context, list[Command], Needs]] = deque()
        self._execute = execute
        self._changed = changed
        thread = threading.Thread(target=self._loop, name=f"tensor-stream-{sid}", daemon=True)
        thread.start()

    def push(self, commands: list[Command], needs: Needs = ()) -> None:
        """Queue ``commands``, to run once ``needs`` are met, in the caller's context (the
        run message's: ``current_rank()`` there is the worker's)."""
        context = contextvars.copy_context()
        with self._changed:
            self._segments.append((context, commands, needs))
            self.pushed += 1
            self._changed.notify_all()

    def _loop(self) -> None:
        changed = self._changed
        while True:
            with changed:
                changed.wait_for(lambda: bool(self._segments))
                context, commands, needs = self._segments.popleft()
                changed.wait_for(functools.partial(_met, needs))
            try:
                context.run(self._execute, commands)
            except BaseException:  # SystemExit from a user's function, say:
                # the segment's other commands are lost (their ids are missing at a fetch,
                # which says so), the stream goes on.
                logger.exception("stream %d of the tensor worker lost a segment", self.sid)
            finally:
                with changed:
                    self.done += 1
                    changed.notify_all()


def settled(changed: threading.Condition, needs: Needs, timeout: float | None = None) -> bool:
    """Wait until every lane of ``needs`` has done its count of segments."""
    with changed:
        return changed.wait_for(functools.partial(_met, needs), timeout)


def _met(needs: Needs) -> bool:
    return all(lane.done >= count for lane, count in needs)
