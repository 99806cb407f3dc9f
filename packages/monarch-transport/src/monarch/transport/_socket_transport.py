"""Stream-socket transports: connecting, the handshake, and listening.

``SocketTransport`` is what the unix, tcp and tls transports share: they open, bind and
describe sockets, and it makes each connected socket an authenticated
``SocketConnection`` (``_socket``) within the handshake's deadline.
"""

from __future__ import annotations

import logging
import socket
import sys
from abc import abstractmethod
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.lowlevel import checkpoint

from ._abc import (
    Connection,
    ConnectionAttribute,
    ConnectionHandler,
    Listener,
    Transport,
    TransportOptions,
)
from ._address import Address
from ._admission import Admission
from ._errors import ConnectError, HandshakeError, TransportError
from ._handshake import FrameKeys, Handshake, Role, check_secret
from ._mac import available_features
from ._socket import SocketConnection
from ._socket_io import SocketIO, send_all, wait_for

log = logging.getLogger("monarch.transport")


async def run_handshake(
    io: SocketIO, role: Role, secret: bytes
) -> tuple[int, bytes, FrameKeys | None]:
    """Drive :class:`Handshake` over ``io``; returns the version, the bytes read past it
    and the keys of the frames (None where the channel authenticates them)."""
    handshake = Handshake(role, secret, channel_binding=io.channel_binding())
    buf = bytearray(4096)
    await send_all(io, handshake.data_to_send())
    while handshake.wants_more:
        with memoryview(buf) as view:
            n = io.recv_into(view)
        if n < 0:
            await wait_for(io.sock, n)
            continue
        if n == 0:
            raise HandshakeError("peer closed the connection during the handshake")
        try:
            handshake.receive_data(bytes(buf[:n]))
        finally:
            reply = handshake.data_to_send()
            if reply:
                try:
                    await send_all(io, reply)
                except (OSError, TransportError):
                    if handshake.wants_more:
                        raise
    assert handshake.version is not None
    return handshake.version, handshake.leftover, handshake.frame_keys


class SocketTransport(Transport):
    """A transport over stream sockets: subclasses open, bind and describe sockets."""

    def __init__(self) -> None:
        # What the handshake offers, looked up now (a ``find_spec``, ~0.5 ms): a process
        # that forks others makes its transports first (monarch-core's zygote), and its
        # forks then start their handshakes with it known.
        available_features()

    @abstractmethod
    async def open_socket(self, address: Address, options: TransportOptions) -> socket.socket:
        """A connected non-blocking socket to ``address``."""

    @abstractmethod
    async def bind_socket(
        self, address: Address, options: TransportOptions
    ) -> tuple[socket.socket, Address]:
        """A listening non-blocking socket and its real address."""

    @abstractmethod
    def peer_address(self, sock: socket.socket) -> Address: ...

    def socket_attributes(self, sock: socket.socket) -> dict[Any, Callable[[], Any]]:
        return {}

    async def secure(
        self, sock: socket.socket, options: TransportOptions, *, server_side: bool, address: Address
    ) -> SocketIO:
        """Wrap the socket for I/O (TLS does its handshake here)."""
        return SocketIO(sock)

    def unbind(self, address: Address) -> None:
        """Release what ``bind_socket`` claimed beyond the socket (a socket file)."""

    async def connect(self, address: Address, options: TransportOptions) -> Connection:
        address = self.check_address(address)
        check_secret(options.secret)
        try:
            with anyio.fail_after(options.connect_timeout):
                sock = await self.open_socket(address, options)
        except TimeoutError:
            raise ConnectError(
                f"cannot connect to {address}: timed out after {options.connect_timeout}s"
            ) from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {address}: {exc}") from exc
        return await self.establish(
            sock, options, "client", local=self.local_address(sock), remote=address
        )

    @abstractmethod
    def local_address(self, sock: socket.socket) -> Address: ...

    async def establish(
        self,
        sock: socket.socket,
        options: TransportOptions,
        role: Role,
        *,
        local: Address,
        remote: Address,
    ) -> SocketConnection:
        """Secure and authenticate a connected socket within the handshake deadline.

        Closes the socket (and its TLS wrapper) when anything fails.
        """
        io: SocketIO | None = None
        try:
            with anyio.fail_after(options.handshake_timeout):
                io = await self.secure(sock, options, server_side=role == "server", address=remote)
                version, leftover, keys = await run_handshake(io, role, options.secret)
        except BaseException as exc:
            if io is not None:
                io.sock.close()
            sock.close()
            if isinstance(exc, TimeoutError):
                raise HandshakeError(
                    f"handshake with {remote} timed out after {options.handshake_timeout}s"
                ) from None
            ssl = sys.modules.get("ssl")  # loaded only by the tls transport
            if ssl is not None and isinstance(exc, ssl.SSLError):
                raise HandshakeError(f"TLS handshake with {remote} failed: {exc}") from exc
            if isinstance(exc, OSError):
                raise HandshakeError(
                    f"connection to {remote} lost in the handshake: {exc}"
                ) from exc
            raise
        secured = io.sock
        attributes: dict[Any, Callable[[], Any]] = {
            ConnectionAttribute.transport: lambda: self.scheme,
            ConnectionAttribute.local_address: lambda: local,
            ConnectionAttribute.remote_address: lambda: remote,
            ConnectionAttribute.protocol_version: lambda: version,
            ConnectionAttribute.raw_socket: lambda: secured,
            **self.socket_attributes(secured),
        }
        return SocketConnection(io, options, leftover=leftover, attributes=attributes, keys=keys)

    async def listen(self, address: Address, options: TransportOptions) -> Listener:
        address = self.check_address(address)
        check_secret(options.secret)
        sock, real = await self.bind_socket(address, options)
        return SocketListener(self, sock, real, options)


async def accept_connection(
    sock: socket.socket, closed: Callable[[], bool], where: object
) -> socket.socket | None:
    """The next connection accepted on the listening ``sock`` (non-blocking), or None once
    ``closed()`` or the socket is closed; a failure such as running out of descriptors is
    logged and retried once some may have freed up (shared by every listener)."""
    while not closed():
        try:
            raw, _ = sock.accept()
        except (BlockingIOError, InterruptedError):
            try:
                await anyio.wait_readable(sock)
            except anyio.ClosedResourceError:
                return None
            continue
        except OSError as exc:
            if sock.fileno() < 0:
                return None
            log.error("accept on %s failed: %s", where, exc)
            await anyio.sleep(0.1)
            continue
        raw.setblocking(False)
        return raw
    return None


class SocketListener(Listener):
    def __init__(
        self,
        transport: SocketTransport,
        sock: socket.socket,
        address: Address,
        options: TransportOptions,
    ) -> None:
        self._transport = transport
        self._sock = sock
        self._address = address
        self._options = options
        self._closed = False

    @property
    def address(self) -> Address:
        return self._address

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._address}{' closed' if self._closed else ''}>"

    async def serve(self, handler: ConnectionHandler, task_group: TaskGroup | None = None) -> None:
        """Accept every connection at once and let it do its handshake, keeping at most
        ``max_pending_handshakes`` unauthenticated ones (``Admission``: a flood of silent or
        slow connections evicts itself, it does not queue the job's own peers behind it)."""
        async with AsyncExitStack() as stack:
            if task_group is None:
                task_group = await stack.enter_async_context(anyio.create_task_group())
            admission = Admission(self._options.max_pending_handshakes, self._address)
            while not self._closed:
                raw = await self._accept()
                if raw is None:
                    return
                try:
                    remote = self._transport.peer_address(raw)
                except OSError:
                    raw.close()
                    continue
                scope = anyio.CancelScope()
                admission.admit(remote.host if remote.port is not None else "", scope)
                task_group.start_soon(self._handle, raw, remote, handler, admission, scope)
                await checkpoint()  # an evicted handshake closes before the next accept

    async def _accept(self) -> socket.socket | None:
        """The next connection (non-blocking), or None once the listener is closed."""
        return await accept_connection(self._sock, lambda: self._closed, self._address)

    async def _handle(
        self,
        raw: socket.socket,
        remote: Address,
        handler: ConnectionHandler,
        admission: Admission,
        scope: anyio.CancelScope,
    ) -> None:
        conn: SocketConnection | None = None
        try:
            with scope:
                conn = await self._establish(raw, remote)
        except TransportError as exc:
            admission.dropped(f"{remote}: {exc}")
            return
        finally:
            admission.release(scope)
        if conn is None:
            admission.dropped(f"{remote}: evicted by a newer connection, still unauthenticated")
            return
        async with conn:
            try:
                await handler(conn)
            except Exception:
                log.exception("connection handler for %s failed; closing that connection", remote)

    async def _establish(self, raw: socket.socket, remote: Address) -> SocketConnection:
        """The handshake of an accepted connection, which must send its first bytes within
        ``hello_timeout`` (a peer with the secret sends its hello at once); the socket is
        closed if anything fails."""
        deadline = min(self._options.hello_timeout, self._options.handshake_timeout)
        try:
            with anyio.move_on_after(deadline) as silent:
                await anyio.wait_readable(raw)
        except BaseException:
            raw.close()
            raise
        if silent.cancelled_caught:
            raw.close()
            raise HandshakeError(f"handshake timed out: nothing sent within {deadline}s")
        return await self._transport.establish(
            raw, self._options, "server", local=self._address, remote=remote
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        anyio.notify_closing(self._sock)
        self._sock.close()
        self._transport.unbind(self._address)
        await checkpoint()
