"""monarch.transport.testing: a connection that offers nothing but the thin contract.

``Thin`` wraps any connection and shows only ``send``, ``receive``, ``aclose`` and the
``transport`` attribute, as a new transport written from the contract alone would; the
transports' own tests hold it to the contract, and the layers above (monarch-core's runtime)
prove through it that they fall back where a fast path or push mode is not offered.
``ThinTransport`` (``thin://host:port``, registered by whoever needs it) dials a ``tcp://``
listener there and hands out ``Thin`` connections.

``install_entry_points`` writes a distribution's metadata registering plug-ins in a
folder on ``sys.path``: how a test proves the one loader (``_plugins``) finds, names and
refuses plug-ins of any group without pip-installing a wheel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._abc import Connection, ConnectionAttribute, Listener, Transport, TransportOptions
from ._address import Address
from ._framing import Buffer, Frame
from ._tcp import TcpTransport

__all__ = ["Thin", "ThinTransport", "install_entry_points"]


def install_entry_points(site: Path, dist: str, group: str, entries: Mapping[str, str]) -> None:
    """Write the metadata of distribution ``dist`` registering ``entries`` (name to
    ``module:attribute``) in entry-point ``group``, in ``site`` (a folder on ``sys.path``)."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")


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
