"""The callee side: actor runners, sync and async apart, and a mesh's local actors.

``_actor_runner`` holds what every runner does (routing, replies, failure, stop);
``_sync`` runs an actor of ``def`` endpoints on the threads of the process's bounded pool
(``_pool``), ``_async`` one of ``async def`` endpoints on an event loop of its own, on its
thread; ``_local`` starts the runners of a spawn and hands a mesh's calls to them in order.
"""

from ._actor_runner import ActorRunner
from ._async import AsyncRunner
from ._local import (
    LocalMesh,
    handle_spawn_actor,
    refuse_undeliverable,
    release_actors,
    start_actor,
)
from ._sync import SyncRunner

__all__ = [
    "ActorRunner",
    "AsyncRunner",
    "LocalMesh",
    "SyncRunner",
    "handle_spawn_actor",
    "refuse_undeliverable",
    "release_actors",
    "start_actor",
]
