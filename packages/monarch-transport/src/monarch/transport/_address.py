"""Addresses are URLs: ``unix:///path``, ``unix://@abstract``, ``tcp://host:port``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._errors import AddressError

_SCHEME = re.compile(r"^([a-z][a-z0-9+.\-]*)://(.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed transport address.

    ``host`` holds the host name for network transports and the socket path for
    ``unix`` (a leading ``@`` marks Linux's abstract namespace); ``port`` is ``None``
    for transports without ports.
    """

    scheme: str
    host: str
    port: int | None = None

    @classmethod
    def parse(cls, url: str | Address) -> Address:
        """Parse ``scheme://location``; the transport validates the location further."""
        if isinstance(url, Address):
            return url
        if not isinstance(url, str):
            raise TypeError(f"an address is a str URL, not {type(url).__name__}")
        m = _SCHEME.match(url)
        if m is None:
            raise AddressError(f"not an address URL (expected scheme://...): {url!r}")
        scheme, rest = m.groups()
        if scheme == "unix":
            if not rest:
                raise AddressError(f"unix address has no path: {url!r}")
            if "\x00" in rest:
                raise AddressError(f"unix address contains a NUL byte: {url!r}")
            return cls(scheme, rest, None)
        return cls(scheme, *_split_host_port(rest, url))

    def with_port(self, port: int) -> Address:
        return Address(self.scheme, self.host, port)

    def __str__(self) -> str:
        if self.port is None:
            return f"{self.scheme}://{self.host}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def _split_host_port(rest: str, url: str) -> tuple[str, int]:
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or not tail.startswith(":"):
            raise AddressError(f"bad IPv6 address (expected [host]:port): {url!r}")
        port_text = tail[1:]
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            raise AddressError(f"address has no port (use port 0 for any): {url!r}")
        if ":" in host:
            raise AddressError(f"IPv6 hosts must be bracketed, as in tcp://[::1]:0: {url!r}")
    if not host:
        raise AddressError(f"address has no host: {url!r}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise AddressError(f"bad port {port_text!r} in {url!r}")
    return host, int(port_text)
