"""Transports by scheme: this wheel's own by name, others discovered lazily from the
``monarch.transports`` entry points."""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Final

from ._abc import Connection, Listener, Transport, TransportOptions
from ._address import Address
from ._errors import UnknownTransportError
from ._plugins import MissingPlugin, plugin_group

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

ENTRY_POINT_GROUP: Final = "monarch.transports"
_PROVIDERS: Final = {"ibverbs": "monarch-rdma"}
"""Schemes that other wheels provide, named in the error when they are missing."""
BUILTIN: Final = {
    "unix": "monarch.transport._unix:UnixTransport",
    "tcp": "monarch.transport._tcp:TcpTransport",
    "tls": "monarch.transport._tls:TlsTransport",
    "gateway": "monarch.transport._gateway:GatewayTransport",
}
"""This wheel's transports (also its entry points, for listings): loaded without reading
the entry points, which costs a process ~25 ms (importing ``importlib.metadata`` and
reading every installed distribution's metadata), on every proc's and client's start."""

_lock = threading.Lock()
_loaded: dict[str, Transport] = {}


def _discover() -> dict[str, EntryPoint]:
    return plugin_group(ENTRY_POINT_GROUP, _PROVIDERS).entries()


def available_transports() -> dict[str, str]:
    """Installed schemes, each with the distribution that provides it."""
    found = {
        name: (ep.dist.name if ep.dist is not None else "?") for name, ep in _discover().items()
    }
    for name, transport in _loaded.items():
        found.setdefault(name, type(transport).__module__)
    return dict(sorted(found.items()))


def get_transport(scheme: str) -> Transport:
    """The transport for ``scheme``, loading it (this wheel's, else an entry point) on
    first use."""
    transport = _loaded.get(scheme)
    if transport is not None:
        return transport
    with _lock:
        if scheme not in _loaded:
            _loaded[scheme] = _load(scheme)()
        return _loaded[scheme]


def _load(scheme: str) -> type[Transport]:
    if scheme in BUILTIN:
        module, _, name = BUILTIN[scheme].partition(":")
        cls: type[Transport] = getattr(importlib.import_module(module), name)
        return cls
    try:
        ep = plugin_group(ENTRY_POINT_GROUP, _PROVIDERS).entry(scheme)
    except MissingPlugin:
        installed = ", ".join(f"{n} ({d})" for n, d in available_transports().items())
        provider = _PROVIDERS.get(scheme)
        hint = (
            f"; install the {provider} wheel to get it (pip install {provider})" if provider else ""
        )
        raise UnknownTransportError(
            f"no transport for {scheme!r}{hint}; installed: {installed or 'none'}"
        ) from None
    loaded: type[Transport] = ep.load()
    return loaded


def register_transport(transport: Transport) -> None:
    """Register a transport object under its scheme, beside the entry points."""
    with _lock:
        _loaded[transport.scheme] = transport


async def open_connection(
    address: str | Address, *, secret: bytes, **options: object
) -> Connection:
    """Connect to a listener and authenticate with ``secret``.

    ``options`` are :class:`TransportOptions` fields (``max_frame_size``, ``ssl_context``...).
    """
    parsed = Address.parse(address)
    return await get_transport(parsed.scheme).connect(
        parsed,
        TransportOptions(secret=secret, **options),  # type: ignore[arg-type]
    )


async def open_listener(address: str | Address, *, secret: bytes, **options: object) -> Listener:
    """Bind and listen at ``address``; ``listener.address`` has the real port or name."""
    parsed = Address.parse(address)
    return await get_transport(parsed.scheme).listen(
        parsed,
        TransportOptions(secret=secret, **options),  # type: ignore[arg-type]
    )
