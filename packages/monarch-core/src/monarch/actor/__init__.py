"""Actors, endpoints, meshes, ports and futures: upstream Monarch's ``monarch.actor`` API.

``unhandled_fault_hook`` is looked up here each time a failure reaches the client
unhandled, so reassigning it (``monarch.actor.unhandled_fault_hook = my_hook``) works.
"""

from collections.abc import Callable
from typing import Any

from monarch import _zygote_start

_zygote_start.prestart()  # first: it imports the core beside this import (see there)

from monarch._wheels import install_hint
from monarch.core._debugger import debug_controller
from monarch.core._errors import ActorError, MeshFailure, SupervisionError, WorkspaceSyncError
from monarch.core._host._attach import ChannelTransport, attach, attach_to_workers, enable_transport
from monarch.core._host._worker import (
    run_worker_loop_forever,
    run_worker_loop_until_shutdown,
    start_worker_loop_forever,
)
from monarch.core._layout._ids import ProcId, Uid
from monarch.core._layout._selection import Selection
from monarch.core._layout._shape import Extent, NDSlice, Point, Shape
from monarch.core._layout._value_mesh import ValueMesh
from monarch.core._mesh._actor_mesh import (
    Accumulator,
    ActorMesh,
    Endpoint,
    NotAnEndpoint,
    as_endpoint,
    send,
)
from monarch.core._mesh._controller import get_or_spawn_controller
from monarch.core._mesh._endpoint import Actor, concurrent_endpoint, endpoint
from monarch.core._mesh._future import Future, returns_future
from monarch.core._mesh._launch import default_bootstrap_cmd
from monarch.core._mesh._port import Channel, Port, PortReceiver, RankedPortReceiver
from monarch.core._mesh._proc_mesh import HostMesh, ProcMesh, shutdown_context, this_host, this_proc
from monarch.core._mesh._supervision import default_unhandled_fault_hook as _default_hook
from monarch.core._runner._context import (
    Context,
    Instance,
    context,
    current_actor_name,
    current_rank,
    current_size,
)
from monarch.core.lowlevel import plugin_group

from . import concurrent  # upstream's monarch.actor.concurrent, an attribute once imported

unhandled_fault_hook: Callable[[MeshFailure], None] = _default_hook
"""Called with every failure that reaches the client unhandled; reassign to change that."""

EXTRAS_GROUP = "monarch.actor"
"""Entry points ``name = "module:attr"``: names of upstream's ``monarch.actor`` that a sibling
wheel provides (monarch-telemetry's ``span``, ``traced``, ``get_meter``), loaded when first
asked for: a client that never asks never imports them (OpenTelemetry, say)."""
_WHEELS = dict.fromkeys(("span", "traced", "get_meter"), "monarch-telemetry")
"""Which wheel provides each, for the error when it is not installed."""


def __getattr__(name: str) -> Any:
    group = plugin_group(EXTRAS_GROUP, _WHEELS, hint=install_hint)
    if name in group.entries() or name in _WHEELS:
        return group.load(name, needed_by=f"monarch.actor.{name}")
    raise AttributeError(f"module 'monarch.actor' has no attribute {name!r}")


__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshFailure",
    "NDSlice",
    "NotAnEndpoint",
    "Point",
    "Port",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "RankedPortReceiver",
    "Selection",
    "Shape",
    "SupervisionError",
    "Uid",
    "ValueMesh",
    "WorkspaceSyncError",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "concurrent",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "get_or_spawn_controller",
    "returns_future",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "send",
    "shutdown_context",
    "start_worker_loop_forever",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]
