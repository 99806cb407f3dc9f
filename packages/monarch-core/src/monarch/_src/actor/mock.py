"""Upstream's ``monarch._src.actor.mock``: run a program with some actors, or the tensor
engine of some actors, replaced, as ``unittest.mock.patch`` replaces names (upstream's
GRPO simulation examples run their RL loop this way without GPUs).

``patch_actor(Real, Mock)``: while it is active, a spawn of ``Real`` starts ``Mock``, also
when an actor spawns it (a spawn carries the patches to the procs it starts actors on).
``patch_tensor_engine(ActorClass, factory=None)``: an actor of that class gets
``factory(proc_mesh).activate()`` from its ``proc_mesh.activate()``; the default factory
(upstream's: its GPU simulator) is monarch-tensor's engine with CUDA devices run on the
procs' CPUs, so a program written for GPUs runs, and computes, on a CPU-only machine.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

from monarch.core._mesh._actor_mesh import tensor_engine_entry
from monarch.core._mesh._mocks import EngineFactory, MockState, actor_mocks, engine_mocks

TensorEngineFactory = EngineFactory

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class _Patch(Generic[T]):
    """One registry entry while active (a context manager, async too, or a decorator);
    leaving puts back what was there before, so patches nest."""

    def __init__(self, registry: dict[type, T], target: type, value: T) -> None:
        self._registry = registry
        self._target = target
        self._value = value
        self._saved: list[T | None] = []

    def __enter__(self) -> T:
        self._saved.append(self._registry.get(self._target))
        self._registry[self._target] = self._value
        return self._value

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        previous = self._saved.pop()
        if previous is None:
            self._registry.pop(self._target, None)
        else:
            self._registry[self._target] = previous

    async def __aenter__(self) -> T:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def patched_async(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await func(*args, **kwargs)

            return patched_async  # type: ignore[return-value]

        @functools.wraps(func)
        def patched(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return patched  # type: ignore[return-value]


class patch_actor(_Patch[type]):
    """Spawns of ``original`` start ``mock`` while this is active."""

    def __init__(self, original: type, mock: type) -> None:
        super().__init__(actor_mocks, original, mock)
        self.original = original
        self.mock = mock


def _create_simulated_tensor_engine(proc_mesh: Any) -> Any:
    """The default mocked engine: monarch-tensor's, CUDA devices run on CPU."""
    return tensor_engine_entry("simulated", "patch_tensor_engine")(proc_mesh)


class patch_tensor_engine(_Patch[EngineFactory]):
    """Actors of ``actor_class`` activate ``mock_factory(proc_mesh)`` instead of the real
    tensor engine while this is active (for actors spawned meanwhile)."""

    def __init__(self, actor_class: type, mock_factory: EngineFactory | None = None) -> None:
        factory = mock_factory or _create_simulated_tensor_engine
        super().__init__(engine_mocks, actor_class, factory)
        self.actor_class = actor_class
        self.mock_factory = factory


def get_actor_class(cls: type) -> type:
    """The class a spawn of ``cls`` starts now."""
    return actor_mocks.get(cls, cls)


def get_tensor_engine_factory(cls: type) -> EngineFactory | None:
    """The mocked tensor engine of actors of ``cls``, if any."""
    return engine_mocks.get(cls)


def get_actor_mock_registry_state() -> dict[type, type]:
    return dict(actor_mocks)


def set_actor_mock_registry_state(state: dict[type, type]) -> None:
    actor_mocks.update(state)


def get_tensor_engine_mock_registry_state() -> dict[type, EngineFactory]:
    return dict(engine_mocks)


def set_tensor_engine_mock_registry_state(state: dict[type, EngineFactory]) -> None:
    engine_mocks.update(state)


__all__ = [
    "MockState",
    "TensorEngineFactory",
    "get_actor_class",
    "get_actor_mock_registry_state",
    "get_tensor_engine_factory",
    "get_tensor_engine_mock_registry_state",
    "patch_actor",
    "patch_tensor_engine",
    "set_actor_mock_registry_state",
    "set_tensor_engine_mock_registry_state",
]
