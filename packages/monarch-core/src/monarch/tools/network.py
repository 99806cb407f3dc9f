"""Upstream's ``monarch.tools.network``: resolve a hostname to an address that can bind TCP.

Upstream's Kubernetes DDP example builds worker addresses with ``get_ipaddr`` and ``AddrType``.
IPv6 is tried before IPv4 (``AddrType.Default``); link-local addresses are skipped, since other
pods and containers cannot reach them.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from enum import Enum, auto

__all__ = ["AddrType", "get_ipaddr", "get_sockaddr"]

logger = logging.getLogger(__name__)


class AddrType(Enum):
    """Which family ``get_ipaddr`` resolves: IPv6 falling back to IPv4, or only one of them."""

    Default = auto()
    IPv4 = auto()
    IPv6 = auto()


_FAMILIES = {
    AddrType.IPv4: (socket.AF_INET,),
    AddrType.IPv6: (socket.AF_INET6,),
    AddrType.Default: (socket.AF_INET6, socket.AF_INET),
}


def _unresolved(hostname: str) -> RuntimeError:
    return RuntimeError(
        f"Unable to resolve `{hostname}` to ipv6 or ipv4 address that can bind TCP socket."
        " Check the network configuration on the host."
    )


def _resolve_ipaddr(hostname: str, port: int, family: socket.AddressFamily) -> str | None:
    try:
        addrs = socket.getaddrinfo(hostname, port, family, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        logger.info("no %s address for `%s:%d` (error: %s)", family.name, hostname, port, error)
        return None
    if not addrs:
        return None
    addr = str(addrs[0][4][0])
    if ipaddress.ip_address(addr).is_link_local:
        logger.info("skipping link-local address `%s` for `%s:%d`", addr, hostname, port)
        return None
    return addr


def get_ipaddr(hostname: str, port: int, addr_type: AddrType = AddrType.Default) -> str:
    """The first address of ``hostname`` in ``addr_type``'s families (``127.0.0.1``, ``::1``).

    Raises ``RuntimeError`` if none resolves, ``ValueError`` for something not an ``AddrType``.
    """
    try:
        families = _FAMILIES[addr_type]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown AddrType: {addr_type!r}") from None
    for family in families:
        if ipaddr := _resolve_ipaddr(hostname, port, family):
            return ipaddr
    raise _unresolved(hostname)


def get_sockaddr(hostname: str, port: int) -> str:
    """``ip:port`` or ``[ipv6]:port`` of ``hostname`` (IPv6 first); ``RuntimeError`` if neither."""
    for family in (socket.AF_INET6, socket.AF_INET):
        if ipaddr := _resolve_ipaddr(hostname, port, family):
            return f"[{ipaddr}]:{port}" if family == socket.AF_INET6 else f"{ipaddr}:{port}"
    raise _unresolved(hostname)
