"""The interfaces every transport implements (re-exported by ``monarch.transport.abc``)."""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from anyio import TypedAttributeProvider, TypedAttributeSet, typed_attribute
from anyio.abc import AsyncResource, TaskGroup

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


class FrameQueue(ABC):
    """The fast send path a connection may offer (``ConnectionAttribute.frame_queue``).

    ``Connection.send`` writes one frame and waits; a sender of many small frames (a
    runtime's writer to a peer) queues them here without I/O and writes them in one
    system call, skips the task switch when the socket has room, and may write from
    another thread (heartbeats that must go out while the event loop is busy).
    """

    @abstractmethod
    def send_nowait(self, parts: Sequence[Buffer]) -> None:
        """Queue one frame without I/O; a later :meth:`flush` (or ``send``) writes it."""

    @abstractmethod
    async def flush(self) -> None:
        """Return once every frame queued before the call has been written."""

    @abstractmethod
    def flush_nowait(self) -> bool:
        """Write what the socket takes right now, without waiting.

        Returns True when nothing is left queued; otherwise the rest needs a
        :meth:`flush`. Lets a sender skip a task switch when the socket has room.
        """

    @abstractmethod
    def send_threadsafe(self, parts: Sequence[Buffer], timeout: float = 0.0) -> bool:
        """Queue one frame and write, blocking the calling thread up to ``timeout``, from
        any thread; returns whether nothing is left queued (the rest goes with the next
        write).

        For a sender whose event loop may be busy (heartbeats, sent from a thread of their
        own so that a long callback on the loop does not make the process look dead). Only
        safe where every other sender on the connection uses it too.
        """

    @property
    @abstractmethod
    def unsent(self) -> int:
        """Bytes queued and not written yet."""

    @abstractmethod
    def flush_for(self, seconds: float, keep: int = 0) -> bool:
        """Write, blocking the calling thread up to ``seconds``, until at most ``keep``
        bytes remain queued; returns whether it got there.

        For a sender that must slow down to its peer's pace where it cannot await (a
        synchronous ``send`` on the event loop's own thread).
        """


class PushReceiver(ABC):
    """Reading in the event loop's readiness callbacks, which a connection may offer
    (``ConnectionAttribute.push_receiver``): no task switch per frame, and a receiver that
    cannot keep up leaves the peer's frames in the kernel's buffers."""

    @abstractmethod
    def receive_nowait(self) -> Frame:
        """A frame already read from the socket, or raise ``anyio.WouldBlock``."""

    def frames_ready(self) -> bool:
        """False only when :meth:`receive_nowait` would raise ``anyio.WouldBlock`` now: a
        receiver that has taken every frame stops without an exception (here: True, try)."""
        return True

    @abstractmethod
    def start_receiving(self, on_frames: Callable[[], object]) -> bool:
        """Read in push mode on the running asyncio loop, if the running loop allows.

        From then on the loop reads whenever the socket is readable and calls
        ``on_frames()`` (on the loop) when frames are ready to take with
        :meth:`receive_nowait`, and once more when the connection fails or closes:
        :meth:`receive_nowait` then raises what ``receive`` would have raised. ``receive``
        is refused from then on. Returns False, changing nothing, where the running loop
        cannot (trio): use ``receive`` there.
        """

    @abstractmethod
    def pause_receiving(self) -> None:
        """Push mode: stop reading the socket until :meth:`resume_receiving` (on the loop).

        Frames already read stay available to :meth:`receive_nowait`; the peer's next
        frames wait in the kernel's buffers, and its writes stall once those are full:
        how a receiver that cannot keep up slows its sender down. Outside push mode it
        does nothing.
        """

    @abstractmethod
    def resume_receiving(self) -> None:
        """Push mode: read the socket again after :meth:`pause_receiving` (on the loop)."""

    @property
    @abstractmethod
    def closed(self) -> bool:
        """The connection is closed (by either end, or failed)."""


class ConnectionAttribute(TypedAttributeSet):
    """Typed extra attributes of a :class:`Connection` (``conn.extra(...)``).

    A connection offers those it has; ``conn.extra(attribute, None)`` asks without
    raising ``anyio.TypedAttributeLookupError`` for one it lacks.
    """

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
    frame_queue: FrameQueue = typed_attribute()
    """The fast send path (``FrameQueue``), where the connection has one."""
    push_receiver: PushReceiver = typed_attribute()
    """Push-mode reading (``PushReceiver``), where the connection has it."""


class Connection(TypedAttributeProvider, AsyncResource):
    """An authenticated, bidirectional stream of multipart frames: the contract every
    transport meets (``send``, ``receive``, ``aclose`` and typed extra attributes, as
    anyio's streams; ``async with`` closes it, as anyio's ``AsyncResource``).

    Frames arrive whole and in order. Sending does not copy large parts; the caller
    must not modify them until ``send`` returns. One task may receive at a time; any
    number may send. What a connection can do beyond this (a queue of frames written in
    one call, push-mode reading) it offers as capabilities among its extra attributes
    (``ConnectionAttribute.frame_queue``, ``ConnectionAttribute.push_receiver``).
    """

    @abstractmethod
    async def send(self, parts: Sequence[Buffer]) -> None:
        """Write one frame (and whatever a capability queued before it)."""

    @abstractmethod
    async def receive(self) -> Frame:
        """The next frame, as one memoryview per part.

        Raises :class:`~monarch.transport.ConnectionClosed` at end of stream and
        :class:`~monarch.transport.ProtocolError` (closing the connection) on a
        malformed frame.
        """

    @abstractmethod
    async def aclose(self) -> None:
        """Flush (bounded by ``close_timeout``) and close. Idempotent."""

    def __aiter__(self) -> Connection:
        return self

    async def __anext__(self) -> Frame:
        from ._errors import ConnectionClosed

        try:
            return await self.receive()
        except ConnectionClosed:
            raise StopAsyncIteration from None


ConnectionHandler = Callable[[Connection], Awaitable[object]]


class Listener(AsyncResource):
    """Accepts connections on an address; hands out only authenticated ones (``async
    with`` closes it)."""

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
