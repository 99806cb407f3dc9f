"""Which unauthenticated connections a listener keeps while they do their handshake.

A listener accepts every connection at once (one left in the kernel's backlog waits behind
whatever is ahead of it, so a flood of silent connections there would lock out the job's own
peers), and bounds what the unauthenticated ones can hold instead: at most
``max_pending_handshakes`` of them at a time. When a new one comes and the cap is reached,
the oldest connection of the source that holds the most is evicted: a flood from one address
evicts itself first, never a peer of another address, and a peer with the secret, whose
handshake takes milliseconds, is done long before a flood could push it out. (A listener
also closes one that sends nothing at ``hello_timeout``, one that trickles at
``handshake_timeout``.)

Each pending handshake is held as something to ``cancel()``: an anyio cancel scope for the
transport's listeners and the gateway, a socket to shut down for a server that gives each
connection a thread (monarch-rdma's TCP data plane). Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final, Protocol

log = logging.getLogger("monarch.transport")

SUMMARY_EVERY: Final = 10.0
"""Seconds between two warnings that count the connections a listener dropped unheard."""


class Pending(Protocol):
    """A connection in its handshake, as ``Admission`` evicts it."""

    def cancel(self) -> None: ...


class Admission:
    """The connections in their handshake, oldest first per source, and the count of those
    dropped before they authenticated (reported at most every ``SUMMARY_EVERY`` seconds:
    a flood must not flood the log too)."""

    def __init__(self, cap: int, where: object) -> None:
        self._cap = cap
        self._where = where
        self._lock = threading.Lock()
        self._by_source: dict[str, dict[Pending, None]] = {}
        self._source_of: dict[Pending, str] = {}
        self._dropped = 0
        self._reported = -SUMMARY_EVERY

    def admit(self, source: str, pending: Pending) -> None:
        """Keep ``pending`` (a new connection from ``source``), first evicting (cancelling)
        the oldest handshake of the most crowded source if the cap is reached."""
        evicted = None
        with self._lock:
            if len(self._source_of) >= self._cap:
                crowded = max(self._by_source.values(), key=len)
                evicted = next(iter(crowded))
                self._forget(evicted)
            self._by_source.setdefault(source, {})[pending] = None
            self._source_of[pending] = source
        if evicted is not None:
            evicted.cancel()

    def release(self, pending: Pending) -> None:
        """``pending``'s handshake ended (either way): its place is free."""
        with self._lock:
            self._forget(pending)

    def _forget(self, pending: Pending) -> None:
        source = self._source_of.pop(pending, None)
        if source is not None:
            scopes = self._by_source[source]
            del scopes[pending]
            if not scopes:
                del self._by_source[source]

    def dropped(self, why: str) -> None:
        """A connection closed before it authenticated (evicted, silent, too slow)."""
        with self._lock:
            self._dropped += 1
            now = time.monotonic()
            if now - self._reported < SUMMARY_EVERY:
                return
            count, self._dropped, self._reported = self._dropped, 0, now
        log.warning(
            "listener %s closed %d unauthenticated connection(s) since its last such "
            "report (the latest: %s)",
            self._where,
            count,
            why,
        )
