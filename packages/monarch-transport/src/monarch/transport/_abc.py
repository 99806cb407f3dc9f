"""The interfaces every transport implements (re-exported by ``monarch.transport.abc``)."""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar

from anyio import TypedAttributeProvider, TypedAttributeSet, typed_attribute
from anyio.abc import TaskGroup

from ._address import Address
from ._framing import DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_PARTS, Buffer, Frame

if TYPE_CHECKING:  # ssl costs milliseconds to import; only the tls transport needs it
    import ssl


@dataclass(frozen=True, kw_only=True)
class TransportOptions:
    """Settings shared by every connection and listener of a transport.

    ``secret`` authenticates both ends; both must be given the same bytes, at least 16
    of them (128 bits) of random data.
    """

    secret: bytes
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_parts: int = DEFAULT_MAX_PARTS
    handshake_timeout: float = 10.0
    """Seconds a peer may take to complete the handshake (TLS included)."""
    hello_timeout: float = 3.0
    """Seconds an accepted connection has to send its first bytes (a peer with the secret
    sends its hello at once): a silent one is closed then, well before ``handshake_timeout``."""
    max_pending_handshakes: int = 64
    """Accepted connections a listener keeps in their handshake at once; a new one past
    that evicts the oldest of the source that holds the most (``_admission``). Bounds the
    descriptors a flood of unauthenticated connections can hold, without queueing the job's
    own peers behind it."""
    connect_timeout: float = 30.0
    close_timeout: float = 5.0
    """Seconds ``aclose`` spends flushing queued frames before dropping them."""
    ssl_context: ssl.SSLContext | None = None
    """For ``tls``: a server context on listeners, a client context on connect."""
    server_hostname: str | None = None
    """For ``tls`` connect: the name to verify (default: the address host)."""
    via: str | None = None
    """For ``tcp``/``tls`` connect: a gateway (``gateway://host:port``, see ``_gateway``)
    that dials the peer for us, for a client outside the peers' network. The handshake
    still runs with the peer, end to end."""

    def __post_init__(self) -> None:
        if not self.hello_timeout > 0:
            raise ValueError(f"hello_timeout must be positive, not {self.hello_timeout}")
        if self.max_pending_handshakes < 1:
            raise ValueError(
                f"max_pending_handshakes must be at least 1, not {self.max_pending_handshakes}"
            )


class ConnectionAttribute(TypedAttributeSet):
    """Typed extra attributes of a :class:`Connection` (``conn.extra(...)``)."""

    transport: str = typed_attribute()
    """The scheme of the transport carrying the connection."""
    local_address: Address = typed_attribute()
    remote_address: Address = typed_attribute()
    protocol_version: int = typed_attribute()
    raw_socket: socket.socket = typed_attribute()
    peer_credentials: tuple[int, int, int] = typed_attribute()
    """``(pid, uid, gid)`` of the peer process (unix only)."""
    ssl_object: ssl.SSLObject | ssl.SSLSocket = typed_attribute()
    """The TLS session (tls only)."""


class Connection(TypedAttributeProvider, ABC):
    """An authenticated, bidirectional stream of multipart frames.

    Frames arrive whole and in order. Sending queues a frame's buffers without
    copying large parts; the caller must not modify them until they are flushed.
    One task may receive at a time; any number may send.
    """

    @abstractmethod
    async def send(self, parts: Sequence[Buffer]) -> None:
        """Queue one frame and flush the queue to the socket."""

    @abstractmethod
    def send_nowait(self, parts: Sequence[Buffer]) -> None:
        """Queue one frame without I/O; a later :meth:`send` or :meth:`flush` writes it."""

    @abstractmethod
    async def flush(self) -> None:
        """Return once every frame queued before the call has been written."""

    def flush_nowait(self) -> bool:
        """Write what the socket takes right now, without waiting.

        Returns True when nothing is left queued; otherwise the rest needs a
        :meth:`flush`. Lets a sender skip a task switch when the socket has room.
        """
        return False

    def send_threadsafe(self, parts: Sequence[Buffer], timeout: float = 0.0) -> bool:
        """Queue one frame and write, blocking the calling thread up to ``timeout``, from
        any thread; returns whether nothing is left queued (the rest goes with the next
        write).

        For a sender whose event loop may be busy (heartbeats, sent from a thread of their
        own so that a long callback on the loop does not make the process look dead). Only
        safe where every other sender on the connection uses it too.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot send from other threads")

    @abstractmethod
    async def receive(self) -> Frame:
        """The next frame, as one memoryview per part.

        Raises :class:`~monarch.transport.ConnectionClosed` at end of stream and
        :class:`~monarch.transport.ProtocolError` (closing the connection) on a
        malformed frame.
        """

    @abstractmethod
    def receive_nowait(self) -> Frame:
        """A frame already read from the socket, or raise ``anyio.WouldBlock``."""

    def start_receiving(self, on_frames: Callable[[], object]) -> bool:
        """Read in push mode on the running asyncio loop, if this connection can.

        From then on the loop reads whenever the socket is readable, with no task
        switch per frame, and calls ``on_frames()`` (on the loop) when frames are ready
        to take with :meth:`receive_nowait`, and once more when the connection fails or
        closes: :meth:`receive_nowait` then raises what :meth:`receive` would have
        raised. :meth:`receive` is refused from then on. Returns False, changing
        nothing, where push mode is unavailable (trio, another transport): use
        :meth:`receive` there.
        """
        return False

    def pause_receiving(self) -> None:
        """Push mode: stop reading the socket until :meth:`resume_receiving` (on the loop).

        Frames already read stay available to :meth:`receive_nowait`; the peer's next
        frames wait in the kernel's buffers, and its writes stall once those are full:
        how a receiver that cannot keep up slows its sender down. Outside push mode it
        does nothing (a receiver pauses by not calling :meth:`receive`).
        """

    def resume_receiving(self) -> None:
        """Push mode: read the socket again after :meth:`pause_receiving` (on the loop)."""

    @property
    def unsent(self) -> int:
        """Bytes queued and not written yet (0 where the transport does not know)."""
        return 0

    def flush_for(self, seconds: float, keep: int = 0) -> bool:
        """Write, blocking the calling thread up to ``seconds``, until at most ``keep``
        bytes remain queued; returns whether it got there.

        For a sender that must slow down to its peer's pace where it cannot await (a
        synchronous ``send`` on the event loop's own thread). The default only writes
        what the socket takes now.
        """
        return self.flush_nowait() or self.unsent <= keep

    @abstractmethod
    async def aclose(self) -> None:
        """Flush (bounded by ``close_timeout``) and close. Idempotent."""

    @property
    @abstractmethod
    def closed(self) -> bool: ...

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> Connection:
        return self

    async def __anext__(self) -> Frame:
        from ._errors import ConnectionClosed

        try:
            return await self.receive()
        except ConnectionClosed:
            raise StopAsyncIteration from None


ConnectionHandler = Callable[[Connection], Awaitable[object]]


class Listener(ABC):
    """Accepts connections on an address; hands out only authenticated ones."""

    @property
    @abstractmethod
    def address(self) -> Address:
        """The bound address, with the real port when port 0 was asked for."""

    @abstractmethod
    async def serve(self, handler: ConnectionHandler, task_group: TaskGroup | None = None) -> None:
        """Accept forever, calling ``handler(conn)`` in a new task for each connection.

        A peer that fails the handshake is closed with a logged reason and never
        reaches the handler; an exception escaping the handler is logged and closes
        only that connection. The connection is closed when the handler returns.
        """

    @abstractmethod
    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Transport(ABC):
    """A way to reach peers, registered under the ``monarch.transports`` entry points."""

    scheme: ClassVar[str]

    @abstractmethod
    def check_address(self, address: Address) -> Address:
        """Validate (and normalize) an address of this transport's scheme."""

    @abstractmethod
    async def connect(self, address: Address, options: TransportOptions) -> Connection:
        """Open an authenticated connection to a listener at ``address``."""

    @abstractmethod
    async def listen(self, address: Address, options: TransportOptions) -> Listener:
        """Bind and listen at ``address`` (port 0: any free port)."""
