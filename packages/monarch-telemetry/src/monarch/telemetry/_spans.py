"""``span`` and ``traced``: user spans, tagged with the actor they run in."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, overload

from opentelemetry import trace

from monarch.actor import current_actor_name

from ._instrumentation import install
from ._instruments import tracer

_P = ParamSpec("_P")
_R = TypeVar("_R")


def actor_attributes() -> dict[str, str]:
    """The actor this code runs in (its id; the client's own code too has one)."""
    return {"monarch.actor": current_actor_name()}


@contextmanager
def span(name: str) -> Iterator[trace.Span]:
    """A span named ``name`` around the block, a child of the current one (in an endpoint:
    of the endpoint's, which continues its caller's trace). Instruments this process, if it
    is not yet."""
    install()
    with tracer().start_as_current_span(name, attributes=actor_attributes()) as current:
        yield current


@overload
def traced(fn: Callable[_P, _R]) -> Callable[_P, _R]: ...


@overload
def traced(*, name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]: ...


def traced(
    fn: Callable[_P, _R] | None = None, *, name: str | None = None
) -> Callable[_P, _R] | Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Run the function (sync or async) in a span named ``name`` (default: its name).
    Instruments this process when applied."""
    install()

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        label = name if name is not None else fn.__name__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with span(label):
                    return await fn(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with span(label):
                return fn(*args, **kwargs)

        return run

    return decorate(fn) if fn is not None else decorate
