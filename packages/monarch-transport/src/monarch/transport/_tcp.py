"""``tcp://host:port`` transport: TCP with Nagle off, IPv4 and IPv6 (``tcp://[::1]:0``)."""

from __future__ import annotations

import socket

import anyio

from ._abc import TransportOptions
from ._address import Address
from ._connect import connect_tcp, connect_through
from ._errors import AddressError
from ._socket_transport import SocketTransport

BACKLOG = 4096


def _address(scheme: str, sockaddr: tuple[str, int] | tuple[str, int, int, int]) -> Address:
    return Address(scheme, sockaddr[0], sockaddr[1])


class TcpTransport(SocketTransport):
    scheme = "tcp"

    def check_address(self, address: Address) -> Address:
        address = Address.parse(address)
        if address.scheme != self.scheme or address.port is None:
            raise AddressError(f"not a {self.scheme} address: {address}")
        return address

    async def open_socket(self, address: Address, options: TransportOptions) -> socket.socket:
        assert address.port is not None
        if address.port == 0:
            raise AddressError(f"cannot connect to port 0: {address}")
        if options.via is not None:
            return await connect_through(options.via, address, options.secret)
        return await connect_tcp(address.host, address.port)

    async def bind_socket(
        self, address: Address, options: TransportOptions
    ) -> tuple[socket.socket, Address]:
        try:
            infos = await anyio.getaddrinfo(
                address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError as exc:
            raise AddressError(f"cannot resolve {address}: {exc}") from exc
        family, _, _, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(BACKLOG)
            return sock, _address(self.scheme, sock.getsockname())
        except OSError as exc:
            sock.close()
            raise AddressError(f"cannot listen on {address}: {exc}") from exc

    def peer_address(self, sock: socket.socket) -> Address:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _address(self.scheme, sock.getpeername())

    def local_address(self, sock: socket.socket) -> Address:
        return _address(self.scheme, sock.getsockname())
