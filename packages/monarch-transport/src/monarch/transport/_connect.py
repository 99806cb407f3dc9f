"""Non-blocking connect, shared by the socket transports, directly or through a gateway.

Dialing through a gateway (``TransportOptions.via``, see ``_gateway``) is a connect like
any other: the gateway proves nothing, the peer's handshake that follows does.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import socket
import struct
from typing import Final

import anyio
import msgspec

from ._address import Address
from ._errors import ConnectError, ConnectionClosed, ProtocolError
from ._socket_io import WANT_WRITE, wait_for
from ._wire import (
    GATEWAY_GREETING,
    GatewayOpen,
    GatewayRefused,
    GatewayReply,
    GatewayRequest,
    decode_gateway_reply,
    encode,
)

GATEWAY_NONCE: Final = 32
"""Bytes of the nonce a gateway sends after its greeting."""
GATEWAY_PROOF: Final = 32
"""Bytes of the HMAC-SHA256 that follows each request to a gateway."""
GATEWAY_MESSAGE_LIMIT: Final = 4096
"""The largest gateway message either side reads (longer: a protocol error)."""
_LENGTH: Final = struct.Struct(">I")


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


async def connect_tcp(host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket, Nagle off, to the first address that answers."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"{host!r} does not resolve")
    error: OSError | None = None
    for family, _, _, _, sockaddr in infos:
        try:
            sock = await connect_socket(family, sockaddr)
        except OSError as exc:
            error = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    assert error is not None
    raise error


# -- the gateway protocol's raw exchanges (both sides) ----------------------------------------


async def send_raw(sock: socket.socket, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except (BlockingIOError, InterruptedError):
            await _wait(sock, readable=False)
            continue
        view = view[sent:]


async def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes, never more: what follows stays in the socket for its next owner."""
    out = bytearray()
    while len(out) < size:
        try:
            chunk = sock.recv(size - len(out))
        except (BlockingIOError, InterruptedError):
            await _wait(sock, readable=True)
            continue
        if not chunk:
            raise ConnectionClosed("the peer closed the connection")
        out += chunk
    return bytes(out)


async def _wait(sock: socket.socket, *, readable: bool) -> None:
    try:
        if readable:
            await anyio.wait_readable(sock)
        else:
            await anyio.wait_writable(sock)
    except anyio.ClosedResourceError:
        raise ConnectionClosed("the connection was closed") from None


async def send_message(sock: socket.socket, body: bytes, proof: bytes = b"") -> None:
    await send_raw(sock, _LENGTH.pack(len(body)) + body + proof)


async def recv_message(sock: socket.socket) -> bytes:
    (size,) = _LENGTH.unpack(await recv_exactly(sock, _LENGTH.size))
    if size > GATEWAY_MESSAGE_LIMIT:
        raise ProtocolError(f"gateway message of {size} bytes (limit {GATEWAY_MESSAGE_LIMIT})")
    return await recv_exactly(sock, size)


def gateway_proof(secret: bytes, nonce: bytes, body: bytes) -> bytes:
    """What proves a request comes from someone who knows the job's secret: bound to the
    gateway's fresh nonce (no replay) and to the request's bytes (no change)."""
    key = hmac.new(secret, b"monarch gateway v1", hashlib.sha256).digest()
    return hmac.new(key, nonce + body, hashlib.sha256).digest()


async def dial_gateway(
    gateway: Address, request: GatewayRequest, secret: bytes
) -> tuple[socket.socket, GatewayReply]:
    """A socket to ``gateway`` that has made ``request`` and been granted it (the caller
    bounds the time). A refusal is a ConnectError with the gateway's reason."""
    assert gateway.port is not None
    sock = await connect_tcp(gateway.host, gateway.port)
    try:
        greeting = await recv_exactly(sock, len(GATEWAY_GREETING) + GATEWAY_NONCE)
        if not greeting.startswith(GATEWAY_GREETING):
            raise ProtocolError(f"{gateway} is not a monarch gateway")
        body = encode(request)
        nonce = greeting[len(GATEWAY_GREETING) :]
        await send_message(sock, body, gateway_proof(secret, nonce, body))
        try:
            reply = decode_gateway_reply(await recv_message(sock))
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"gateway {gateway} sent garbage: {exc}") from None
        except ConnectionClosed:
            raise ConnectError(
                f"gateway {gateway} closed the connection (a wrong job secret?)"
            ) from None
        if isinstance(reply, GatewayRefused):
            raise ConnectError(f"gateway {gateway}: {reply.reason}")
    except BaseException:
        sock.close()
        raise
    return sock, reply


async def connect_through(via: str, target: Address, secret: bytes) -> socket.socket:
    """A socket to ``target`` spliced through the gateway at ``via`` (``gateway://host:port``)."""
    gateway = Address.parse(via)
    if gateway.scheme != "gateway" or gateway.port is None or "@" in gateway.host:
        raise ConnectError(f"via={via!r}: a gateway is gateway://host:port")
    sock, _ = await dial_gateway(gateway, GatewayOpen(str(target)), secret)
    return sock
