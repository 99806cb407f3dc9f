"""Non-blocking connect, shared by the socket transports."""

from __future__ import annotations

import errno
import socket

import anyio

from ._socket import WANT_WRITE, wait_for


async def connect_socket(family: int, sockaddr: object) -> socket.socket:
    """A connected non-blocking stream socket (the caller bounds the time)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        delay = 0.001
        while True:
            err = sock.connect_ex(sockaddr)  # type: ignore[arg-type]
            if err in (0, errno.EISCONN):
                return sock
            if err == errno.EINPROGRESS:
                await wait_for(sock, WANT_WRITE)
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err == 0:
                    return sock
                raise OSError(err, errno.errorcode.get(err, "connect failed"))
            if err == errno.EAGAIN and family == socket.AF_UNIX:
                # The listener's backlog is full: it frees up as the listener accepts.
                await anyio.sleep(delay)
                delay = min(2 * delay, 0.1)
                continue
            raise OSError(err, f"{errno.errorcode.get(err, 'connect failed')}")
    except BaseException:
        sock.close()
        raise
