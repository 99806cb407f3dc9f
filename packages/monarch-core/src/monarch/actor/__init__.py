"""Actors, endpoints, meshes and futures: upstream Monarch's ``monarch.actor`` API."""

from monarch.core._actor import (
    Actor,
    ActorError,
    ActorMesh,
    Context,
    Endpoint,
    Instance,
    SupervisionError,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
)
from monarch.core._future import Future, returns_future
from monarch.core._proc_mesh import HostMesh, ProcMesh, this_host, this_proc
from monarch.core._shape import Extent, NDSlice, Point, Selection, Shape
from monarch.core._value_mesh import ValueMesh

__all__ = [
    "Actor",
    "ActorError",
    "ActorMesh",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "NDSlice",
    "Point",
    "ProcMesh",
    "Selection",
    "Shape",
    "SupervisionError",
    "ValueMesh",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "endpoint",
    "returns_future",
    "this_host",
    "this_proc",
]
