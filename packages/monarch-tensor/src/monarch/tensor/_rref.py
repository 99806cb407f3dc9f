"""``endpoint.rref(...)``: an actor's endpoint run by each proc's worker, in order with the
ops, its result becoming a monarch Tensor (upstream's adverb; the core reaches it through
the ``monarch.tensor_engine`` entry points).

The worker calls the actor of its own proc and waits for the reply, so the endpoint sees
every op recorded before it, and the ops after it see its result. Unlike upstream's, the
shards it is given travel in the call message (copies, where upstream lends the worker's
own tensors), and the call goes to a one-actor slice of the mesh: ``current_rank()`` in the
endpoint is 0 there (upstream casts to the whole mesh).
"""

from __future__ import annotations

from typing import Any

from monarch.actor import as_endpoint
from monarch.core import context

from ._active import current_client
from ._tensor import dispatch

RREF_WAIT = 120.0
"""Seconds a worker waits for the actor it called."""


class ActorCall:
    """What the workers run for ``rref``: a call of ``endpoint`` on this proc's actor (a
    plain method where ``as_endpoint`` made the endpoint)."""

    def __init__(self, mesh: Any, endpoint: str, explicit_port: bool = False) -> None:
        self.mesh = mesh
        self.endpoint = endpoint
        self.explicit_port = explicit_port
        self.__qualname__ = f"{endpoint}.rref"

    def __reduce__(self) -> tuple[type[ActorCall], tuple[Any, str, bool]]:
        return (ActorCall, (self.mesh, self.endpoint, self.explicit_port))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        here = context().message_rank  # the worker's point: its run message's
        mine = self.mesh.slice(**{label: here[label] for label in here.extent.labels})
        method = as_endpoint(
            getattr(mine, self.endpoint), explicit_response_port=self.explicit_port
        )
        return method.call_one(*args, **kwargs).get(timeout=RREF_WAIT)


def rref(endpoint: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``endpoint.rref(*args, **kwargs)`` inside ``proc_mesh.activate()``."""
    client = current_client()
    if client is None:
        raise ValueError("rref needs an active mesh: `with proc_mesh.activate():`")
    propagate = endpoint._prop._propagate
    if not callable(propagate):
        raise ValueError(
            f"{endpoint._name}.rref() needs the endpoint's propagate= (a function of its "
            "arguments returning tensors shaped as its results): "
            f"@endpoint(propagate=...), not {propagate!r}"
        )
    call = ActorCall(endpoint._mesh, endpoint._name, endpoint._prop._explicit_response_port)
    result = dispatch(call, args, kwargs, client, meta_func=propagate, wire=call)
    client.actor_calls = True
    return result
