"""monarch.core.lowlevel: the mechanisms every layer above the core builds on.

As trio's ``trio.lowlevel``: a thin public face over the core's private modules.

- ``ask(address, request, timeout)``: ask a proc one question and wait for the answer,
  with its reply port, the watch on the peer (a dead proc fails the ask at once with
  ``PeerLost``) and the deadline (``TimeoutError``) in one place (``_ask``);
  ``ask_body`` is the same for the core's own control messages.
- ``Service``: a named handler every proc serves, whose requests are a msgspec tagged
  union of Structs; a request it cannot read is answered with a ``ServiceError``. The
  ``proc`` service (``PROC_SERVICE``, ``_introspect``) answers what monarch-admin asks.
- ``snapshot_procs``: every proc's ``ProcSnapshot`` at once (monarch-admin, -telemetry).
- ``plugin_group`` / ``load_plugin``: the one loader of every entry-point group, with a
  ``pip install`` hint (``MissingPlugin``) and duplicate detection (``PluginConflict``).
- ``process_alive`` / ``process_state`` / ``process_start``: whether a pid runs (a zombie
  does not; with its start time, whether it is still the same process), the one check
  every launcher and watcher makes.
- the bulk-data wing (``_bulk``): ``Plane`` (what a plane offers: lend, reach, read,
  write, release), ``bulk_planes()`` (the planes, monarch-rdma's found through the
  ``monarch.bulk_planes`` entry points; one chosen per loan), ``Lent`` (a loan as a plain
  value: a transport's frame part), ``MemoryPlane`` (the same-host one, with its identity
  and liveness checks; it reads, and writes where the lender has a write gate),
  ``WriteGate`` (what lets its peers write a loan straight into the lender's memory),
  ``Lender`` (the one book of loans: lent through a plane, read by the borrower through
  it, given back by key) and ``bulk_executor()`` (the one executor of bulk-data threads).
- ``prestart_zygote`` / ``current_zygote``: this process's zygote, which forks its procs
  (and a ``ProcessJob``'s forker, ``fork_program``): started ahead of the first proc, and
  the one object a launcher or a test watches; ``cuda_initialized()``: whether this
  process holds a CUDA context (no zygote is forked from it; monarch-tensor's worker keeps
  the device CUDA chose).
- ``unpin_this_thread()``: first thing in a thread a layer starts: the process's CPUs back,
  where the runtime's loop that may have started it is pinned to its waiter's (``_placement``).
- ``sends_together()``: the casts and calls a thread makes in the block leave as it ends,
  one system call per peer (monarch-tensor's batch of commands and the fetch behind it).
- the core's wire messages (``Envelope``, ``Call``, ``PortValue``, ``Beat``...,
  ``encode_message``), its payload pickler (``dumps``) and the cast tree's split
  (``split_cast``): for tools that size what the core sends (``benchmarks/scale_model``).
"""

from monarch.transport import MissingPlugin, PluginConflict, PluginGroup, load_plugin, plugin_group

from ._bulk._executor import Executor, bulk_executor, streams
from ._bulk._lending import Lender
from ._bulk._memory_plane import IDENTITY_MAGIC, MemoryPlane, pull_into
from ._bulk._plane import (
    ENTRY_POINT_GROUP as BULK_PLANES_GROUP,
)
from ._bulk._plane import (
    Lent,
    Loan,
    LoanDropped,
    LoanLost,
    Plane,
    PlaneError,
    Planes,
    bulk_planes,
)
from ._bulk._write_gate import Gate as WriteGate
from ._host._introspect import PROC_SERVICE, Introspect, ProcQuery, inspect_proc, snapshot_procs
from ._host._pids import process_alive, process_start, process_state
from ._host._zygote import Zygote, cuda_initialized, prestart_zygote, zygote
from ._mesh._ask import ASK_TIMEOUT, Service, ServiceError, ask, ask_body
from ._payload._serialize import dumps
from ._placement import unpin_this_thread
from ._runtime._cast import split as split_cast
from ._runtime._messages import (
    TO_ACTOR,
    TO_PORT,
    Beat,
    Call,
    Envelope,
    PortRef,
    PortValue,
    ShapeSpec,
)
from ._runtime._messages import encode as encode_message
from ._runtime._router import sends_together


def current_zygote() -> Zygote:
    """This process's zygote (one per process; ``failed`` says why it cannot be used)."""
    return zygote


__all__ = [
    "ASK_TIMEOUT",
    "BULK_PLANES_GROUP",
    "IDENTITY_MAGIC",
    "PROC_SERVICE",
    "TO_ACTOR",
    "TO_PORT",
    "Beat",
    "Call",
    "Envelope",
    "Executor",
    "Introspect",
    "Lender",
    "Lent",
    "Loan",
    "LoanDropped",
    "LoanLost",
    "MemoryPlane",
    "MissingPlugin",
    "Plane",
    "PlaneError",
    "Planes",
    "PluginConflict",
    "PluginGroup",
    "PortRef",
    "PortValue",
    "ProcQuery",
    "Service",
    "ServiceError",
    "ShapeSpec",
    "WriteGate",
    "Zygote",
    "ask",
    "ask_body",
    "bulk_executor",
    "bulk_planes",
    "cuda_initialized",
    "current_zygote",
    "dumps",
    "encode_message",
    "inspect_proc",
    "load_plugin",
    "plugin_group",
    "prestart_zygote",
    "process_alive",
    "process_start",
    "process_state",
    "pull_into",
    "sends_together",
    "snapshot_procs",
    "split_cast",
    "streams",
    "unpin_this_thread",
]
