"""``gateway://``: peers reached through a gateway, for a client outside their network.

A client on a laptop can reach a cluster's login node but none of the hosts behind it, and
those hosts cannot reach the laptop. A gateway (``open_gateway``, run where both sides can
reach it) splices TCP connections for them:

- the client connects to a peer through it (``TransportOptions.via``): the gateway dials
  the peer's ``tcp://``/``tls://`` address and splices the two sockets;
- the client listens at ``gateway://host:port`` (this transport): it registers with the
  gateway and is then reachable at ``gateway://ROUTE@host:port``; a peer connecting there
  asks the gateway, which tells the client, which dials back, and the two are spliced.

The gateway passes bytes unchanged and reads none of them: the usual handshake (and TLS,
where used) runs between the two ends, so a gateway is trusted with availability only. It
serves only who proves knowledge of the job's secret (an HMAC over the gateway's fresh nonce
and the request), so it is no open relay for strangers, and it reveals nothing derived from
the secret.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
from typing import Final

import anyio
import msgspec

from ._abc import Listener, TransportOptions
from ._address import Address
from ._admission import Admission
from ._connect import (
    GATEWAY_NONCE,
    GATEWAY_PROOF,
    connect_tcp,
    dial_gateway,
    gateway_proof,
    recv_exactly,
    recv_message,
    send_message,
    send_raw,
)
from ._errors import AddressError, ConnectionClosed, TransportError
from ._handshake import check_secret
from ._socket_transport import SocketListener, SocketTransport, accept_connection
from ._tcp import TcpTransport
from ._wire import (
    GATEWAY_GREETING,
    GatewayAccept,
    GatewayGranted,
    GatewayIncoming,
    GatewayOpen,
    GatewayReach,
    GatewayRefused,
    GatewayRegister,
    decode_gateway_reply,
    decode_gateway_request,
    encode,
)

log = logging.getLogger("monarch.transport.gateway")

SPLICE_CHUNK: Final = 256 * 1024
"""Bytes the gateway moves per read."""


def _split_route(address: Address) -> tuple[str, Address]:
    """``gateway://ROUTE@host:port`` -> (ROUTE, the gateway's address); ROUTE may be empty."""
    route, _, host = address.host.rpartition("@")
    return route, Address("gateway", host, address.port)


class GatewayTransport(SocketTransport):
    """Listening at ``gateway://host:port`` registers with that gateway; connecting to
    ``gateway://ROUTE@host:port`` reaches the client registered as ROUTE."""

    scheme = "gateway"

    def check_address(self, address: Address) -> Address:
        address = Address.parse(address)
        if address.scheme != self.scheme or address.port in (None, 0):
            raise AddressError(f"not a gateway address (gateway://host:port): {address}")
        route, gateway = _split_route(address)
        if not gateway.host or (route and not route.isalnum()):
            raise AddressError(f"bad gateway address: {address}")
        return address

    async def open_socket(self, address: Address, options: TransportOptions) -> socket.socket:
        route, gateway = _split_route(address)
        if not route:
            raise AddressError(
                f"{address} is a gateway, not a peer: a client registered there is "
                "gateway://ROUTE@host:port"
            )
        sock, _ = await dial_gateway(gateway, GatewayReach(route), options.secret)
        return sock

    async def bind_socket(
        self, address: Address, options: TransportOptions
    ) -> tuple[socket.socket, Address]:
        raise AssertionError("a gateway listener registers; it binds nothing")  # see listen

    def peer_address(self, sock: socket.socket) -> Address:
        host, port = sock.getpeername()[:2]
        return Address("gateway", host, port)

    def local_address(self, sock: socket.socket) -> Address:
        host, port = sock.getsockname()[:2]
        return Address("tcp", host, port)

    async def listen(self, address: Address, options: TransportOptions) -> Listener:
        address = self.check_address(address)
        check_secret(options.secret)
        route, gateway = _split_route(address)
        if route:
            raise AddressError(f"listen at the gateway (gateway://host:port), not at {address}")
        with anyio.fail_after(options.connect_timeout):
            control, reply = await dial_gateway(gateway, GatewayRegister(), options.secret)
        assert isinstance(reply, GatewayGranted)
        mine = Address("gateway", f"{reply.route}@{gateway.host}", gateway.port)
        return GatewayListener(self, control, mine, options, gateway)


class GatewayListener(SocketListener):
    """A client registered with a gateway: each peer that wants it is announced on the
    registration's connection, and the client dials back to be spliced with it."""

    def __init__(
        self,
        transport: GatewayTransport,
        control: socket.socket,
        address: Address,
        options: TransportOptions,
        gateway: Address,
    ) -> None:
        super().__init__(transport, control, address, options)
        self._gateway = gateway

    async def _accept(self) -> socket.socket | None:
        while not self._closed:
            try:
                reply = decode_gateway_reply(await recv_message(self._sock))
            except (OSError, TransportError, msgspec.DecodeError) as exc:
                if not self._closed:
                    log.error(
                        "gateway %s lost (%s): %s is no longer reachable",
                        self._gateway,
                        exc,
                        self._address,
                    )
                return None
            if not isinstance(reply, GatewayIncoming):
                log.warning("gateway %s sent %r on a registration; ignored", self._gateway, reply)
                continue
            try:
                with anyio.fail_after(self._options.handshake_timeout):
                    sock, _ = await dial_gateway(
                        self._gateway, GatewayAccept(reply.token), self._options.secret
                    )
            except (OSError, TransportError, TimeoutError) as exc:
                log.warning("could not take a peer from gateway %s: %s", self._gateway, exc)
                continue
            return sock
        return None


# -- the gateway --------------------------------------------------------------------------------


class _Waiting:
    """A peer's Reach, waiting for the registered client to dial back with its token."""

    __slots__ = ("event", "sock")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.sock: socket.socket | None = None


class Gateway:
    """Serves the gateway protocol on a TCP socket (see the module docstring)."""

    def __init__(
        self,
        sock: socket.socket,
        address: Address,
        secret: bytes,
        *,
        handshake_timeout: float,
        connect_timeout: float,
        max_pending_handshakes: int,
    ) -> None:
        self._sock = sock
        self.address = address
        """Where clients reach it: ``gateway://host:port``."""
        self._secret = secret
        self._handshake_timeout = handshake_timeout
        self._connect_timeout = connect_timeout
        self._max_pending = max_pending_handshakes
        self._routes: dict[str, tuple[socket.socket, anyio.Lock]] = {}
        """Registered clients: their registration's socket, and a lock to write on it."""
        self._waiting: dict[str, _Waiting] = {}
        self._closed = False

    @property
    def routes(self) -> list[str]:
        """The registered clients' routes."""
        return list(self._routes)

    async def serve(self) -> None:
        """Accept until closed; each connection in a task of its own, at most
        ``max_pending_handshakes`` of them before their request (``Admission``: past that,
        the oldest of the most crowded source address is closed)."""
        async with anyio.create_task_group() as tg:
            admission = Admission(self._max_pending, self.address)
            while True:
                sock = await accept_connection(self._sock, lambda: self._closed, self.address)
                if sock is None:
                    tg.cancel_scope.cancel()
                    return
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    source = str(sock.getpeername()[0])
                except OSError:
                    _close(sock)
                    continue
                scope = anyio.CancelScope()
                admission.admit(source, scope)
                tg.start_soon(self._handle, sock, admission, scope)
                await anyio.lowlevel.checkpoint()  # an evicted one closes before the next

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        anyio.notify_closing(self._sock)
        self._sock.close()
        for sock, _ in list(self._routes.values()):
            _close(sock)
        await anyio.lowlevel.checkpoint()

    async def _handle(
        self, sock: socket.socket, admission: Admission, scope: anyio.CancelScope
    ) -> None:
        kept = False
        try:
            request = None
            try:
                with scope, anyio.fail_after(self._handshake_timeout):
                    request = await self._request(sock)
            finally:
                admission.release(scope)
            if scope.cancelled_caught:
                admission.dropped(f"{_peer(sock)}: evicted by a newer connection, no request yet")
            if request is None:
                return
            if isinstance(request, GatewayOpen):
                await self._open(sock, request.target)
            elif isinstance(request, GatewayRegister):
                await self._register(sock)
            elif isinstance(request, GatewayReach):
                await self._reach(sock, request.route)
            else:
                kept = self._accept(sock, request.token)
        except (OSError, TransportError, TimeoutError) as exc:
            log.debug("gateway connection ended: %s", exc)
        finally:
            if not kept:
                _close(sock)

    async def _request(
        self, sock: socket.socket
    ) -> GatewayOpen | GatewayRegister | GatewayReach | GatewayAccept | None:
        """The peer's request, once it proved it knows the secret; None (logged) if not."""
        nonce = secrets.token_bytes(GATEWAY_NONCE)
        await send_raw(sock, GATEWAY_GREETING + nonce)
        body = await recv_message(sock)
        proof = await recv_exactly(sock, GATEWAY_PROOF)
        peer = _peer(sock)
        if not hmac.compare_digest(proof, gateway_proof(self._secret, nonce, body)):
            log.warning("gateway: %s did not prove the job's secret; closed", peer)
            return None
        try:
            return decode_gateway_request(body)
        except msgspec.DecodeError as exc:
            log.warning("gateway: malformed request from %s (%s); closed", peer, exc)
            return None

    async def _refuse(self, sock: socket.socket, reason: str) -> None:
        log.info("gateway: refused %s: %s", _peer(sock), reason)
        await send_message(sock, encode(GatewayRefused(reason)))

    async def _open(self, sock: socket.socket, target: str) -> None:
        try:
            address = Address.parse(target)
            if address.scheme not in ("tcp", "tls") or not address.port:
                raise AddressError(f"a gateway dials tcp:// and tls:// peers, not {target}")
            with anyio.fail_after(self._connect_timeout):
                peer = await connect_tcp(address.host, address.port)
        except (OSError, TransportError, TimeoutError) as exc:
            await self._refuse(sock, f"cannot connect to {target}: {str(exc) or 'timed out'}")
            return
        try:
            await send_message(sock, encode(GatewayGranted()))
            await _splice(sock, peer)
        finally:
            _close(peer)

    async def _register(self, sock: socket.socket) -> None:
        route = secrets.token_hex(8)
        self._routes[route] = (sock, anyio.Lock())
        try:
            await send_message(sock, encode(GatewayGranted(route)))
            log.info("gateway: client %s registered as %s", _peer(sock), route)
            while await _readable_byte(sock):  # the client sends nothing: this waits for EOF
                pass
        finally:
            del self._routes[route]
            log.info("gateway: client %s left", route)

    async def _reach(self, sock: socket.socket, route: str) -> None:
        client = self._routes.get(route)
        if client is None:
            await self._refuse(sock, f"no client {route} is registered at this gateway")
            return
        token = secrets.token_hex(16)
        waiting = self._waiting[token] = _Waiting()
        try:
            control, lock = client
            async with lock:
                await send_message(control, encode(GatewayIncoming(token)))
            with anyio.move_on_after(self._connect_timeout):
                await waiting.event.wait()
        finally:
            self._waiting.pop(token, None)
        if waiting.sock is None:
            await self._refuse(sock, f"client {route} did not answer")
            return
        back = waiting.sock
        try:
            await send_message(back, encode(GatewayGranted()))
            await send_message(sock, encode(GatewayGranted()))
            await _splice(sock, back)
        finally:
            _close(back)

    def _accept(self, sock: socket.socket, token: str) -> bool:
        """Hand ``sock`` to the Reach waiting for ``token``; whether it was taken."""
        waiting = self._waiting.pop(token, None)
        if waiting is None:
            log.info("gateway: %s answered an unknown or expired token", _peer(sock))
            return False
        waiting.sock = sock
        waiting.event.set()
        return True


async def open_gateway(
    address: str | Address = "tcp://0.0.0.0:0",
    *,
    secret: bytes,
    handshake_timeout: float = 10.0,
    connect_timeout: float = 30.0,
    max_pending_handshakes: int = 64,
) -> Gateway:
    """Bind a gateway at ``address`` (``tcp://`` or ``gateway://`` host:port); serve it with
    ``await gateway.serve()``. ``gateway.address`` is what clients are given."""
    check_secret(secret)
    parsed = Address.parse(address)
    if parsed.scheme not in ("tcp", "gateway"):
        raise AddressError(f"a gateway listens on tcp://host:port, not {address}")
    tcp = TcpTransport()
    options = TransportOptions(secret=secret)
    sock, bound = await tcp.bind_socket(Address("tcp", parsed.host, parsed.port), options)
    return Gateway(
        sock,
        Address("gateway", bound.host, bound.port),
        secret,
        handshake_timeout=handshake_timeout,
        connect_timeout=connect_timeout,
        max_pending_handshakes=max_pending_handshakes,
    )


# -- splicing -----------------------------------------------------------------------------------


async def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both ends are done; a reset of either ends both."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(_pump, a, b, tg.cancel_scope)
        tg.start_soon(_pump, b, a, tg.cancel_scope)


async def _pump(src: socket.socket, dst: socket.socket, scope: anyio.CancelScope) -> None:
    buf = bytearray(SPLICE_CHUNK)
    view = memoryview(buf)
    try:
        while True:
            try:
                n = src.recv_into(view)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_readable(src)
                continue
            if n == 0:
                dst.shutdown(socket.SHUT_WR)  # the other direction may still flow
                return
            await send_raw(dst, view[:n])
    except (OSError, ConnectionClosed, anyio.ClosedResourceError):
        scope.cancel()


async def _readable_byte(sock: socket.socket) -> bool:
    """Wait for the socket to be readable; False at EOF, on error or once closed (a byte
    read is dropped)."""
    while True:
        try:
            return bool(sock.recv(1))
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return False
        try:
            await anyio.wait_readable(sock)
        except (OSError, anyio.ClosedResourceError):
            return False


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


def _close(sock: socket.socket) -> None:
    if sock.fileno() >= 0:
        anyio.notify_closing(sock)
        sock.close()
