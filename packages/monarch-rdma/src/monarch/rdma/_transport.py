"""The ``ibverbs://`` transport: TCP frames, their large parts moved by RDMA READ.

A job selects it as it selects ``tcp`` (``enable_transport("ibverbs")``,
``configure(default_transport="ibverbs")``, ``MONARCH_TRANSPORT=ibverbs``): procs listen at
``ibverbs://host:port``. A connection is a TCP one (``TcpTransport``: its handshake, frame
MACs, push mode); right after the handshake each end sends a hello saying whether it has an
ibverbs device (``_verbs.device()``: pyverbs, a device, not ``rdma_disable_ibverbs``) and,
if so, the queue pair it made for this connection. Where either end has none, the
connection *is* the TCP one, nothing added: the fallback is plain TCP.

Where both have one, the two queue pairs are connected and every frame gets a leading
control part: empty for a frame sent as it is, else an ``Offer`` naming its parts of
``PART_MIN`` bytes or more (the out-of-band buffers of a message), which travel as empty
parts. Those parts are lent as every bulk-data loan is, with monarch-core's ``Lender``
(``monarch.core.lowlevel``) through a plane, here the connection's own (``_link``): it
registers each part's memory, readable by RDMA READ only, in the connection's own
protection domain, and the lender keeps the memory alive; the offer carries each loan's
key, address, ``rkey`` and length, inside the already-authenticated frame. The receiver
reads each through its end of that plane into a fresh buffer (on a thread: the loop goes
on), hands the frame up with those buffers as its parts, in order with the frames around
it, and sends back ``Done`` with the keys: the sender gives them back to its lender, which
has the plane deregister them (as it does all still lent when the connection ends). A read
that fails (the peer died: its queue pair stops answering; a region gone) fails the
connection with a logged reason.

As on TCP, a sender must not change a part's memory until it is done with: here that is
until the receiver has read it, not merely until it was written to the socket. ``Done``
frames are processed while the sending end receives from its connection (monarch-core's
writers always do, for the peer's heartbeats); they are sent with ``send_threadsafe`` (of the
TCP connection's ``FrameQueue``), as monarch-core's receiving end sends everything.
"""

from __future__ import annotations

import asyncio
import logging
import select
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final, TypeVar

import anyio
import msgspec
from anyio.abc import TaskGroup

from monarch.core import buffer_address
from monarch.core.lowlevel import Lender, bulk_executor
from monarch.transport import (
    Address,
    Buffer,
    Connection,
    ConnectionAttribute,
    ConnectionClosed,
    ConnectionHandler,
    Frame,
    FrameQueue,
    FrameTooLarge,
    HandshakeError,
    Listener,
    ProtocolError,
    PushReceiver,
    TransportError,
    TransportOptions,
)
from monarch.transport.lowlevel import TcpTransport, fresh_bytearray

from . import _verbs as verbs
from ._errors import RDMAOwnerDied
from ._link import LinkPlane, lent_part

log = logging.getLogger("monarch.rdma")

PART_MIN: Final = 1024 * 1024
"""Parts of this size or more move by RDMA (monarch-core lends buffers between processes of
one host from the same size, ``_lending.LEND_MIN``)."""
HELLO_MAGIC: Final = b"monarch-ibverbs\x00"
VERSION: Final = 1
READ_SECONDS: Final = 60.0
"""A read's deadline, plus a second per ``READ_PER_SECOND`` bytes; a dead peer ends it
sooner (its queue pair's retries run out, or the TCP connection closes)."""
READ_PER_SECOND: Final = 64 * 1024 * 1024

_E = TypeVar("_E", bound=TransportError)


class Hello(msgspec.Struct, tag="hello", forbid_unknown_fields=True):
    """Each end's first frame: its queue pair for this connection (0 and "": no device)."""

    version: int
    qpn: int
    gid: str


class Offer(msgspec.Struct, tag="offer", forbid_unknown_fields=True):
    """Parts of this frame lent to the receiver: (index, key, address, rkey, length) each."""

    parts: list[tuple[int, int, int, int, int]]


class Done(msgspec.Struct, tag="done", forbid_unknown_fields=True):
    """The receiver has read these lent parts: the sender gives their keys back."""

    keys: list[int]


_encode = msgspec.msgpack.Encoder().encode
_decode_hello = msgspec.msgpack.Decoder(Hello).decode
_decode_control = msgspec.msgpack.Decoder(Offer | Done).decode

_stats_lock = threading.Lock()
_stats = {"offered_parts": 0, "offered_bytes": 0, "read_parts": 0, "read_bytes": 0}


def transport_stats() -> dict[str, int]:
    """Parts (and bytes) this process offered and read by RDMA over the transport."""
    with _stats_lock:
        return dict(_stats)


def _count(**added: int) -> None:
    with _stats_lock:
        for name, value in added.items():
            _stats[name] += value


def _nothing() -> None:
    pass


def _size(part: Buffer) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


class _Read:
    """An offered frame being read (on a reader thread): its parts once done, or why not."""

    def __init__(self, parts: Frame, offers: list[tuple[int, int, int, int, int]]) -> None:
        self.parts: list[memoryview] = list(parts)
        self.offers = offers
        self.keys = [offer[1] for offer in offers]
        self.size = sum(offer[4] for offer in offers)
        self.error: BaseException | None = None
        self.done = threading.Event()


class IbverbsConnection(Connection, FrameQueue, PushReceiver):
    """A TCP connection whose large parts move by RDMA READ (see the module docstring);
    like the TCP one, its own fast path and push receiver."""

    def __init__(
        self,
        inner: Connection,
        options: TransportOptions,
        nic: verbs.Device,
        link: verbs.Connection,
    ) -> None:
        self._inner = inner
        self._queue = inner.extra(ConnectionAttribute.frame_queue)
        self._push = inner.extra(ConnectionAttribute.push_receiver)
        self._attributes: dict[Any, Callable[[], Any]] = {
            **inner.extra_attributes,
            # Weakly: a failed connection is freed by reference counts, with no cycle.
            ConnectionAttribute.frame_queue: weakref.ref(self),
            ConnectionAttribute.push_receiver: weakref.ref(self),
        }
        self._options = options
        self._plane = LinkPlane(nic, link, self._hung_up)
        self._lender = Lender()
        """What we lent the peer over this connection (borrower ``""``: there is one)."""
        self._ready: deque[Frame | _Read] = deque()
        self._failure: TransportError | None = None
        self._on_frames: Callable[[], object] = _nothing
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def extra_attributes(self) -> Any:
        return self._attributes

    @property
    def closed(self) -> bool:
        return self._push.closed

    def __repr__(self) -> str:
        return f"<IbverbsConnection over {self._inner!r}>"

    # -- sending ----------------------------------------------------------------------------

    def _wrap(self, parts: Sequence[Buffer]) -> list[Buffer]:
        """``parts`` behind their control part, the large ones offered (registered here)."""
        if self._failure is not None:
            raise ConnectionClosed(f"connection failed: {self._failure}")
        sizes = [_size(part) for part in parts]
        total = sum(sizes)
        if total > self._options.max_frame_size:
            raise FrameTooLarge(
                f"frame of {total} bytes exceeds max_frame_size={self._options.max_frame_size}"
            )
        if len(parts) > self._options.max_parts:
            raise FrameTooLarge(
                f"frame has {len(parts)} parts, more than max_parts={self._options.max_parts}"
            )
        if max(sizes, default=0) < PART_MIN:
            return [b"", *parts]
        out: list[Buffer] = [b"", *parts]
        offers: list[tuple[int, int, int, int, int]] = []
        for index, (part, size) in enumerate(zip(parts, sizes, strict=True)):
            if size < PART_MIN:
                continue
            view = part if isinstance(part, memoryview) else memoryview(part)
            if not view.c_contiguous:
                continue
            lent = self._lender.lend(view, "", self._plane)
            if lent is None:  # the plane could not register it: sent inline
                continue
            key, reach = lent
            assert reach is not None
            offers.append((index, key, buffer_address(view), reach[0], size))
            out[index + 1] = b""
        if offers:
            out[0] = _encode(Offer(offers))
            _count(offered_parts=len(offers), offered_bytes=sum(o[4] for o in offers))
        return out

    def _withdraw(self, frame: Sequence[Buffer]) -> None:
        """A wrapped frame was not queued: what it offered is ours again."""
        if frame and frame[0]:
            offer = _decode_control(frame[0])
            if isinstance(offer, Offer):
                self._lender.give_back([o[1] for o in offer.parts])

    def send_nowait(self, parts: Sequence[Buffer]) -> None:
        frame = self._wrap(parts)
        try:
            self._queue.send_nowait(frame)
        except BaseException:
            self._withdraw(frame)
            raise

    async def send(self, parts: Sequence[Buffer]) -> None:
        self.send_nowait(parts)
        await self._queue.flush()

    def send_threadsafe(self, parts: Sequence[Buffer], timeout: float = 0.0) -> bool:
        frame = self._wrap(parts)
        try:
            return self._queue.send_threadsafe(frame, timeout)
        except BaseException:
            self._withdraw(frame)
            raise

    async def flush(self) -> None:
        await self._queue.flush()

    def flush_nowait(self) -> bool:
        return self._queue.flush_nowait()

    @property
    def unsent(self) -> int:
        return self._queue.unsent

    def flush_for(self, seconds: float, keep: int = 0) -> bool:
        return self._queue.flush_for(seconds, keep)

    # -- receiving --------------------------------------------------------------------------

    def _admit(self, frame: Frame) -> None:
        """Take a frame from the TCP connection: a plain one is ready, an offered one is
        read (started now), a ``Done`` gives memory back."""
        if not frame:
            raise self._violation(ProtocolError("a frame without its control part"))
        control = frame[0]
        if not control:
            self._ready.append(frame[1:])
            return
        try:
            message = _decode_control(control)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise self._violation(ProtocolError(f"malformed control part: {error}")) from None
        if isinstance(message, Done):
            self._lender.give_back(message.keys)
            return
        parts = frame[1:]
        self._check(message, parts)
        read = _Read(parts, message.parts)
        self._ready.append(read)
        # The urgent lane of the one bulk-data executor: a frame is handed up once its parts
        # are read and the frames behind it wait for it, among them the answers operations
        # in the bounded lane wait for; queued behind them, a read would wait on them.
        bulk_executor().submit_urgent(self._read, read)

    def _check(self, offer: Offer, parts: Frame) -> None:
        """Refuse an offer that does not describe this frame within our limits."""
        seen: set[int] = set()
        total = sum(len(part) for part in parts)
        for index, _key, _address, _rkey, length in offer.parts:
            if not 0 <= index < len(parts) or index in seen or len(parts[index]):
                raise self._violation(ProtocolError(f"an offer names part {index} wrongly"))
            if length < 1:
                raise self._violation(ProtocolError(f"an offer of {length} bytes"))
            seen.add(index)
            total += length
        if total > self._options.max_frame_size:
            raise self._violation(
                FrameTooLarge(
                    f"an offered frame of {total} bytes exceeds "
                    f"max_frame_size={self._options.max_frame_size}"
                )
            )

    def _read(self, read: _Read) -> None:
        """On a reader thread: read each lent part into a fresh buffer, by RDMA READ over
        the connection's plane."""
        deadline = time.monotonic() + READ_SECONDS + read.size / READ_PER_SECOND
        try:
            for index, key, address, rkey, length in read.offers:
                buf = fresh_bytearray(length)
                self._plane.read(
                    lent_part(key, address, length, rkey), buffer_address(buf), deadline
                )
                read.parts[index] = memoryview(buf)
            _count(read_parts=len(read.offers), read_bytes=read.size)
        except BaseException as error:  # noqa: BLE001 - the connection fails with it
            read.error = error
        finally:
            read.done.set()
            loop = self._loop
            if loop is not None:
                try:
                    loop.call_soon_threadsafe(self._read_done)
                except RuntimeError:  # the loop is closed: nobody to tell
                    pass

    def _hung_up(self) -> Callable[[], bool]:
        """Whether the peer has gone, asked between completion polls: our connection closed,
        or its socket hung up by the peer (a process that died closes it; seen at once,
        even behind frames not read yet, where its queue pair may never answer)."""
        raw = self._inner.extra(ConnectionAttribute.raw_socket, None)
        if raw is None or raw.fileno() < 0:
            return lambda: self._push.closed
        poll = select.poll()
        poll.register(raw.fileno(), select.POLLRDHUP)
        ended = select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL

        def gone() -> bool:
            return self._push.closed or any(mask & ended for _, mask in poll.poll(0))

        return gone

    def _read_done(self) -> None:
        if self._ready and isinstance(self._ready[0], _Read) and self._ready[0].done.is_set():
            self._on_frames()

    def receive_nowait(self) -> Frame:
        while True:
            if self._ready:
                head = self._ready[0]
                if not isinstance(head, _Read):
                    return self._ready.popleft()  # type: ignore[return-value]
                if not head.done.is_set():
                    raise anyio.WouldBlock
                self._ready.popleft()
                if head.error is not None:
                    raise self._read_failed(head)
                self._acknowledge(head.keys)
                return head.parts
            if self._failure is not None:
                raise ConnectionClosed(f"connection failed: {self._failure}")
            self._admit(self._push.receive_nowait())

    async def receive(self) -> Frame:
        while True:
            try:
                return self.receive_nowait()
            except anyio.WouldBlock:
                pass
            if self._ready:  # a read in progress
                await anyio.to_thread.run_sync(self._ready[0].done.wait, abandon_on_cancel=True)  # type: ignore[union-attr]
                continue
            self._admit(await self._inner.receive())

    def start_receiving(self, on_frames: Callable[[], object]) -> bool:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._on_frames = on_frames
        self._loop = loop
        if not self._push.start_receiving(on_frames):
            self._on_frames = _nothing
            return False
        return True

    def pause_receiving(self) -> None:
        self._push.pause_receiving()

    def resume_receiving(self) -> None:
        self._push.resume_receiving()

    def _acknowledge(self, keys: list[int]) -> None:
        """Tell the sender it may let go of what we read (thread-safely, see above)."""
        try:
            if self._queue.send_threadsafe([_encode(Done(keys))]):
                return
        except TransportError:
            return  # the connection is gone: so are the sender's regions
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not asyncio: the rest goes with the next write
        self._spawn(loop, self._flush_quietly())

    async def _flush_quietly(self) -> None:
        try:
            await self._queue.flush()
        except TransportError:
            pass

    def _spawn(self, loop: asyncio.AbstractEventLoop, coro: Any) -> None:
        task = loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _read_failed(self, read: _Read) -> TransportError:
        why = read.error
        said = "the sender closed the connection or died" if isinstance(why, RDMAOwnerDied) else why
        reason = f"RDMA read of an offered {read.size}-byte message failed: {said}"
        log.warning("closing connection to %s: %s", self._peer(), reason)
        return self._fail(ConnectionClosed(reason))

    def _violation(self, error: ProtocolError) -> ProtocolError:
        log.warning("closing connection to %s: %s", self._peer(), error)
        return self._fail(error)

    def _fail(self, error: _E) -> _E:
        """Fail the connection with ``error`` (returned, to raise): nothing more is read."""
        if self._failure is None:
            self._failure = error
        self._ready.clear()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self._spawn(loop, self.aclose())
        else:
            raw = self._inner.extra(ConnectionAttribute.raw_socket, None)
            if raw is not None:  # the socket ends; aclose releases the rest
                try:
                    raw.shutdown(2)
                except OSError:
                    pass
        return error

    def _peer(self) -> str:
        return str(self._inner.extra(ConnectionAttribute.remote_address, "?"))

    # -- closing ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        await self._inner.aclose()
        if not self._plane.closed and not self._plane.close_now():
            with anyio.CancelScope(shield=True):  # a read ends soon: our connection is closed
                await anyio.to_thread.run_sync(self._plane.close)
        self._lender.forget("")  # the plane has let go of every part: so do we


async def _upgrade(conn: Connection, options: TransportOptions) -> Connection:
    """Exchange hellos on a fresh connection: ``conn`` itself where an end has no device,
    else the connection with RDMA parts over two connected queue pairs."""
    nic = verbs.device()
    link = None
    if nic is not None:
        try:
            link = nic.open_link()
        except Exception as error:  # noqa: BLE001 - out of queue pairs...: plain TCP
            log.warning("no queue pair for a connection (%s): its parts go by TCP", error)
    try:
        mine = Hello(VERSION, 0, "")
        if link is not None and nic is not None:
            mine = Hello(VERSION, int(link.qp.qp_num), nic.gid)
        with anyio.fail_after(options.handshake_timeout):
            await conn.send([HELLO_MAGIC + _encode(mine)])
            frame = await conn.receive()
        if len(frame) != 1 or bytes(frame[0][: len(HELLO_MAGIC)]) != HELLO_MAGIC:
            raise HandshakeError("the peer sent no ibverbs hello (is it an ibverbs:// listener?)")
        try:
            theirs = _decode_hello(frame[0][len(HELLO_MAGIC) :])
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise HandshakeError(f"malformed ibverbs hello: {error}") from None
        if nic is None or link is None or not theirs.qpn:
            if link is not None:
                verbs.close_link(link)
            return conn
        nic.connect_link(link, theirs.qpn, theirs.gid)
    except BaseException as error:
        if link is not None:
            verbs.close_link(link)
        await conn.aclose()
        if isinstance(error, TimeoutError):
            raise HandshakeError(f"no ibverbs hello within {options.handshake_timeout}s") from None
        if isinstance(error, TransportError) and not isinstance(error, HandshakeError):
            raise HandshakeError(f"connection lost in the ibverbs hello: {error}") from error
        raise
    return IbverbsConnection(conn, options, nic, link)


class IbverbsListener(Listener):
    """A TCP listener whose connections say hello (see ``_upgrade``) before the handler."""

    def __init__(self, inner: Listener, options: TransportOptions) -> None:
        self._inner = inner
        self._options = options

    @property
    def address(self) -> Address:
        return self._inner.address

    def __repr__(self) -> str:
        return f"<IbverbsListener {self.address}>"

    async def serve(self, handler: ConnectionHandler, task_group: TaskGroup | None = None) -> None:
        async def upgraded(conn: Connection) -> None:
            try:
                ready = await _upgrade(conn, self._options)
            except TransportError as error:
                log.warning("closing connection to %s: %s", self.address, error)
                return
            if ready is conn:
                await handler(conn)
                return
            async with ready:
                await handler(ready)

        await self._inner.serve(upgraded, task_group)

    async def aclose(self) -> None:
        await self._inner.aclose()


class IbverbsTransport(TcpTransport):
    """``ibverbs://host:port``: see the module docstring."""

    scheme = "ibverbs"

    @staticmethod
    def _tcp_options(options: TransportOptions) -> TransportOptions:
        """The TCP connection's: one part more per frame, the control part."""
        return replace(options, max_parts=options.max_parts + 1)

    async def connect(self, address: Address, options: TransportOptions) -> Connection:
        conn = await super().connect(address, self._tcp_options(options))
        return await _upgrade(conn, options)

    async def listen(self, address: Address, options: TransportOptions) -> Listener:
        inner = await super().listen(address, self._tcp_options(options))
        return IbverbsListener(inner, options)
