"""The TCP plane: buffers between hosts without ibverbs, over several streams at once.

Each process that registers a buffer runs a data server (a listening socket and a thread
per connection). A peer connects, both prove they hold the job's secret with the
transports' own handshake (``monarch.transport.lowlevel.Handshake``: HMAC challenge and
response each way over the whole transcript, the peer first; the server lets the peer read
and write its memory, the peer trusts the bytes it gets), then sends requests on the
connection: read or write so many bytes at an offset of a buffer. Bytes go from the
buffer's memory to the socket and from the socket to the destination's memory with no copy
in between (``sendall``/``recv_into`` on views of the memory). A transfer is cut into
chunks (``_chunks``) that a few streams take in turn, each stream its own connection and
thread; connections are kept for the next transfer.

Every request and answer after the handshake carries a tag under the keys the handshake
derived for each direction (``_seal``): a request is checked before it is acted on, bytes
where they land. The bytes are not encrypted: the plane is as private as the network
between the hosts. Where both ends have ``rdma_tcp_integrity`` off (a network trusted as
the machines are), the bytes go untagged (requests and answers still are): each end says
its choice in the connection's first tagged message, and the bytes are tagged unless both
said no."""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Literal

from monarch.core.lowlevel import unpin_this_thread
from monarch.transport import AuthenticationError, HandshakeError
from monarch.transport.lowlevel import Admission, Handshake

from ._errors import (
    RDMABufferDropped,
    RDMAError,
    RDMAOwnerDied,
    RDMATimeoutError,
    RDMATransferError,
)
from ._region import Region
from ._seal import SLICE, TAG_SIZE, Behind, Seal, Tagger

if TYPE_CHECKING:
    from monarch.core.lowlevel import Executor

Buffer = bytes | bytearray | memoryview

log = logging.getLogger("monarch.rdma")

READ: Final = 1
WRITE: Final = 2
HEADER: Final = struct.Struct("<BQQQ")
"""A request: op, buffer id, offset, length."""
OK: Final = 0
DROPPED: Final = 1
OUT_OF_RANGE: Final = 2
READ_ONLY: Final = 3
BAD_OP: Final = 4
ALTERED: Final = 5
"""A write's bytes did not match their tag (changed on the way): not to be trusted."""
_CHOICE: Final = b"monarch-rdma tags the bytes "
"""What a connection's first tagged message (each end's choice) covers besides it."""
HANDSHAKE_TIMEOUT: Final = 30.0
MAX_PENDING_HANDSHAKES: Final = 64
"""Data connections a server keeps before their proof of the secret (see ``_accept``)."""
DRAIN: Final = 1024 * 1024
_TIMEVAL: Final = struct.Struct("@ll")


def _handshake(
    sock: socket.socket, role: Literal["client", "server"], secret: bytes, integrity: bool
) -> tuple[Seal, Seal]:
    """Prove the job's secret both ways with the transports' ``Handshake`` (the very
    protocol of a monarch connection, sans I/O, here over a blocking socket), then say
    under its keys whether we tag the bytes (they are unless both ends say no); returns
    the (requests, answers) seals. Raises ``HandshakeError`` or ``OSError``."""
    shake = Handshake(role, secret)
    while True:
        out = shake.data_to_send()
        if out:
            sock.sendall(out)
        if not shake.wants_more:
            break
        data = sock.recv(4096)
        if not data:
            raise ConnectionResetError("the peer closed the connection in the handshake")
        try:
            shake.receive_data(data)
        except HandshakeError:
            with contextlib.suppress(OSError):  # its Reject, if any: best effort
                sock.sendall(shake.data_to_send())
            raise
    keys = shake.frame_keys
    assert keys is not None  # no TLS channel binding here
    if role == "client":
        requests, answers = Seal(keys.send), Seal(keys.receive)
        ours, theirs = requests, answers
    else:
        requests, answers = Seal(keys.receive), Seal(keys.send)
        ours, theirs = answers, requests
    choice = b"\x01" if integrity else b"\x00"
    sock.sendall(choice + ours.tag(_CHOICE + choice))
    said = bytearray(shake.leftover)
    while len(said) < 1 + TAG_SIZE:
        data = sock.recv(1 + TAG_SIZE - len(said))
        if not data:
            raise ConnectionResetError("the peer closed the connection in the handshake")
        said += data
    if len(said) != 1 + TAG_SIZE or not theirs.check(bytes(said[1:]), _CHOICE + said[:1]):
        raise AuthenticationError("the peer's choice of tagging the bytes is forged")
    requests.covers_data = answers.covers_data = integrity or said[:1] != b"\x00"
    return requests, answers


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view``. The sockets are in blocking mode (their deadline is the kernel's
    ``SO_RCVTIMEO``), so MSG_WAITALL takes a whole chunk in one call: one release of the
    GIL per chunk rather than one per 64 KiB that a polling socket would cost."""
    got = 0
    size = view.nbytes
    while got < size:
        try:
            n = sock.recv_into(view[got:], size - got, socket.MSG_WAITALL)
        except BlockingIOError:
            raise TimeoutError("timed out receiving") from None
        if n == 0:
            raise ConnectionResetError("the peer closed the connection")
        got += n


def _set_deadline(sock: socket.socket, deadline: float) -> None:
    """Make the kernel end a blocked send or receive at ``deadline``."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline has passed")
    whole = int(left)
    micros = max(1, int((left - whole) * 1e6)) if whole == 0 else int((left - whole) * 1e6)
    value = _TIMEVAL.pack(whole, micros)  # (0, 0) would mean no timeout at all
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _send(sock: socket.socket, data: Buffer) -> None:
    try:
        sock.sendall(data)
    except BlockingIOError:
        raise TimeoutError("timed out sending") from None


class _Pending:
    """A data connection before its proof, as ``Admission`` evicts it: shut down, so that
    the read its thread is blocked in returns."""

    __slots__ = ("conn",)

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn

    def cancel(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)


class DataServer:
    """This process's TCP data server: serves the buffers ``lookup`` finds."""

    def __init__(
        self,
        host: str,
        secret: bytes,
        lookup: Callable[[int], Region | None],
        integrity: bool = True,
    ) -> None:
        self._secret = secret
        self._integrity = integrity
        self._lookup = lookup
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, 0), family=family, backlog=64)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._closed = False
        self._admission = Admission(MAX_PENDING_HANDSHAKES, f"rdma-tcp://{host}:{self.port}")
        threading.Thread(target=self._accept, name="monarch-rdma-tcp", daemon=True).start()

    def _accept(self) -> None:
        """A thread per connection, at most ``MAX_PENDING_HANDSHAKES`` of them before their
        proof of the secret (``Admission``: a flood of silent connections evicts its own
        oldest, it neither holds a thread each nor locks the job's peers out)."""
        unpin_this_thread()  # and its connections' threads: not the loop's one CPU
        while not self._closed:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            pending = _Pending(conn)
            self._admission.admit(str(peer[0]), pending)
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                threading.Thread(
                    target=self._serve,
                    args=(conn, pending),
                    name="monarch-rdma-tcp-conn",
                    daemon=True,
                ).start()
            except (OSError, RuntimeError) as error:  # gone already; no thread to be had
                self._admission.release(pending)
                conn.close()
                log.warning("closed an RDMA data connection at once: %s", error)

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    def _handshake(self, conn: socket.socket) -> tuple[Seal, Seal] | None:
        """The seals of the connection (requests in, answers out), or None if refused."""
        conn.settimeout(HANDSHAKE_TIMEOUT)
        try:
            seals = _handshake(conn, "server", self._secret, self._integrity)
        except HandshakeError as error:
            log.warning("refused an RDMA data connection: %s", error)
            return None
        conn.settimeout(None)  # blocking: see _recv_exact
        return seals

    def _serve(self, conn: socket.socket, pending: _Pending) -> None:
        header = bytearray(HEADER.size + TAG_SIZE)
        with conn:
            try:
                try:
                    seals = self._handshake(conn)
                finally:
                    self._admission.release(pending)
                if seals is None:
                    return
                requests, answers = seals
                while True:
                    try:
                        _recv_exact(conn, memoryview(header))
                    except ConnectionResetError:
                        return  # the peer is done with this stream
                    head, tag = bytes(header[: HEADER.size]), bytes(header[HEADER.size :])
                    if not requests.check(tag, head):
                        log.warning("dropped an RDMA data connection: a forged request")
                        return
                    op, buffer_id, offset, length = HEADER.unpack(head)
                    if not self._request(conn, requests, answers, op, buffer_id, offset, length):
                        return
            except OSError as error:
                log.debug("RDMA data connection ended: %s", error)

    def _request(
        self,
        conn: socket.socket,
        requests: Seal,
        answers: Seal,
        op: int,
        buffer_id: int,
        offset: int,
        length: int,
    ) -> bool:
        """Serve one authenticated request; False: the connection must end."""
        region = self._lookup(buffer_id)
        status = OK
        if op not in (READ, WRITE):
            status = BAD_OP
        elif region is None:
            status = DROPPED
        elif offset + length > region.size:
            status = OUT_OF_RANGE
        elif op == WRITE and not region.writable:
            status = READ_ONLY
        if op == READ or status == BAD_OP:
            data = region.view(offset, length) if status == OK and region is not None else None
            _answer(conn, answers, status, data)
            return status != BAD_OP
        tag = bytearray(TAG_SIZE)
        if status == OK and region is not None:
            tagger = requests.start(b"data")
            if length:
                _recv_tagged(conn, region.view(offset, length), tagger)
            _recv_exact(conn, memoryview(tag))
            if not hmac.compare_digest(bytes(tag), tagger.digest(length > 0)):
                log.warning("refused an RDMA write: its bytes did not authenticate")
                _answer(conn, answers, ALTERED)
                return False
        else:  # refused: its bytes go nowhere, their tag is counted, not checked
            left = length
            sink = memoryview(bytearray(min(length, DRAIN) or 1))
            while left:
                n = min(left, sink.nbytes)
                _recv_exact(conn, sink[:n])
                left -= n
            _recv_exact(conn, memoryview(tag))
            requests.skip()
        _answer(conn, answers, status)
        return True


def _answer(
    conn: socket.socket, answers: Seal, status: int, data: memoryview | None = None
) -> None:
    head = bytes([status])
    tagger = answers.start(head)
    has_data = data is not None and data.nbytes > 0
    if not tagger.covers_data:
        # The tag does not depend on the bytes: status, bytes and tag in one call, so
        # the reader's first wake-up brings bytes, not a lone status byte.
        parts: list[Buffer] = [head]
        if data is not None and has_data:
            parts.append(data)
        parts.append(tagger.digest(has_data))
        _send_all(conn, parts)
        return
    _send(conn, head)
    if data is not None and has_data:
        _send_tagged(conn, data, tagger)
    _send(conn, tagger.digest(has_data))


def _send_all(sock: socket.socket, parts: list[Buffer]) -> None:
    """``sendall`` of several buffers, one ``sendmsg`` while the kernel takes them whole."""
    views = [memoryview(part).cast("B") for part in parts]
    try:
        while views:
            sent = sock.sendmsg(views)
            while views and sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            if views and sent:
                views[0] = views[0][sent:]
    except BlockingIOError:
        raise TimeoutError("timed out sending") from None


def _send_tagged(sock: socket.socket, data: memoryview, tagger: Tagger) -> None:
    if not tagger.covers_data:
        _send(sock, data)  # in one call: no slices to hash between
        return
    if data.nbytes <= SLICE:
        tagger.update(data)
        _send(sock, data)
        return
    behind = Behind(tagger)
    try:
        for start in range(0, data.nbytes, SLICE):
            piece = data[start : start + SLICE]
            behind.update(piece)  # tagged while the kernel takes it
            _send(sock, piece)
    finally:
        behind.wait()


def _recv_tagged(sock: socket.socket, into: memoryview, tagger: Tagger) -> None:
    if not tagger.covers_data:
        _recv_exact(sock, into)
        return
    if into.nbytes <= SLICE:
        _recv_exact(sock, into)
        tagger.update(into)
        return
    behind = Behind(tagger)
    try:
        for start in range(0, into.nbytes, SLICE):
            piece = into[start : start + SLICE]
            _recv_exact(sock, piece)
            behind.update(piece)  # tagged while the next slice comes in
    finally:
        behind.wait()


class Streams:
    """Authenticated connections to one data server, kept between transfers (and closed
    once idle for a while: ``close_idle``)."""

    def __init__(self, host: str, port: int, secret: bytes, integrity: bool = True) -> None:
        self.host = host
        self.port = port
        self._secret = secret
        self._integrity = integrity
        self._idle: list[tuple[Stream, float]] = []
        """Streams given back, each with when (``time.monotonic``)."""
        self._used = time.monotonic()
        """When a stream was last taken or given back."""
        self._closed = False
        self._lock = threading.Lock()

    def take(self, deadline: float) -> Stream:
        with self._lock:
            self._used = time.monotonic()
            if self._idle:
                return self._idle.pop()[0]
        left = deadline - time.monotonic()
        if left <= 0:
            raise RDMATimeoutError("timed out before connecting to the buffer's owner")
        try:
            sock = socket.create_connection(
                (self.host, self.port), timeout=min(left, HANDSHAKE_TIMEOUT)
            )
        except ConnectionRefusedError:
            raise RDMAOwnerDied(
                f"the owner's data server at {self.host}:{self.port} refused the connection "
                "(its process is gone)"
            ) from None
        except TimeoutError:
            raise RDMATimeoutError(f"timed out connecting to {self.host}:{self.port}") from None
        except OSError as error:
            raise RDMATransferError(f"cannot connect to {self.host}:{self.port}: {error}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            requests, answers = _handshake(sock, "client", self._secret, self._integrity)
            sock.settimeout(None)  # blocking: see _recv_exact
        except HandshakeError as error:
            sock.close()
            raise RDMATransferError(
                f"{self.host}:{self.port} does not hold the job's secret: {error}"
            ) from None
        except TimeoutError:
            sock.close()
            raise RDMATimeoutError(
                f"timed out in the RDMA handshake with {self.host}:{self.port} (is its owner "
                "stopped or busy?)"
            ) from None
        except OSError as error:
            sock.close()
            raise RDMATransferError(
                f"the RDMA handshake with {self.host}:{self.port} failed: {error}"
            ) from None
        return Stream(sock, requests, answers)

    def give(self, stream: Stream) -> None:
        with self._lock:
            now = self._used = time.monotonic()
            if not self._closed:
                self._idle.append((stream, now))
                return
        stream.sock.close()  # its Streams was let go meanwhile (``close_idle``)

    def close_idle(self, before: float) -> bool:
        """Close the streams given back before ``before`` (``time.monotonic``); whether
        these streams are done with (none left and none taken since then): they then close
        any stream given back later."""
        with self._lock:
            old = [stream for stream, given in self._idle if given < before]
            self._idle = [(stream, given) for stream, given in self._idle if given >= before]
            done = not self._idle and self._used < before
            self._closed = done
        for stream in old:
            stream.sock.close()
        return done

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = True
        for stream, _ in idle:
            stream.sock.close()


class Stream:
    """One authenticated connection to a data server, and its two seals."""

    __slots__ = ("answers", "requests", "sock")

    def __init__(self, sock: socket.socket, requests: Seal, answers: Seal) -> None:
        self.sock, self.requests, self.answers = sock, requests, answers


def _chunk(
    stream: Stream,
    op: int,
    buffer_id: int,
    offset: int,
    local: Region,
    local_offset: int,
    length: int,
    deadline: float,
) -> None:
    sock = stream.sock
    _set_deadline(sock, deadline)
    head = HEADER.pack(op, buffer_id, offset, length)
    _send(sock, head + stream.requests.tag(head))
    view = local.view(local_offset, length)
    if op == WRITE:
        tagger = stream.requests.start(b"data")
        if length:
            _send_tagged(sock, view, tagger)
        _send(sock, tagger.digest(length > 0))
    status = bytearray(1)
    tag = bytearray(TAG_SIZE)
    if op == READ and length > 0 and not stream.answers.covers_data:
        answer = _recv_untagged_answer(sock, status, view, tag, stream.answers)
        got = status[0] == OK
    else:
        _recv_exact(sock, memoryview(status))
        answer = stream.answers.start(bytes(status))
        got = op == READ and status[0] == OK and length > 0
        if got:
            _recv_tagged(sock, view, answer)
        _recv_exact(sock, memoryview(tag))
    if not hmac.compare_digest(bytes(tag), answer.digest(got)):
        consequence = "the bytes read are not to be trusted" if op == READ else "unknown"
        raise RDMATransferError(
            "an answer of the buffer's owner did not authenticate (altered on the way?); "
            f"the transfer's outcome: {consequence}"
        )
    _raise_for(status[0])


def _recv_untagged_answer(
    sock: socket.socket, status: bytearray, view: memoryview, tag: bytearray, answers: Seal
) -> Tagger:
    """A read's answer whose bytes are untagged (sent in one call, see ``_answer``): its
    status and the first bytes after it, then the rest of the bytes and the tag in one
    call that waits for all. An error answer is its status and tag only, and nothing is
    written to ``view`` before the status is known."""
    early = bytearray(TAG_SIZE)
    try:
        n = sock.recvmsg_into([memoryview(status), memoryview(early)])[0]
    except BlockingIOError:
        raise TimeoutError("timed out receiving") from None
    if n == 0:
        raise ConnectionResetError("the peer closed the connection")
    answer = answers.start(bytes(status))
    size = view.nbytes if status[0] == OK else 0
    rest = [view, memoryview(tag)]
    got = n - 1  # bytes of the answer after its status, from its start
    into_view = min(got, size)
    view[:into_view] = early[:into_view]
    tag[: got - into_view] = early[into_view:got]
    while got < size + TAG_SIZE:
        rest = [view[got:], memoryview(tag)] if got < size else [memoryview(tag)[got - size :]]
        try:
            n = sock.recvmsg_into(rest, 0, socket.MSG_WAITALL)[0]
        except BlockingIOError:
            raise TimeoutError("timed out receiving") from None
        if n == 0:
            raise ConnectionResetError("the peer closed the connection")
        got += n
    return answer


def _raise_for(status: int) -> None:
    if status == OK:
        return
    if status == ALTERED:
        raise RDMATransferError(
            "the owner refused the write: its bytes did not authenticate (altered on the way?)"
        )
    if status == DROPPED:
        raise RDMABufferDropped("the buffer was dropped")
    if status == READ_ONLY:
        raise RDMAError("the buffer is read-only: it cannot be written")
    raise RDMATransferError(f"the owner refused the request (status {status})")


def transfer(
    streams: Streams,
    op: int,
    buffer_id: int,
    local: Region,
    size: int,
    deadline: float,
    chunks: list[tuple[int, int]],
    threads: Executor,
    width: int,
) -> None:
    """Move ``size`` bytes between the buffer (from its start) and ``local`` (from its
    start), ``op`` saying which way, in ``chunks`` taken by up to ``width`` streams (this
    thread and helpers of ``threads``). Every stream has ended when this returns."""
    pieces = iter(chunks)
    stop = threading.Event()

    def run() -> None:
        stream: Stream | None = None
        try:
            for offset, length in pieces:
                if stop.is_set():
                    break
                if stream is None:
                    stream = streams.take(deadline)
                _chunk(stream, op, buffer_id, offset, local, offset, length, deadline)
        except BaseException:
            stop.set()
            if stream is not None:
                stream.sock.close()
            raise
        if stream is not None:
            streams.give(stream)

    width = max(1, min(width, len(chunks)))
    errors = threads.spread(run, width - 1)
    if errors:
        raise _explain(errors, streams)


def _explain(errors: list[BaseException], streams: Streams) -> BaseException:
    """The error to report of those the streams met: ours first, then a timeout, then
    the rest as a cut transfer."""
    for error in errors:
        if isinstance(error, RDMAError):
            return error
    for error in errors:
        if isinstance(error, TimeoutError):
            return RDMATimeoutError("the transfer did not end in time")
    cut = RDMATransferError(
        f"the transfer with {streams.host}:{streams.port} was cut: {errors[0]!r}"
    )
    cut.__cause__ = errors[0]
    return cut
