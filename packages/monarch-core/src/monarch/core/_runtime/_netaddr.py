"""Which of this machine's addresses other machines can reach.

Nothing here sends a packet: the route probe is a UDP ``connect``, which only asks the
kernel which source address it would use.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import struct
from typing import Final

from monarch.transport import Address

log = logging.getLogger("monarch.core")

WILDCARD_HOSTS: Final = frozenset({"*", "0.0.0.0", "::"})
"""Hosts that mean "every interface" in a listen address."""

_ALIAS_SPLIT: Final = re.compile(r"@(?=[a-z][a-z0-9+.\-]*://)")


def split_alias(url: str) -> tuple[str, str]:
    """``(advertised, bind)`` of upstream's ``ADVERTISED@BIND`` listen form.

    ``tcp://node1:4444@tcp://0.0.0.0:4444`` binds every interface and is known as
    ``tcp://node1:4444``; a leading proc id (``service<id>@tcp://...``) is dropped; a plain
    URL is both. (``unix://@name`` is not split: the ``@`` there starts no URL.) Upstream's
    ``ipc://`` (Unix sockets) comes back as ours, ``unix://``.
    """
    parts = [p for p in _ALIAS_SPLIT.split(url) if p]
    if parts and "://" not in parts[0]:
        parts = parts[1:]  # a proc id
    if not parts or len(parts) > 2:
        raise ValueError(f"not an address (URL or ADVERTISED@BIND): {url!r}")
    return ours(parts[0]), ours(parts[-1])


def ours(url: str) -> str:
    """An upstream channel URL as ours: ``ipc://PATH`` (``ipc://@NAME``) is ``unix://``."""
    return "unix://" + url[len("ipc://") :] if url.startswith("ipc://") else url


_INHERITED: Final = re.compile(r"^(tcp|tls)://(.+):fd(\d+)$")


def inherited(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, fd)`` of upstream's ``tcp://HOST:fdN``: listen on the socket this
    process inherited as file descriptor N (known by HOST and its port); else ``None``."""
    found = _INHERITED.match(url)
    return (found[1], found[2], int(found[3])) if found is not None else None


def scheme_of(url: str) -> str:
    """The scheme of a URL (``tcp``, ``tls``, ``unix``...)."""
    return url.partition("://")[0]


IP_SCHEMES: Final = ("tcp", "tls", "ibverbs")
"""Transports over IP (``ibverbs``: TCP underneath): their addresses name a host."""


def ip_host(url: str) -> str | None:
    """The host of an address over IP (``tcp://HOST:PORT``, IPv6 unbracketed; "" if none
    given), else ``None`` (a Unix socket): where another machine reaches that process."""
    scheme, _, rest = url.partition("://")
    if scheme not in IP_SCHEMES or not rest:
        return None
    return rest.rpartition(":")[0].strip("[]")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _bindable(ip: str) -> bool:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
    except OSError:
        return False
    return True


def _interface_ipv4() -> list[str]:
    """IPv4 addresses of this namespace's interfaces (Linux SIOCGIFADDR), loopback last."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return []
    found: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                data = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address, or interface down
                continue
            found.append(socket.inet_ntoa(data[20:24]))
    return sorted(found, key=is_loopback)


def default_host() -> str:
    """A non-loopback address of this machine that can be bound, else ``127.0.0.1``.

    Tries what the host name resolves to first (upstream's ``TcpWithHostname``), then the
    interfaces' own addresses (the host name may belong to another network namespace).
    """
    candidates: list[str] = []
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
    except OSError:
        infos = []
    candidates += [str(info[4][0]) for info in infos]
    candidates += _interface_ipv4()
    for ip in candidates:
        try:
            parsed = ipaddress.ip_address(ip)
        except ValueError:
            continue
        if parsed.is_loopback or parsed.is_link_local or parsed.is_unspecified:
            continue
        if _bindable(ip):
            return ip
    log.warning("no non-loopback address found for this host; other hosts cannot reach it")
    return "127.0.0.1"


def route_source(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"{host!r} does not resolve")
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)  # UDP: picks a route and a source address, sends nothing
        return str(s.getsockname()[0])


def advertised(bound: Address, advertise: str | None = None) -> Address:
    """The address peers should use for a listener bound at ``bound``.

    ``advertise`` (a URL, possibly with port 0) names it explicitly; otherwise a wildcard
    host is replaced by :func:`default_host`. The port is always the bound one.
    """
    if advertise is not None:
        name = Address.parse(advertise)
        host = name.host
        if host in WILDCARD_HOSTS:
            host = default_host()
        return Address(bound.scheme, host, bound.port)
    if bound.port is not None and bound.host in WILDCARD_HOSTS:
        return Address(bound.scheme, default_host(), bound.port)
    return bound


def bind_url(url: str) -> str:
    """``url`` with upstream's ``*`` wildcard host spelled as the OS wants it."""
    address = Address.parse(url)
    if address.host == "*":
        return str(Address(address.scheme, "0.0.0.0", address.port))
    return url
