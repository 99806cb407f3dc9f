"""Procs forked by their host agent's zygote (``fork_procs``, on by default): they serve as
procs started as new Pythons do, and a dead zygote takes its procs, not the agent."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import Actor, endpoint, this_host
from monarch.config import configured

HERE = Path(__file__).resolve().parent


class Where(Actor):
    @endpoint
    def where(self) -> tuple[int, int, str, str, bool]:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ")
        return (
            os.getpid(),
            os.getppid(),
            parent.decode(),
            os.getcwd(),
            str(HERE) in sys.path,
        )


def test_procs_are_forks_of_one_zygote_with_the_agents_directory_and_path() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    found = list(procs.spawn("where", Where).where.call().get(timeout=60).values())
    pids = {pid for pid, *_ in found}
    parents = {parent for _, parent, *_ in found}
    assert len(pids) == 3 and len(parents) == 1 and os.getpid() not in parents
    assert all("monarch.core._host._zygote_proc" in cmdline for _, _, cmdline, _, _ in found)
    assert all(cwd == os.getcwd() and path for *_, cwd, path in found)
    procs.stop().get(timeout=60)


class ZygoteMaps(Actor):
    @endpoint
    def mapped(self) -> str:
        return Path(f"/proc/{os.getppid()}/maps").read_text()


def test_the_zygote_imports_what_a_proc_imports_as_it_starts_serving() -> None:
    """Its procs find uvloop loaded (an extension module: in the zygote's memory map),
    and nothing else imported between a fork and the proc's listening and dialing."""
    uvloop = importlib.util.find_spec("uvloop") is not None  # not a dependency: optional
    procs = this_host().spawn_procs(per_host={"gpus": 2})  # two at once: forks
    maps = procs.spawn("maps", ZygoteMaps).mapped.call().get(timeout=60).values()
    procs.stop().get(timeout=60)
    assert all(("/uvloop/loop." in mapped) == uvloop for mapped in maps)
    done = subprocess.run([sys.executable, "-c", PROC_START], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(uvloop), "[]"]


PROC_START = """if True:
    import os, sys
    from monarch.core._host._bootstrap import import_proc_start
    from monarch.core._runtime import Runtime, new_event_loop
    from monarch.core._runtime._peers import dial

    import_proc_start()
    before = set(sys.modules)
    loop = new_event_loop()
    runtime = Runtime(loop, os.urandom(32))

    async def serve() -> None:
        await runtime.start("unix://@")
        conn = await dial(runtime, runtime.address)
        await conn.aclose()
        await runtime.aclose()

    loop.run_until_complete(serve())
    print(type(loop).__module__ == "uvloop", sorted(set(sys.modules) - before))
"""


def preload_client(mode: str, module: str) -> dict[str, Any]:
    """Run ``zygote_preload_client.py``: the steps it printed."""
    done = subprocess.run(
        [sys.executable, str(HERE / "zygote_preload_client.py"), mode, module],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            steps.update(json.loads(line))
    return steps


def test_the_first_procs_answer_without_the_preload_and_later_ones_have_it() -> None:
    """A proc is forked at once, without what ``proc_preload`` asks (its zygote would take
    seconds to import torch first); a successor zygote imports it meanwhile, and the procs
    asked for once it is done are its forks and find it imported there."""
    steps = preload_client("ready", "zygote_preload_probe")
    # Rank 0's request comes first, before the successor exists; rank 1's may find it
    # ready already (this module imports in microseconds, torch in seconds).
    zygote = steps["first"][0]["parent"]
    assert not steps["first"][0]["found"] and len(steps["first"]) == 2
    assert steps["successor"] is True
    later = steps["later"]
    assert later["found"] and later["imported_by"] == later["parent"] != zygote
    assert later["parent_threads"] == 1


def test_a_preload_that_starts_a_thread_leaves_procs_to_the_zygote_without_it() -> None:
    """The successor that imported it may not fork (a fork copies only the forking thread):
    it exits, and procs go on being forked by the zygote, which never imported it."""
    steps = preload_client("thread", "zygote_thread_probe")
    zygote = steps["first"][0]["parent"]
    (after,) = steps["after"]
    assert after["parent"] == zygote and not after["found"] and after["parent_threads"] == 1


def test_a_dead_successor_takes_its_procs_and_the_zygote_forks_on() -> None:
    """Its procs die with it; the zygote, their subreaper, reports their exits."""
    steps = preload_client("kill", "zygote_preload_probe")
    zygote = steps["first"][0]["parent"]
    assert steps["later"]["parent"] != zygote
    assert "sig=9" in steps["fault"]
    (after,) = steps["after"]
    assert after["parent"] == zygote and not after["found"]


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed (pkg-core)"
)
def test_procs_of_a_spawner_that_imported_torch_answer_before_it_and_get_it() -> None:
    """A first proc answers without torch, imports it when a tensor reaches it; procs
    forked once the successor has imported it have it without importing it."""
    steps = preload_client("torch", "torch")
    assert not steps["first"][0]["found"] and len(steps["first"]) == 2
    assert steps["tensor"] == [[2.0, 2.0], True]
    later = steps["later"]
    assert later["found"] and later["parent"] != steps["first"][0]["parent"]


LONE = """if True:
    import os
    from monarch.actor import Actor, endpoint, this_host

    class Parent(Actor):
        @endpoint
        def parent(self) -> int:
            return os.getppid()

    first = this_host().spawn_procs(per_host={"gpus": 1})  # the agent's first: alone
    print(first.spawn("p", Parent).parent.call_one().get(timeout=60) == os.getpid())
    more = this_host().spawn_procs(per_host={"gpus": 2})  # the zygote started beside it
    parents = set(more.spawn("p", Parent).parent.call().get(timeout=60).values())
    print(len(parents) == 1 and os.getpid() not in parents)
"""


def test_a_lone_first_proc_starts_itself_and_the_zygote_after_it() -> None:
    """A script's first proc, alone: a new Python (as fast as the zygote's own start would
    be, without the fork after it); the procs after it are forks of the zygote."""
    done = subprocess.run([sys.executable, "-c", LONE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True"]


def test_with_fork_procs_off_each_proc_is_a_new_python() -> None:
    with configured(fork_procs=False):
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        found = procs.spawn("where", Where).where.call().get(timeout=60).values()
        collecting = procs.spawn("gc", Collecting).collecting.call().get(timeout=60).values()
    assert {parent for _, parent, *_ in found} == {os.getpid()}
    procs.stop().get(timeout=60)
    assert list(collecting) == [True, True]


class Collecting(Actor):
    @endpoint
    def collecting(self) -> bool:
        """Whether this proc's collector runs (off while a proc or a zygote imports the
        core, on again once it has frozen what it imported)."""
        import gc

        return gc.isenabled()


def test_forked_procs_collect_garbage_once_started() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})  # forks of the zygote
    collecting = procs.spawn("gc", Collecting).collecting.call().get(timeout=60).values()
    procs.stop().get(timeout=60)
    assert list(collecting) == [True, True]


def test_a_killed_zygote_fails_its_procs_and_later_procs_start_without_it() -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / "zygote_client.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "FAILED: the process this actor was running on failed: Killed(sig=9)" in done.stdout
    assert "PARENTS ARE US: True" in done.stdout
