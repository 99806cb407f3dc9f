"""Which unauthenticated connections a listener keeps while they do their handshake.

A listener accepts every connection at once (one left in the kernel's backlog waits behind
whatever is ahead of it, so a flood of silent connections there would lock out the job's own
peers), and bounds what the unauthenticated ones can hold instead: at most
``max_pending_handshakes`` of them at a time. When a new one comes and the cap is reached,
the oldest connection of the source that holds the most is closed: a flood from one address
evicts itself first, never a peer of another address, and a peer with the secret, whose
handshake takes milliseconds, is done long before a flood could push it out. A connection
that sends nothing is closed at ``hello_timeout``, one that trickles at ``handshake_timeout``.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import anyio

log = logging.getLogger("monarch.transport")

SUMMARY_EVERY: Final = 10.0
"""Seconds between two warnings that count the connections a listener dropped unheard."""


class Admission:
    """The connections in their handshake, oldest first per source, and the count of those
    dropped before they authenticated (reported at most every ``SUMMARY_EVERY`` seconds:
    a flood must not flood the log too)."""

    def __init__(self, cap: int, where: object) -> None:
        self._cap = cap
        self._where = where
        self._by_source: dict[str, dict[anyio.CancelScope, None]] = {}
        self._source_of: dict[anyio.CancelScope, str] = {}
        self._dropped = 0
        self._reported = -SUMMARY_EVERY

    def admit(self, source: str) -> anyio.CancelScope:
        """A scope for a new connection's handshake, evicting (cancelling) the oldest
        handshake of the most crowded source if the cap is reached."""
        if len(self._source_of) >= self._cap:
            crowded = max(self._by_source.values(), key=len)
            oldest = next(iter(crowded))
            oldest.cancel()
            self.release(oldest)
        scope = anyio.CancelScope()
        self._by_source.setdefault(source, {})[scope] = None
        self._source_of[scope] = source
        return scope

    def release(self, scope: anyio.CancelScope) -> None:
        """``scope``'s handshake ended (either way): its place is free."""
        source = self._source_of.pop(scope, None)
        if source is not None:
            scopes = self._by_source[source]
            del scopes[scope]
            if not scopes:
                del self._by_source[source]

    def dropped(self, why: str) -> None:
        """A connection closed before it authenticated (evicted, silent, too slow)."""
        self._dropped += 1
        now = time.monotonic()
        if now - self._reported >= SUMMARY_EVERY:
            log.warning(
                "listener %s closed %d unauthenticated connection(s) since its last such "
                "report (the latest: %s)",
                self._where,
                self._dropped,
                why,
            )
            self._reported, self._dropped = now, 0
