"""The exceptions of monarch.transport, one hierarchy under :class:`TransportError`."""

from __future__ import annotations

import copy
from typing import TypeVar

_E = TypeVar("_E", bound=BaseException)


class TransportError(Exception):
    """Base class of every error raised by monarch.transport."""


class UnknownTransportError(TransportError, LookupError):
    """No installed transport handles an address scheme."""


class AddressError(TransportError, ValueError):
    """An address URL could not be parsed or does not suit its transport."""


class ConnectionClosed(TransportError):
    """The connection is closed: the peer went away or it was closed locally."""


class ProtocolError(TransportError):
    """The peer broke the wire protocol (malformed frame); the connection is closed."""


class FrameAuthenticationError(ProtocolError):
    """A frame failed its MAC under the session key: forged, replayed, reordered or
    corrupted on the way (by anyone but the authenticated peer); the connection is closed."""


class FrameTooLarge(ProtocolError, ValueError):
    """A frame exceeds ``max_frame_size`` or ``max_parts``.

    Raised to a sender before anything is written (the connection stays usable),
    and to a receiver when a peer announces such a frame (the connection is closed).
    """


class HandshakeError(TransportError):
    """The connection handshake failed; no frame was exchanged."""


class AuthenticationError(HandshakeError):
    """The peer could not prove knowledge of the shared secret (or we could not)."""


class ProtocolVersionError(HandshakeError):
    """The two sides share no protocol version."""


class ConnectError(TransportError):
    """No connection could be opened to the address (refused, unreachable, timed out)."""


def detached(exc: _E) -> _E:
    """A copy of ``exc`` without traceback, cause or context, to keep or to raise again.

    An exception that was raised holds every frame it passed through, and what their
    locals refer to (a connection, a half-read frame's buffer): kept by the connection,
    it makes a reference cycle that only a full garbage collection frees.
    """
    try:
        return copy.copy(exc)
    except Exception:  # noqa: BLE001 - a type that cannot be rebuilt from its args
        return exc.with_traceback(None)
