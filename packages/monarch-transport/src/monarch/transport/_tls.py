"""``tls://host:port`` transport: TCP wrapped in TLS (stdlib ssl), for traffic between machines.

Listeners need a server ``ssl_context`` in their options; connections use the given
client context or ``ssl.create_default_context()``, verifying the host name of the
address unless ``server_hostname`` says otherwise. The monarch handshake still runs
inside TLS: the certificate proves the machine, the secret proves the job.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from typing import Any

from ._abc import ConnectionAttribute, TransportOptions
from ._address import Address
from ._errors import AddressError
from ._socket import SocketIO, TlsIO, tls_handshake
from ._tcp import TcpTransport


class TlsTransport(TcpTransport):
    scheme = "tls"

    async def bind_socket(
        self, address: Address, options: TransportOptions
    ) -> tuple[socket.socket, Address]:
        if options.ssl_context is None:
            raise AddressError(f"listening on {address} needs a server ssl_context")
        return await super().bind_socket(address, options)

    async def secure(
        self, sock: socket.socket, options: TransportOptions, *, server_side: bool, address: Address
    ) -> SocketIO:
        context = options.ssl_context
        if context is None:
            if server_side:
                raise AddressError("a tls listener needs a server ssl_context")
            context = ssl.create_default_context()
        hostname = None if server_side else (options.server_hostname or address.host)
        wrapped = context.wrap_socket(
            sock, server_side=server_side, do_handshake_on_connect=False, server_hostname=hostname
        )
        try:
            await tls_handshake(wrapped)
        except BaseException:
            wrapped.close()
            raise
        return TlsIO(wrapped)

    def socket_attributes(self, sock: socket.socket) -> dict[Any, Callable[[], Any]]:
        return {ConnectionAttribute.ssl_object: lambda: sock}
