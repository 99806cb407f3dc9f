"""``get_or_spawn_controller``: one actor per name per job, living in the root client.

Any process of the job can ask; the request goes to the root client (whose address
every runtime knows as ``Runtime.root``, see ``_bootstrap``), which spawns the actor in its own
process on the first request and answers every request with the same mesh.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, TypeVar

from monarch.core._errors import RemoteFailure
from monarch.core._layout._shape import NDSlice, Shape
from monarch.core._payload._serialize import dumps, loads
from monarch.core._runtime import Runtime, current_runtime
from monarch.core._runtime._messages import Body, GetController, PortValue
from monarch.transport import Buffer

from ._actor_mesh import ActorMesh
from ._ask import ask_body, settle_from_reply
from ._future import Future, submit_into
from ._reports import CONTROLLERS
from ._spawn_actors import spawn_actor_mesh

T = TypeVar("T")

_controllers: dict[str, ActorMesh[Any]] = {}


def get_or_spawn_controller(name: str, Class: type[T], *args: Any, **kwargs: Any) -> Future[T]:
    """The job's singleton actor ``name``, spawned in the root client on first use."""
    runtime = current_runtime()
    root = runtime.root or runtime.address
    payload = dumps((Class, args, kwargs))

    def start(result: Future[Any]) -> None:
        def then(body: Body | None, data: Sequence[Buffer], error: BaseException | None) -> None:
            settle_from_reply(result, body, data, error, f"the root client at {root} failed")

        ask_body(runtime, root, functools.partial(GetController, name), None, then, payload)

    return submit_into(runtime, start)


def handle_get_controller(
    runtime: Runtime, body: GetController, payload: Sequence[Buffer], sender: str
) -> None:
    mesh = _controllers.get(body.name)
    if mesh is None:
        try:
            cls, args, kwargs = loads(payload)
            unity = Shape([], NDSlice(0, [], []))
            mesh = spawn_actor_mesh(
                runtime,
                body.name,
                cls,
                [runtime.address],
                unity,
                args,
                kwargs,
                owner_path=CONTROLLERS,  # upstream's path, in the names of its actors
            )
        except Exception as exc:  # noqa: BLE001 - the requester learns why
            failure = RemoteFailure.of(exc, f"cannot spawn controller {body.name!r}")
            runtime.send_to_port(body.reply, PortValue(0, True), dumps(failure))
            return
        _controllers[body.name] = mesh
    ready = mesh

    def reply(addresses: list[str] | BaseException) -> None:
        if isinstance(addresses, BaseException):
            failure = RemoteFailure.of(addresses, f"controller {body.name!r} failed")
            runtime.send_to_port(body.reply, PortValue(0, True), dumps(failure))
        else:
            runtime.send_to_port(body.reply, PortValue(0), dumps(ready))

    mesh._state.when_ready(reply)
