"""monarch.core: the low-level API of Monarch's runtime, for the sibling wheels.

``monarch.actor`` is the user's API; this is what ``monarch-rdma``, ``monarch-tensor`` and
``monarch-jobs`` (and the tests and benchmarks) build on without importing a private
module: this process's ``Runtime`` (its address, the job's secret and root, posting a
message to a proc or a port, watching a peer), the ``Future`` that every operation
returns and how to complete one from the runtime loop, the wire messages, pickling with
out-of-band buffers, lending large buffers between processes of one machine and
reading another process's memory (``read_process_memory``, ``buffer_address``), fresh
memory on huge pages (``advise_huge_pages``), the
configuration snapshot (``current_config``), and where telemetry plugs in
(``set_instrumentation``: monarch-telemetry's hooks on both sides of every call), and
what a proc says of itself (``inspect_proc``, ``spawned_procs``: monarch-admin's view).
Launchers start a host's worker with ``python -m monarch.core.worker`` (``monarch worker``
without plug-in discovery; ``monarch.core.worker.main`` in a forked process), having
imported what procs need first (``import_proc_start``); ``listen_address()`` is where a
controller listens under the ``default_transport`` key; ``fork_program`` has the script's
zygote fork a program (a ``ProcessJob``'s forker of workers). ``python -m monarch.core`` is the
``monarch`` command.

The modules behind this face stand on floors, each importing only those below it (see
the package README); ``_bootstrap``, at the top, alone starts a runtime, and importing
``monarch.core`` makes it the starter of ``current_runtime()``.
"""

import gc as _gc
import sys as _sys

if _sys.orig_argv[-2:] in (
    ["-m", "monarch.core._host._proc"],
    ["-m", "monarch.core._host._zygote_proc"],
):
    # A proc (or a zygote) starting: importing the core makes ~50,000 objects and next to no
    # garbage. The collector stays off until the process has frozen them (``serve_proc``,
    # ``serve_zygote``): its passes over them would cost ~6 ms of the proc's start.
    _gc.disable()

from monarch._wheels import install_hint

from ._bulk._lending import LEND_MIN, Lender
from ._bulk._lending import available as lending_available
from ._bulk._memory_plane import read_range as read_process_memory
from ._config import current_config
from ._errors import (
    ActorError,
    DimensionError,
    MeshFailure,
    MeshIndexError,
    MonarchError,
    PeerLost,
    PullError,
    RemoteFailure,
    SupervisionError,
    WorkerConfigError,
    WorkspaceSyncError,
)
from ._host._bootstrap import import_proc_start
from ._host._code_sync import WorkspaceHost, WorkspaceReloader, gather_directories, push_directories
from ._host._environ import SECRET_ENV, job_secret, listen_address, use_job_secret
from ._host._introspect import inspect_proc, snapshot_procs
from ._host._zygote import ForkedProc, fork_program
from ._layout._shape import Extent, NDSlice, Point, Shape
from ._layout._value_mesh import ValueMesh
from ._mesh._actor_mesh import ActorMesh, mesh_stopped, proc_addresses
from ._mesh._endpoint import Actor, endpoint
from ._mesh._exits import workers_stopping
from ._mesh._future import Future, Outcome, run_on, submit_into, wait_outcome
from ._mesh._gather import Gather
from ._mesh._mocks import engine_factory_for
from ._mesh._port import Channel, Port
from ._mesh._proc_group import SpawnedProc, spawned_procs
from ._mesh._proc_mesh import HostMesh, ProcMesh, this_host, this_proc
from ._mesh._reports import ROOT, FailureCause, actor_name, failure_cause
from ._mesh._spawn_actors import spawn_actor_mesh
from ._mesh._supervision import SUPERVISION_SCHEMA, failure_record
from ._mesh._workspace import Workspace
from ._payload._memory import address_of as buffer_address
from ._payload._memory import advise_huge_pages
from ._payload._serialize import calling_endpoint, calling_target, dumps, loads
from ._runner._context import Context, Instance, context
from ._runtime import Runtime, current_runtime, running_runtime
from ._runtime._instrument import (
    Instrumentation,
    Scope,
    begin_operation,
    current_instrumentation,
    instrumented,
    set_instrumentation,
    timed,
)
from ._runtime._messages import (
    TO_ACTOR,
    TO_PORT,
    TO_PROC,
    ActorState,
    Body,
    PortRef,
    PortValue,
    ProcSnapshot,
    StackFrame,
    ThreadStack,
)
from ._runtime._netaddr import WILDCARD_HOSTS, ip_host
from ._runtime._tls import TlsIdentity, job_identity

__all__ = [
    "LEND_MIN",
    "ROOT",
    "SECRET_ENV",
    "SUPERVISION_SCHEMA",
    "TO_ACTOR",
    "TO_PORT",
    "TO_PROC",
    "WILDCARD_HOSTS",
    "Actor",
    "ActorError",
    "ActorMesh",
    "ActorState",
    "Body",
    "Channel",
    "Context",
    "DimensionError",
    "Extent",
    "FailureCause",
    "ForkedProc",
    "Future",
    "Gather",
    "HostMesh",
    "Instance",
    "Instrumentation",
    "Lender",
    "MeshFailure",
    "MeshIndexError",
    "MonarchError",
    "NDSlice",
    "Outcome",
    "PeerLost",
    "Point",
    "Port",
    "PortRef",
    "PortValue",
    "ProcMesh",
    "ProcSnapshot",
    "PullError",
    "RemoteFailure",
    "Runtime",
    "Scope",
    "Shape",
    "SpawnedProc",
    "StackFrame",
    "SupervisionError",
    "ThreadStack",
    "TlsIdentity",
    "ValueMesh",
    "WorkerConfigError",
    "Workspace",
    "WorkspaceHost",
    "WorkspaceReloader",
    "WorkspaceSyncError",
    "actor_name",
    "advise_huge_pages",
    "begin_operation",
    "buffer_address",
    "calling_endpoint",
    "calling_target",
    "context",
    "current_config",
    "current_instrumentation",
    "current_runtime",
    "dumps",
    "endpoint",
    "engine_factory_for",
    "failure_cause",
    "failure_record",
    "fork_program",
    "gather_directories",
    "import_proc_start",
    "inspect_proc",
    "install_hint",
    "instrumented",
    "ip_host",
    "job_identity",
    "job_secret",
    "lending_available",
    "listen_address",
    "loads",
    "mesh_stopped",
    "proc_addresses",
    "push_directories",
    "read_process_memory",
    "run_on",
    "running_runtime",
    "set_instrumentation",
    "snapshot_procs",
    "spawn_actor_mesh",
    "spawned_procs",
    "submit_into",
    "this_host",
    "this_proc",
    "timed",
    "use_job_secret",
    "wait_outcome",
    "workers_stopping",
]
