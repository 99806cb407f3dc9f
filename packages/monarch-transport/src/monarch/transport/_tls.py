"""``tls://host:port`` transport: TCP wrapped in TLS (stdlib ssl), for traffic between machines.

Listeners need a server ``ssl_context`` in their options; connections use the given
client context or ``ssl.create_default_context()``, verifying the host name of the
address unless ``server_hostname`` says otherwise. The monarch handshake still runs
inside TLS: the certificate proves the machine, the secret proves the job. With TLS 1.3
the handshake is bound to the TLS session (``TlsIO.channel_binding``) and frames carry
no MAC of their own: TLS records authenticate every byte, between the two peers that
proved the secret. With TLS 1.2 they carry one as over tcp.
"""

from __future__ import annotations

import socket
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any

from ._abc import ConnectionAttribute, TransportOptions
from ._address import Address
from ._errors import AddressError
from ._socket_io import WANT_READ, WANT_WRITE, SocketIO, wait_for
from ._tcp import TcpTransport

TLS_CHUNK = 256 * 1024
"""Bytes handed to one TLS write: large parts are encrypted a chunk at a time."""


class TlsIO(SocketIO):
    """The same over TLS: no vectored writes, and a write is retried with the same chunk."""

    sock: ssl.SSLSocket

    def __init__(self, sock: ssl.SSLSocket) -> None:
        super().__init__(sock)
        self._chunk: bytes | memoryview | None = None

    def recv_into(self, buf: memoryview) -> int:
        try:
            return self.sock.recv_into(buf)
        except ssl.SSLWantReadError:
            return WANT_READ
        except ssl.SSLWantWriteError:
            return WANT_WRITE
        except ssl.SSLZeroReturnError:
            return 0

    def pending(self) -> bool:
        return self.sock.pending() > 0

    def channel_binding(self) -> bytes | None:
        """TLS 1.3's ``tls-unique`` (its first Finished message): the handshake covers it,
        so a relay terminating TLS on both sides fails the proofs, and frames travel
        without a MAC of their own. TLS 1.2 frames keep theirs (tls-unique there is only
        as good as the extended master secret, which this side cannot check)."""
        if self.sock.version() != "TLSv1.3":
            return None
        return self.sock.get_channel_binding("tls-unique")

    def send(self, bufs: deque[bytearray | memoryview]) -> int:
        if self._chunk is None:
            head = bufs[0]
            if isinstance(head, memoryview) and len(head) >= TLS_CHUNK:
                self._chunk = head[:TLS_CHUNK]
            else:
                chunk = bytearray()
                for buf in bufs:
                    chunk += buf[: TLS_CHUNK - len(chunk)]
                    if len(chunk) >= TLS_CHUNK:
                        break
                self._chunk = bytes(chunk)
        try:
            sent = self.sock.send(self._chunk)
        except ssl.SSLWantWriteError:
            return WANT_WRITE
        except ssl.SSLWantReadError:
            return WANT_READ
        self._chunk = None
        return sent


async def tls_handshake(sock: ssl.SSLSocket) -> None:
    while True:
        try:
            sock.do_handshake()
            return
        except ssl.SSLWantReadError:
            await wait_for(sock, WANT_READ)
        except ssl.SSLWantWriteError:
            await wait_for(sock, WANT_WRITE)


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
