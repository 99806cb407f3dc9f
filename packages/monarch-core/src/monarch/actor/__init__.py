"""Actors, endpoints, meshes, ports and futures: upstream Monarch's ``monarch.actor`` API."""

from monarch.core._actor import (
    Accumulator,
    Actor,
    ActorError,
    ActorMesh,
    Context,
    Endpoint,
    Instance,
    NotAnEndpoint,
    SupervisionError,
    as_endpoint,
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    send,
)
from monarch.core._controller import get_or_spawn_controller
from monarch.core._future import Future, returns_future
from monarch.core._port import Channel, Port, PortReceiver, RankedPortReceiver
from monarch.core._proc_mesh import HostMesh, ProcMesh, shutdown_context, this_host, this_proc
from monarch.core._shape import Extent, NDSlice, Point, Selection, Shape
from monarch.core._value_mesh import ValueMesh

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "NDSlice",
    "NotAnEndpoint",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "RankedPortReceiver",
    "Selection",
    "Shape",
    "SupervisionError",
    "ValueMesh",
    "as_endpoint",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "endpoint",
    "get_or_spawn_controller",
    "returns_future",
    "send",
    "shutdown_context",
    "this_host",
    "this_proc",
]
