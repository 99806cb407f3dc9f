"""Listening on a socket this process inherited: upstream's ``tcp://HOST:fdN`` worker address.

A supervisor (systemd socket activation, a job launcher) may bind the worker's port and
hand the listening socket down as file descriptor N; the worker accepts on it, and is known
as ``tcp://HOST:<its port>``.
"""

from __future__ import annotations

import copy
import socket

from monarch.core._runtime._tls import tls_options
from monarch.transport import Address, Listener, TransportOptions, get_transport


async def adopt_listener(
    scheme: str, host: str, fd: int, secret: bytes, handshake_timeout: float
) -> Listener:
    """A listener of ``scheme`` (tcp or tls) on the inherited listening socket ``fd``."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    address = Address(scheme, host, port)

    async def bind_socket(
        address: Address, options: TransportOptions
    ) -> tuple[socket.socket, Address]:
        return sock, address

    transport = copy.copy(get_transport(scheme))  # the same transport, bound to this socket
    setattr(transport, "bind_socket", bind_socket)  # noqa: B010 - an instance's own method
    options = TransportOptions(
        secret=secret, handshake_timeout=handshake_timeout, **tls_options(str(address), server=True)
    )
    return await transport.listen(address, options)
