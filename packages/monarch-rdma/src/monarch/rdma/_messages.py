"""What a process asks a buffer's owner, and what the owner answers: msgspec Structs.

Reads never ask the owner (they copy from its memory, by RDMA or from its data server);
a write of this host is pulled by the owner (``Pull``), and drops, atomics and the verbs
plane's queue-pair exchange go to the owner too. Each request is one Struct of the
tagged union ``Request``, served by the ``rdma`` ``Service`` of monarch-core
(``monarch.core.lowlevel``) and decoded by its one decoder: an unknown tag or a malformed
request is answered with a ``ServiceError`` that says so.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

U64: Final = (1 << 64) - 1
UInt64 = Annotated[int, msgspec.Meta(ge=0)]
"""A buffer id, an address, a size, an atomic's operand: not negative (msgpack holds no
integer above ``U64``, and msgspec checks no bound above int64's)."""


class Pull(msgspec.Struct, tag="pull", array_like=True, frozen=True):
    """Read ``size`` bytes at ``address`` in the writer (this host's process ``pid``,
    whose identity cell at ``identity`` holds ``token``) into the buffer's start; not
    once ``expires`` (``time.time()``) has passed: the writer has given up by then."""

    buffer_id: UInt64
    expires: float
    pid: Annotated[int, msgspec.Meta(ge=1)]
    identity: UInt64
    token: UInt64
    address: UInt64
    size: UInt64


class Drop(msgspec.Struct, tag="drop", array_like=True, frozen=True):
    """Unregister the buffer (the owner answers whether it still was)."""

    buffer_id: UInt64


class Atomic(msgspec.Struct, tag="atomic", array_like=True, frozen=True):
    """``fetch_add`` (add ``first``) or ``compare_and_swap`` (if ``first``, make it
    ``second``) on the buffer's first 8 bytes; the owner answers the old value."""

    buffer_id: UInt64
    kind: Literal["fetch_add", "compare_and_swap"]
    first: UInt64
    second: UInt64 = 0


class Connect(msgspec.Struct, tag="connect", array_like=True, frozen=True):
    """Connect a queue pair of the owner's ibverbs device to the asker's (``peer``: the
    asker's token, ``qpn`` and ``gid`` its queue pair's); the owner answers its own."""

    peer: UInt64
    qpn: Annotated[int, msgspec.Meta(ge=0, lt=1 << 24)]
    gid: str


class Stage(msgspec.Struct, tag="stage", array_like=True, frozen=True):
    """For a GPU buffer: copy its first ``size`` bytes to the host copy that readers read
    (``out``, before a read), or from the one that writers wrote (``in``, after a write)."""

    buffer_id: UInt64
    way: Literal["out", "in"]
    size: UInt64


Request = Pull | Drop | Atomic | Connect | Stage
"""Every request a buffer's owner serves."""


class Pulled(msgspec.Struct, tag="pulled", array_like=True, frozen=True):
    """Whether the owner could read the writer's memory (if not: the writer sends by TCP)."""

    done: bool


class Dropped(msgspec.Struct, tag="dropped", array_like=True, frozen=True):
    """Whether the buffer was still registered."""

    found: bool


class Old(msgspec.Struct, tag="old", array_like=True, frozen=True):
    """An atomic's old value."""

    value: UInt64


class Connected(msgspec.Struct, tag="connected", array_like=True, frozen=True):
    """The owner's queue pair for the asker's, and its GID."""

    qpn: int
    gid: str


Failure = Literal["dropped", "timeout", "transfer", "error"]


class Refused(msgspec.Struct, tag="refused", array_like=True, frozen=True):
    """The owner could not do it: ``why`` names the asker's exception (``_service``)."""

    why: Failure
    message: str


class Copied(msgspec.Struct, tag="copied", array_like=True, frozen=True):
    """The owner made the copy a ``Stage`` asked for."""


Answer = Pulled | Dropped | Old | Connected | Copied | Refused
"""Every answer of a buffer's owner."""
