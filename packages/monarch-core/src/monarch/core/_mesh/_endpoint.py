"""Declaring actors: the ``Actor`` base class and the ``@endpoint`` decorators.

``@endpoint`` turns a method into an ``EndpointProperty``: the function, its signature
(checked at the call site) and its calling options. Which endpoints a class has and
whether it is a sync or an async actor are read here, by the caller (``_actor_mesh``) and
the callee (``_runner``) alike.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, overload

from monarch.core._layout._shape import MeshTrait, NDSlice, Shape

R = TypeVar("R")


class EndpointProperty(Generic[R]):
    """What ``@endpoint`` makes of a method: the function plus its calling options."""

    def __init__(
        self,
        method: Callable[..., Any],
        *,
        propagate: Any = None,
        explicit_response_port: bool = False,
        instrument: bool = True,
        concurrent: bool = False,
    ) -> None:
        self._method = method
        self._propagate = propagate
        self._explicit_response_port = explicit_response_port
        self._instrument = instrument
        self._concurrent = concurrent
        self._stacked_on: EndpointProperty[Any] | None = None
        """The endpoint this one was applied to (``endpoint(endpoint(f))``), refused at spawn."""
        self._signature = inspect.signature(method)
        self._arity = _positional_arity(self._signature)
        functools.update_wrapper(self, method)  # type: ignore[arg-type]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self._method)

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self._method.__get__(instance, owner)


@overload
def endpoint(method: Callable[..., Any]) -> Any: ...


@overload
def endpoint(
    *, propagate: Any = None, explicit_response_port: bool = False, instrument: bool = True
) -> Callable[[Callable[..., Any]], Any]: ...


def endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Mark an actor method as callable through meshes (bare or with options)."""

    def wrap(fn: Callable[..., Any] | EndpointProperty[Any]) -> EndpointProperty[Any]:
        if isinstance(fn, EndpointProperty):
            # upstream takes it here and fails at spawn (see check_endpoints_callable)
            stacked: EndpointProperty[Any] = EndpointProperty(
                fn._method,
                propagate=propagate,
                explicit_response_port=explicit_response_port,
                instrument=instrument,
            )
            stacked._stacked_on = fn
            return stacked
        return EndpointProperty(
            fn,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )

    return wrap(method) if method is not None else wrap


@overload
def concurrent_endpoint(method: Callable[..., Any]) -> Any: ...


@overload
def concurrent_endpoint(
    *, propagate: Any = None, explicit_response_port: bool = False, instrument: bool = True
) -> Callable[[Callable[..., Any]], Any]: ...


def concurrent_endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Like ``@endpoint`` for an ``async def`` whose body runs as its own task.

    Later messages proceed while it awaits; bodies start in arrival order per
    sender. Pending bodies are cancelled before ``__cleanup__``.
    """

    def wrap(fn: Callable[..., Any]) -> EndpointProperty[Any]:
        # upstream's messages and exception type: user code may catch them
        if isinstance(fn, EndpointProperty):
            raise ValueError(
                "concurrent_endpoint does not wrap @endpoint; "
                "pass endpoint options to @concurrent_endpoint"
            )
        if not inspect.iscoroutinefunction(fn):
            raise ValueError("concurrent_endpoint can only wrap async endpoints")
        return EndpointProperty(
            fn,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
            concurrent=True,
        )

    return wrap(method) if method is not None else wrap


def _positional_arity(signature: inspect.Signature) -> tuple[int, int] | None:
    """(fewest, most) positional arguments a plain signature takes, self included;
    ``None`` when it has ``*args``, ``**kwargs`` or keyword-only parameters."""
    fewest = most = 0
    for param in signature.parameters.values():
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            return None
        most += 1
        if param.default is param.empty:
            fewest = most
    return fewest, most


def misnamed_keyword(signature: inspect.Signature, kwargs: dict[str, Any]) -> str | None:
    """A keyword the endpoint does not take, named (with the parameter it is closest to):
    ``bind`` reports the parameter it left missing first, which hides a misspelling."""
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    named = [n for n, p in params.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY]
    for key in kwargs:
        if key not in named:
            import difflib  # here: only a mistaken call needs it, not every process at its start

            close = difflib.get_close_matches(key, named, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"got an unexpected keyword argument {key!r}{hint}"
    return None


def check_endpoints_callable(cls: type) -> None:
    """Upstream's TypeError for an endpoint stacked on an endpoint, raised at spawn."""
    for prop in endpoints_of(cls).values():
        if prop._stacked_on is not None:
            raise TypeError(f"{prop._stacked_on!r} is not a callable object")


def endpoints_of(cls: type) -> dict[str, EndpointProperty[Any]]:
    found: dict[str, EndpointProperty[Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty):
                found[name] = value
            else:
                found.pop(name, None)
    return found


def actor_is_async(cls: type) -> bool:
    kinds = {name: prop.is_async for name, prop in endpoints_of(cls).items()}
    if len(set(kinds.values())) > 1:
        sync = sorted(n for n, a in kinds.items() if not a)
        asyn = sorted(n for n, a in kinds.items() if a)
        raise ValueError(  # upstream's words (missing spaces included): users match them
            f"{cls} mixes both async and sync endpoints."
            "Synchronous endpoints cannot be mixed with async endpoints because they can "
            "cause the asyncio loop to deadlock if they wait."
            f"sync: {sync} async: {asyn}"
        )
    return any(kinds.values())


# -- the actor base class and its context -----------------------------------------------


class Actor(MeshTrait):
    """Base class of user actors: private state, one message at a time.

    A MeshTrait as upstream's is, so that ``procs.spawn(name, MyActor)`` (typed as
    returning ``MyActor``) type-checks the mesh operations of the ActorMesh it returns.
    An actor instance itself is not a mesh.
    """

    @property
    def _ndslice(self) -> NDSlice:
        raise TypeError("an actor is not a mesh; slice the ActorMesh that spawn() returned")

    @property
    def _labels(self) -> Sequence[str]:
        raise TypeError("an actor is not a mesh; slice the ActorMesh that spawn() returned")

    def _new_with_shape(self, shape: Shape) -> Actor:
        raise TypeError("an actor is not a mesh; slice the ActorMesh that spawn() returned")

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """Upstream's: the logger named for the class (not its module), at DEBUG."""
        logger = logging.getLogger(type(self).__name__)
        logger.setLevel(logging.DEBUG)
        return logger
