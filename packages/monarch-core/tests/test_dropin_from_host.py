"""``ProcMesh.from_host_mesh`` and the spawn callbacks it calls, as upstream's: its signature,
every ``spawn_procs`` reaching the registered callbacks with the mesh it returns, and (ours
only: upstream's takes a native handle users cannot make) a ``setup`` that runs on each proc
before the actors spawned on the result.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0.
"""

from __future__ import annotations

import inspect
import os

import pytest

from monarch._src.actor.proc_mesh import (
    register_proc_mesh_spawn_callback,
    unregister_proc_mesh_spawn_callback,
)
from monarch.actor import Actor, ProcMesh, endpoint, this_host


class Env(Actor):
    @endpoint
    def get(self, name: str) -> str | None:
        return os.environ.get(name)


def test_from_host_mesh_has_upstreams_signature() -> None:
    parameters = list(inspect.signature(ProcMesh.from_host_mesh).parameters)
    assert parameters == [
        "host_mesh",
        "hy_proc_mesh",
        "region",
        "setup",
        "_attach_controller_controller",
    ]
    default = inspect.signature(ProcMesh.from_host_mesh).parameters["setup"].default
    assert default is None


def test_every_spawn_reaches_the_callbacks_until_unregistered() -> None:
    seen: list[ProcMesh] = []
    register_proc_mesh_spawn_callback(seen.append)
    try:
        procs = this_host().spawn_procs(per_host={"gpus": 2})
    finally:
        unregister_proc_mesh_spawn_callback(seen.append)
    assert seen == [procs] and seen[0] is procs
    later = this_host().spawn_procs(per_host={"gpus": 1})
    assert seen == [procs]  # unregistered: not told
    with pytest.raises(ValueError, match="remove"):  # list.remove's: not registered
        unregister_proc_mesh_spawn_callback(seen.append)
    procs.stop().get(timeout=60)
    later.stop().get(timeout=60)


def set_marker() -> None:
    os.environ["FROM_HOST_SETUP"] = "ran"


@pytest.mark.ours_only  # upstream's second argument is a native handle of procs spawning
def test_setup_runs_on_each_proc_before_the_actors_of_the_result() -> None:
    host = this_host()
    procs = host.spawn_procs(per_host={"gpus": 2})
    seen: list[ProcMesh] = []
    register_proc_mesh_spawn_callback(seen.append)
    try:
        mesh = ProcMesh.from_host_mesh(host, procs, procs.extent.region, setup=set_marker)
    finally:
        unregister_proc_mesh_spawn_callback(seen.append)
    assert seen == [mesh]
    values = mesh.spawn("env", Env).get.call("FROM_HOST_SETUP").get(timeout=60)
    assert [value for _, value in values.items()] == ["ran", "ran"]
    with pytest.raises(ValueError, match="region"):
        ProcMesh.from_host_mesh(host, procs, procs.slice(gpus=0).extent.region)
    with pytest.raises(TypeError, match="ProcMesh"):
        ProcMesh.from_host_mesh(host, object(), procs.extent.region)  # type: ignore[arg-type]
    mesh.stop().get(timeout=60)
