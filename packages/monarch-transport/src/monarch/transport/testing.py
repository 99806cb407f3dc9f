"""monarch.transport.testing: a connection that offers nothing but the thin contract.

``Thin`` wraps any connection and shows only ``send``, ``receive``, ``aclose`` and the
``transport`` attribute, as a new transport written from the contract alone would; the
transports' own tests hold it to the contract, and the layers above (monarch-core's runtime)
prove through it that they fall back where a fast path or push mode is not offered.
``ThinTransport`` (``thin://host:port``, registered by whoever needs it) dials a ``tcp://``
listener there and hands out ``Thin`` connections.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._abc import Connection, ConnectionAttribute, Listener, Transport, TransportOptions
from ._address import Address
from ._framing import Buffer, Frame
from ._tcp import TcpTransport

__all__ = ["Thin", "ThinTransport"]


class Thin(Connection):
    """A connection with nothing but the contract: what a new transport may offer."""

    def __init__(self, inner: Connection) -> None:
        self._inner = inner

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return {ConnectionAttribute.transport: lambda: "thin"}

    async def send(self, parts: Sequence[Buffer]) -> None:
        await self._inner.send(parts)

    async def receive(self) -> Frame:
        return await self._inner.receive()

    async def aclose(self) -> None:
        await self._inner.aclose()


class ThinTransport(Transport):
    """``thin://host:port``: a TCP listener there, reached through ``Thin`` connections."""

    scheme = "thin"

    def check_address(self, address: Address) -> Address:
        return address

    async def connect(self, address: Address, options: TransportOptions) -> Connection:
        tcp = Address("tcp", address.host, address.port)
        return Thin(await TcpTransport().connect(tcp, options))

    async def listen(self, address: Address, options: TransportOptions) -> Listener:
        raise NotImplementedError("thin:// connects to a tcp:// listener")
