"""Helpers a process makes once, when first needed: a pool of threads, a thread.

A forked child inherits such an object but not its threads, so it makes its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """``make()``'s result, made by the first ``get()`` of this process (any thread)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._made: T | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def get(self) -> T:
        made = self._made
        if made is None:
            with self._lock:
                made = self._made
                if made is None:
                    made = self._made = self._make()
        return made

    def _forget(self) -> None:
        self._made = None
        self._lock = threading.Lock()  # another thread may have held it at the fork
