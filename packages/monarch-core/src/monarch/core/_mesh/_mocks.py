"""Mocked actors and tensor engines (upstream's ``monarch._src.actor.mock``): what a spawn
or an actor's ``activate()`` uses instead of the real thing.

A spawn carries the registries with it (``current_mocks``) and the receiving proc adds
them to its own before the actor starts, so actors spawned by mocked actors, and an
actor's own ``activate()`` on its proc, see the same substitutions as the client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

EngineFactory = Callable[[Any], Any]
"""``factory(proc_mesh)`` -> an object whose ``activate()`` is the context manager an
actor's ``proc_mesh.activate()`` uses instead of the real tensor engine."""

actor_mocks: dict[type, type] = {}
"""Actor class -> the class a spawn of it starts instead."""

engine_mocks: dict[type, EngineFactory] = {}
"""Actor class -> the tensor engine its ``proc_mesh.activate()`` uses."""


def mocked_class(cls: type) -> type:
    """The class a spawn of ``cls`` starts: its mock, or itself."""
    return actor_mocks.get(cls, cls)


def qualified(cls: type) -> str:
    """``module.Class``: what ``Instance.class_name`` says of an actor of ``cls``."""
    return f"{cls.__module__}.{cls.__name__}"


def engine_factory_for(class_name: str | None) -> EngineFactory | None:
    """The mocked tensor engine of the actor class named ``class_name``, if any. Classes
    are matched by name: a class of ``__main__`` reaches a proc by value, as a new object."""
    if class_name is None or not engine_mocks:
        return None
    for cls, factory in engine_mocks.items():
        if qualified(cls) == class_name:
            return factory
    return None


class MockState:
    """Both registries as a spawn found them; the proc that starts its actors installs it."""

    def __init__(self, actors: dict[type, type], engines: dict[type, EngineFactory]) -> None:
        self.actors = actors
        self.engines = engines

    def __reduce__(self) -> tuple[type[MockState], tuple[Any, ...]]:
        return (MockState, (self.actors, self.engines))

    def install(self) -> None:
        actor_mocks.update(self.actors)
        engine_mocks.update(self.engines)


def current_mocks() -> MockState | None:
    """What a spawn carries: None when nothing is mocked (the common case costs nothing)."""
    if not actor_mocks and not engine_mocks:
        return None
    return MockState(dict(actor_mocks), dict(engine_mocks))
