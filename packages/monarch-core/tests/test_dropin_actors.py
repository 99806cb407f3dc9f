"""Drop-in behaviour of actors and meshes, as upstream's: decorator misuse, ``initialized``,
actor names, ``send`` selections, blocking where upstream lets code block, ``stop``.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0 to show the expectations are upstream's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from monarch.actor import (
    Actor,
    Channel,
    ProcMesh,
    concurrent_endpoint,
    context,
    current_actor_name,
    endpoint,
    send,
    this_host,
)


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(timeout=60)


# -- decorators ---------------------------------------------------------------------------------


async def _async_method(self: Any) -> int:
    return 1


def _sync_method(self: Any) -> int:
    return 1


STACKED = (
    "concurrent_endpoint does not wrap @endpoint; pass endpoint options to @concurrent_endpoint"
)
NOT_ASYNC = "concurrent_endpoint can only wrap async endpoints"


@pytest.mark.parametrize(
    ("wrap", "message"),
    [
        (lambda: concurrent_endpoint(endpoint(_async_method)), STACKED),
        (lambda: concurrent_endpoint(propagate=None)(endpoint(_async_method)), STACKED),
        (lambda: concurrent_endpoint(endpoint(_sync_method)), STACKED),
        (lambda: concurrent_endpoint(_sync_method), NOT_ASYNC),
        (lambda: concurrent_endpoint(explicit_response_port=True)(_sync_method), NOT_ASYNC),
        (lambda: concurrent_endpoint(lambda self: 1), NOT_ASYNC),
    ],
)
def test_concurrent_endpoint_misuse_is_a_value_error(wrap: Any, message: str) -> None:
    with pytest.raises(ValueError, match="concurrent_endpoint") as info:
        wrap()
    assert str(info.value) == message


# -- meshes ---------------------------------------------------------------------------------------


def test_initialized_resolves_to_true_for_procs_and_hosts(procs: ProcMesh) -> None:
    assert procs.initialized.get(timeout=60) is True
    assert this_host().initialized.get(timeout=60) is True


class Named(Actor):
    @endpoint
    def names(self) -> tuple[str, str, str | None]:
        instance = context().actor_instance
        return current_actor_name(), instance.name, instance.class_name


def test_actor_names_are_unique_and_start_with_the_mesh_name(procs: ProcMesh) -> None:
    first = procs.spawn("Twin_Mesh", Named).names.call().get(timeout=60).values()
    second = procs.spawn("Twin_Mesh", Named).names.call().get(timeout=60).values()
    ids = [name for name, _, _ in first + second]
    assert len(set(ids)) == 4  # two meshes of two, one name each
    assert all(name.startswith("twin_mesh<") for name in ids)  # lower-cased, as upstream's
    assert {mesh_name for _, mesh_name, _ in first + second} == {"Twin_Mesh"}
    assert {class_name for _, _, class_name in first} == {f"{Named.__module__}.Named"}


@pytest.mark.parametrize(
    ("given", "written"),
    [("9lives", "lives"), ("My.Mesh", "mymesh"), ("a b-c_d", "ab-c_d"), ("__", "nil"), ("", "nil")],
)
def test_actor_names_spell_the_mesh_name_as_upstream(
    procs: ProcMesh, given: str, written: str
) -> None:
    name, _, _ = procs.slice(gpus=0).spawn(given, Named).names.call_one().get(timeout=60)
    assert name.startswith(f"{written}<")


def test_client_context_is_the_root() -> None:
    instance = context().actor_instance
    assert instance.name == "root"
    assert instance.class_name is None


class Echo(Actor):
    @endpoint
    def echo(self, value: int) -> int:
        return value


def test_send_takes_upstreams_selection_words(procs: ProcMesh) -> None:
    echo = procs.spawn("echo", Echo)
    port, receiver = Channel[int].open()
    send(echo.echo, (7,), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=60) == 7
    for word in ("*", "?", "bogus"):
        with pytest.raises(ValueError, match="Invalid selection") as info:
            send(echo.echo, (1,), {}, port=port, selection=word)
        assert str(info.value) == f"Invalid selection: {word}"
    with pytest.raises(TypeError, match="argument 'selection': 'int' object cannot be cast"):
        send(echo.echo, (1,), {}, port=port, selection=3)  # type: ignore[arg-type]
