"""``unix://`` transport: Unix domain sockets, by path or in Linux's abstract namespace.

``unix:///run/x.sock`` is a socket file (removed again when the listener closes);
``unix://@name`` is abstract (no file; Linux only); ``unix://@`` lets the kernel
pick a free abstract name, the way port 0 does for TCP.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from collections.abc import Callable
from typing import Any

from ._abc import ConnectionAttribute, TransportOptions
from ._address import Address
from ._connect import connect_socket
from ._errors import AddressError
from ._socket_transport import SocketTransport

BACKLOG = 4096
BUFFER_SIZE = 4 * 1024 * 1024
"""Socket buffer size: large frames move in fewer, larger system calls."""


def _sockaddr(address: Address) -> str | bytes:
    path = address.host
    if path.startswith("@"):
        return b"\x00" + path[1:].encode()
    return path


def _address(sockaddr: str | bytes) -> Address:
    if isinstance(sockaddr, bytes):
        if sockaddr.startswith(b"\x00"):
            return Address("unix", "@" + sockaddr[1:].decode(errors="surrogateescape"))
        sockaddr = sockaddr.decode(errors="surrogateescape")
    return Address("unix", sockaddr or "@")


class UnixTransport(SocketTransport):
    scheme = "unix"

    def check_address(self, address: Address) -> Address:
        address = Address.parse(address)
        if address.scheme != self.scheme or address.port is not None or not address.host:
            raise AddressError(f"not a unix address: {address}")
        if len(os.fsencode(address.host)) > 107:
            raise AddressError(f"unix socket path longer than 107 bytes: {address}")
        return address

    async def open_socket(self, address: Address, options: TransportOptions) -> socket.socket:
        if address.host == "@":
            raise AddressError("unix://@ only makes sense for listening (any free name)")
        sock = await connect_socket(socket.AF_UNIX, _sockaddr(address))
        _tune(sock)
        return sock

    async def bind_socket(
        self, address: Address, options: TransportOptions
    ) -> tuple[socket.socket, Address]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            if address.host == "@":
                sock.bind("")  # Linux autobind: a free abstract name
            else:
                if not address.host.startswith("@"):
                    _remove_stale(address.host)
                sock.bind(_sockaddr(address))
            sock.listen(BACKLOG)
            return sock, _address(sock.getsockname())
        except OSError as exc:
            sock.close()
            raise AddressError(f"cannot listen on {address}: {exc}") from exc

    def unbind(self, address: Address) -> None:
        if not address.host.startswith("@"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address.host)

    def peer_address(self, sock: socket.socket) -> Address:
        _tune(sock)
        pid, _, _ = _credentials(sock)
        return Address("unix", f"@peer-pid-{pid}")

    def local_address(self, sock: socket.socket) -> Address:
        return _address(sock.getsockname())

    def socket_attributes(self, sock: socket.socket) -> dict[Any, Callable[[], Any]]:
        return {ConnectionAttribute.peer_credentials: lambda: _credentials(sock)}


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_SIZE)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_SIZE)


def _credentials(sock: socket.socket) -> tuple[int, int, int]:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def _remove_stale(path: str) -> None:
    """Remove a socket file nobody listens on any more (left by a crashed process)."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return
    except FileNotFoundError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    except OSError:
        pass
    finally:
        probe.close()
