"""Procs forked by their host agent's zygote (``fork_procs``, on by default): they serve as
procs started as new Pythons do, and a dead zygote takes its procs, not the agent."""

from __future__ import annotations

import asyncio
import dis
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from monarch._zygote_start import preloaded
from monarch.actor import Actor, endpoint, this_host
from monarch.config import configured
from monarch.core._config import current_config
from monarch.core._host import _watching
from monarch.core._host._zygote import ForkedProc
from monarch.core.testing import alive

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
    the handshake's features looked up, and nothing else imported between a fork and the
    proc's listening and dialing."""
    uvloop = importlib.util.find_spec("uvloop") is not None  # not a dependency: optional
    procs = this_host().spawn_procs(per_host={"gpus": 2})  # two at once: forks
    maps = procs.spawn("maps", ZygoteMaps).mapped.call().get(timeout=60).values()
    procs.stop().get(timeout=60)
    assert all(("/uvloop/loop." in mapped) == uvloop for mapped in maps)
    done = subprocess.run([sys.executable, "-c", PROC_START], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(uvloop), "True", "[]"]


PROC_START = """if True:
    import os, sys
    from monarch.core._host._bootstrap import import_proc_start
    from monarch.core._runtime import Runtime, new_event_loop
    from monarch.core._runtime._peers import dial
    from monarch.transport._mac import available_features

    import_proc_start()
    warmed = available_features.cache_info().currsize == 1  # no find_spec left to a fork
    before = set(sys.modules)
    loop = new_event_loop()
    runtime = Runtime(loop, os.urandom(32))

    async def serve() -> None:
        await runtime.start("unix://@")
        conn = await dial(runtime, runtime.address)
        await conn.aclose()
        await runtime.aclose()

    loop.run_until_complete(serve())
    print(type(loop).__module__ == "uvloop", warmed, sorted(set(sys.modules) - before))
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


def run_script(script: str, *args: str, **env: str) -> str:
    """Run ``script`` (``python -c``) with the tests' folder on its path and ``env``
    added; its output, once it has exited 0."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(HERE), **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


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


PRELOAD_AT_IMPORT = """if True:
    import os, sys, time
    from pathlib import Path
    from monarch import _zygote_start
    from monarch.actor import Actor, endpoint, this_host
    from monarch.config import configured

    class Probe(Actor):
        @endpoint
        def probe(self) -> tuple[int, object, bool]:
            module = sys.modules.get("zygote_gate_probe")
            return os.getppid(), getattr(module, "IMPORTED_BY", None), "wave" in sys.modules

        @endpoint
        def zygotes(self) -> bool:  # whether this proc's zygote started one at an import
            return bool(_zygote_start._started)

    def children(pid: int) -> list[int]:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def probe() -> tuple[int, object, bool]:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        found = procs.spawn("p", Probe).probe.call_one().get(timeout=60)
        procs.stop().get(timeout=60)
        return found

    zygote = _zygote_start._started[0][1][0].pid
    deadline = time.monotonic() + 120
    while not children(zygote):  # before any spawn: the successor, preloading
        assert time.monotonic() < deadline, "no successor"
        time.sleep(0.02)
    (successor,) = children(zygote)
    print(successor != zygote)
    with configured(proc_preload="zygote_gate_probe,wave,zygote_no_such_module"):
        # Forked at once by the zygote, without either; the successor, still importing
        # (the gate is shut), is asked to import wave as well before it is ready.
        parent, imported_by, wave = probe()
        print(parent == zygote and imported_by is None and not wave)
        Path(os.environ["ZYGOTE_GATE"]).touch()
        while parent != successor:  # procs forked once it is ready are its forks
            assert time.monotonic() < deadline, "no proc of the successor"
            parent, imported_by, wave = probe()
        print(imported_by == successor and wave)
        # The module that fails to import was tried once: the procs asked for later are
        # still the successor's, not a chain of successors each trying it again.
        print(all(probe()[0] == successor for _ in range(3)))
        # The preload imported monarch.actor (as monarch.tensor does): no zygote started
        # there (its successor would import it again, and so on: a chain).
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        print(procs.spawn("p", Probe).zygotes.call_one().get(timeout=60) is False)
        procs.stop().get(timeout=60)
"""


def test_a_scripts_zygote_preloads_what_the_script_imported_before_monarch_at_once(
    tmp_path: Path,
) -> None:
    """What procs should find imported (``proc_preload``: torch, where a script imported it
    before ``monarch.actor``) the zygote started at import begins importing at once, in its
    successor, not at the first spawn: the time a script spends before it spawns is that
    import's. What a spawn asks for beyond that while the successor imports, it imports
    too before it forks: its procs have both (and a module that fails to import is tried
    once, not again by a new successor at each later request). A preload that imports
    monarch.actor starts no zygote in the successor."""
    out = run_script(
        PRELOAD_AT_IMPORT,
        MONARCH_PROC_PRELOAD="zygote_gate_probe",
        ZYGOTE_GATE=str(tmp_path / "gate"),
    )
    assert out.split() == ["True"] * 5


def test_auto_preload_names_what_the_spawner_imported_of_torch_and_the_tensor_engine() -> None:
    assert preloaded("auto", {"torch", "numpy"}) == "torch"
    assert preloaded(" auto ", {"monarch.tensor", "torch"}) == "torch,monarch.tensor"
    assert preloaded("auto", {"numpy"}) == ""
    assert preloaded("numpy,torch", set()) == "numpy,torch"
    assert preloaded("", {"torch"}) == ""


LONE = """if True:
    import os
    from monarch.actor import Actor, endpoint, this_host

    class Parent(Actor):
        @endpoint
        def parent(self) -> int:
            return os.getppid()

        @endpoint
        def torch(self) -> bool:
            import sys

            return "torch" in sys.modules

    first = this_host().spawn_procs(per_host={"gpus": 1})  # the agent's first: alone
    lone = first.spawn("p", Parent).parent.call_one().get(timeout=60)
    print(lone == os.getpid())
    more = this_host().spawn_procs(per_host={"gpus": 2})  # the zygote started beside it
    parents = set(more.spawn("p", Parent).parent.call().get(timeout=60).values())
    print(len(parents) == 1 and os.getpid() not in parents)
    print(lone in parents)
"""


def run_lone(**env: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", LONE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_a_scripts_zygote_starts_at_its_import_and_forks_even_a_lone_first_proc() -> None:
    """Started as the script imported monarch.actor (``monarch._zygote_start``): the lone
    first proc is its fork, as are the procs after it."""
    assert run_lone() == ["False", "True", "True"]


def test_a_lone_first_proc_starts_itself_and_the_zygote_after_it() -> None:
    """Without the zygote started at import: a script's first proc, alone, is a new Python
    (as fast as the zygote's own start would be, without the fork after it); the procs after
    it are forks of the zygote."""
    assert run_lone(MONARCH_PRESTART_ZYGOTE="0") == ["True", "True", "False"]


def test_a_proc_that_imports_monarch_actor_starts_no_zygote_of_its_own() -> None:
    """A proc (an actor's module imports monarch.actor there) is served by its agent's
    zygote: it starts none itself, nor does a fork of the script."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    found = procs.spawn("prestarts", Prestarts).prestarts.call_one().get(timeout=60)
    procs.stop().get(timeout=60)
    assert found == (False, [])
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "False", "None"]


class Prestarts(Actor):
    @endpoint
    def prestarts(self) -> tuple[bool, list[int]]:
        """Whether a zygote waits here (started at import), and this proc's children."""
        from monarch import _zygote_start

        children = Path(f"/proc/self/task/{os.getpid()}/children").read_text().split()
        return _zygote_start.prestarted(), [int(pid) for pid in children]


FORKED = """if True:
    import os
    from monarch import _zygote_start
    import monarch.actor

    print(_zygote_start.prestarted())
    pid = os.fork()
    if pid == 0:
        print(_zygote_start.prestarted(), _zygote_start.take(), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""


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


def test_fork_requests_to_a_frozen_zygote_do_not_block_the_agent() -> None:
    """More requests than the zygote's socket holds, while the zygote does not read: the
    caller (the agent's event loop) is not held up, nor is the lock that reading the
    zygote's answers takes; once the zygote reads again, every request is answered. (A
    spawn of 1,024 procs hung so, then its first procs timed out dialing a blocked agent.)"""
    import signal
    import threading

    from monarch.core._host._zygote import Zygote

    zygote = Zygote()
    answered: list[ForkedProc | None] = []
    all_answered = threading.Event()
    count = 30
    padded = {"PAD": "x" * 32768}  # 30 of them do not fit the socket's buffer (~200 KiB)

    def started(proc: ForkedProc | None, error: str) -> None:
        answered.append(proc)
        if len(answered) == count + 1:
            all_answered.set()

    zygote.fork({}, True, started)  # the zygote runs (its first answer came)
    first = zygote.process
    assert first is not None
    try:
        deadline = time.monotonic() + 60
        while not answered and time.monotonic() < deadline:
            time.sleep(0.01)
        assert answered, "the zygote never answered"
        os.kill(first.pid, signal.SIGSTOP)

        def send_all() -> None:
            for _ in range(count):
                zygote.fork(padded, True, started)

        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        sender.join(30)
        assert not sender.is_alive(), "fork() waits for a frozen zygote"
        assert zygote.lock.acquire(timeout=10), "a waiting request holds the zygote's lock"
        zygote.lock.release()
        assert len(answered) == 1
        os.kill(first.pid, signal.SIGCONT)
        assert all_answered.wait(60), f"{len(answered)} of {count + 1} forks answered"
        for proc in answered:  # they fail at once (no job in their environment)
            assert proc is not None
            proc.wait(60)
    finally:
        os.kill(first.pid, signal.SIGCONT)
        zygote.stop()


def test_the_zygote_frees_what_its_imports_left_before_it_forks() -> None:
    """``compact`` (before the zygote's first fork and ``gc.freeze``) collects cycles left
    while the collector was off: frozen, they would stay in every proc's memory."""
    import gc
    import weakref

    from monarch.core._host._zygote_proc import compact

    class Node:
        other: object = None

    was_enabled = gc.isenabled()
    gc.disable()  # as while the zygote imports
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None
        compact()
        assert gone() is None
    finally:
        if was_enabled:
            gc.enable()


class Environment(Actor):
    @endpoint
    def both(self) -> tuple[dict[str, str], dict[str, str]]:
        """The proc's ``os.environ`` and its C environment, as a program it runs gets it."""
        listed = subprocess.run(["env", "-0"], capture_output=True, check=True).stdout
        c_env = dict(entry.split("=", 1) for entry in listed.decode().split("\0") if entry)
        return dict(os.environ), c_env

    @endpoint
    def zygotes(self) -> dict[str, str]:
        """The environment its zygote started with."""
        raw = Path(f"/proc/{os.getppid()}/environ").read_bytes()
        return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


def test_a_forked_proc_has_the_agents_environment_not_the_zygotes() -> None:
    """The zygote's environment is changed only where the request's differs: a variable
    the agent dropped since the zygote started is gone, a new one is there, and the C
    environment (what a program the proc runs gets) says the same as ``os.environ``."""
    first = this_host().spawn_procs(per_host={"gpus": 2})  # the zygote runs
    zygotes = first.spawn("env", Environment).zygotes.call().get(timeout=60).values()
    first.stop().get(timeout=60)
    zygote = next(iter(zygotes))
    essential = {"PATH", "HOME", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV"}
    dropped = next(
        name
        for name in sorted(zygote)
        if name in os.environ and name not in essential and not name.startswith("MONARCH")
    )
    saved = dict(os.environ)
    try:
        del os.environ[dropped]
        os.environ["MONARCH_TEST_ADDED"] = "added"
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        found = procs.spawn("env", Environment).both.call().get(timeout=60).values()
        procs.stop().get(timeout=60)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    for python_env, c_env in found:
        assert dropped not in python_env and dropped not in c_env
        assert python_env["MONARCH_TEST_ADDED"] == c_env["MONARCH_TEST_ADDED"] == "added"
        assert python_env == c_env


class Configured(Actor):
    @endpoint
    def tail_log_lines(self) -> int:
        return current_config().tail_log_lines


def test_a_forked_proc_reads_the_configuration_its_request_changed() -> None:
    """A fork re-reads only the configuration variables its request changed from the
    zygote's environment (``refresh_environment``): a key the agent's environment set after
    the zygote started is the proc's, not the zygote's."""
    first = this_host().spawn_procs(per_host={"gpus": 1})  # the zygote runs
    before = first.spawn("conf", Configured).tail_log_lines.call().get(timeout=60).values()
    first.stop().get(timeout=60)
    variable = "HYPERACTOR_MESH_TAIL_LOG_LINES"
    wanted = next(n for n in (7, 8) if n not in before)
    saved = os.environ.get(variable)
    os.environ[variable] = str(wanted)
    try:
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        found = procs.spawn("conf", Configured).tail_log_lines.call().get(timeout=60).values()
        procs.stop().get(timeout=60)
    finally:
        if saved is None:
            del os.environ[variable]
        else:
            os.environ[variable] = saved
    assert list(found) == [wanted, wanted]


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_mesh_of_64_forked_procs_stops_with_none_left_and_no_thread_per_proc() -> None:
    """The agent hears of each forked proc's exit from its zygote, with no thread per
    proc waiting for it; every proc has exited when ``stop()`` returns, and the agent
    keeps nothing of them for their spawner (``_watching``)."""
    procs = this_host().spawn_procs(per_host={"gpus": 64})
    pids = list(procs.spawn("pid", Pid).pid.call().get(timeout=120).values())
    waiting = [t.name for t in threading.enumerate() if t.name.startswith("monarch-wait-")]
    procs.stop().get(timeout=120)
    assert len(set(pids)) == 64
    assert waiting == []
    assert [pid for pid in pids if alive(pid)] == []
    assert {child.pid for child in _watching.running_children()}.isdisjoint(pids)


def test_a_forked_procs_exit_callbacks_run_once_and_a_failing_one_harms_no_other() -> None:
    proc = ForkedProc(os.getpid(), None, None)  # never signalled: only its bookkeeping
    heard: list[tuple[str, int]] = []

    def failing(code: int) -> None:
        raise RuntimeError("a broken reporter")

    proc.when_exited(failing)
    proc.when_exited(lambda code: heard.append(("before", code)))
    proc._exited(3)
    proc.when_exited(lambda code: heard.append(("after", code)))
    assert heard == [("before", 3), ("after", 3)]
    assert proc.poll() == 3 and proc.wait(0) == 3


class Warmth(Actor):
    @endpoint
    def warmth(self) -> tuple[int, bool]:
        """The rounds its zygote had rehearsed when it forked this proc, and whether the
        server's step of the handshake (run twice per connection this proc accepted: 3.11
        specializes at the eighth call) is specialized."""
        from monarch.core._host._rehearsal import rounds_done
        from monarch.transport.wire import Handshake

        code = dis.get_instructions(Handshake._server_step, adaptive=True)
        return rounds_done[0], any(op.opname not in dis.opmap for op in code)


def test_the_zygote_rehearses_a_procs_start_while_idle_and_its_procs_start_warm() -> None:
    """Once the zygote has had no request for a few moments (a round each), its procs
    are forked with the messaging code already run and specialized (``_rehearsal``)."""
    from monarch.core._host._rehearsal import ROUNDS
    from monarch.core._host._zygote_proc import QUIET_BEFORE_REHEARSAL

    deadline = time.monotonic() + 60
    while True:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        done, specialized = procs.spawn("warmth", Warmth).warmth.call_one().get(timeout=60)
        procs.stop().get(timeout=60)
        if done == ROUNDS:
            break
        assert 0 <= done < ROUNDS
        assert time.monotonic() < deadline, f"the zygote rehearsed {done} of {ROUNDS} rounds"
        time.sleep(2 * QUIET_BEFORE_REHEARSAL)  # the quiet the zygote rehearses in
    assert specialized


HEAP_SCRIPT = """if True:
    import json
    import time

    from monarch.actor import Actor, endpoint, this_host
    from monarch.core._host._zygote_proc import QUIET_BEFORE_REHEARSAL

    class Pages(Actor):
        @endpoint
        def huge(self) -> tuple[bool, int]:
            import sys

            with open("/proc/self/smaps_rollup") as rollup:
                huge = [int(line.split()[1]) for line in rollup if "AnonHuge" in line]
            return "zygote_heap_probe" in sys.modules, huge[0]

    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        found, kib = procs.spawn("pages", Pages).huge.call_one().get(timeout=60)
        procs.stop().get(timeout=60)
        seen.append([found, kib])
        if found and kib >= 32 * 1024:
            break
        time.sleep(2 * QUIET_BEFORE_REHEARSAL)  # the quiet the zygote settles in
    print(json.dumps(seen))
"""


def _huge_pages_possible() -> bool:
    """Whether this kernel moves memory onto huge pages when asked (Linux 6.1, THP on)."""
    from monarch.core._payload import _memory as memory

    if not memory.available():
        return False
    data = bytearray(b"\x01") * (3 * memory.HUGE_PAGE)
    at = memory.address_of(data)
    return memory.collapse_to_huge_pages(*memory.whole_huge_pages(at, at + len(data)))


def test_an_idle_zygote_moves_its_heap_onto_huge_pages_and_its_forks_map_them_so() -> None:
    """Once settled, a zygote has its heap on huge pages (``settle``): the successor that
    preloaded 64 MiB nothing writes again (as torch's import leaves one) forks procs that
    map it an entry per 2 MiB, not 512."""
    if not _huge_pages_possible():
        pytest.skip("this kernel does not move memory onto huge pages (MADV_COLLAPSE)")
    seen = json.loads(run_script(HEAP_SCRIPT, MONARCH_PROC_PRELOAD="zygote_heap_probe"))
    found, kib = seen[-1]
    assert found and kib >= 32 * 1024, seen


BURST = """if True:
    import json

    from monarch.actor import Actor, endpoint, this_host

    class Warmth(Actor):
        @endpoint
        def rounds(self) -> int:
            from monarch.core._host._rehearsal import rounds_done

            return rounds_done[0]

    procs = this_host().spawn_procs(per_host={"gpus": 40})  # at once: the zygote is busy
    done = list(procs.spawn("w", Warmth).rounds.call().get(timeout=120).values())
    print(json.dumps(done))
    procs.stop().get(timeout=60)
"""


def test_a_large_spawn_right_after_the_import_gets_its_later_procs_forked_warm() -> None:
    """A script that spawns many procs at once gives its zygote no idle moment: past
    ``REHEARSE_IN_BURST`` forks the zygote rehearses between them, so the rest start warm."""
    out = run_script(BURST, MONARCH_PRESTART_ZYGOTE="0")  # the zygote started by the spawn
    from monarch.core._host._rehearsal import ROUNDS
    from monarch.core._host._zygote_proc import REHEARSE_IN_BURST as BURST_AT

    # The rounds each proc's zygote had done when it forked it, in rank order (the order
    # of the forks): once it has forked BURST_AT, one round after each fork.
    rounds = json.loads(out.splitlines()[-1])
    assert rounds == sorted(rounds) and rounds[-1] == ROUNDS, rounds
    assert rounds[BURST_AT] == rounds[BURST_AT - 1] + 1, rounds


def test_a_rehearsal_round_leaves_no_loop_thread_or_descriptor_for_a_fork_to_copy() -> None:
    from monarch.core._host._rehearsal import rehearse_round, rounds_done

    assert rehearse_round()  # the first: what the process imports or caches once
    threads = set(threading.enumerate())
    fds = set(os.listdir("/proc/self/fd"))
    before = rounds_done[0]
    assert rehearse_round()
    assert rounds_done[0] == before + 1
    assert set(threading.enumerate()) == threads
    assert set(os.listdir("/proc/self/fd")) == fds
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


FINALIZERS = """if True:
    import os, sys, time
    from monarch.actor import Actor, endpoint, this_host

    class Arm(Actor):
        @endpoint
        def arm(self, path: str) -> tuple[int, bool]:
            import weakref

            found = "zygote_finalizer_probe" in sys.modules  # its zygote's preload
            import zygote_finalizer_probe as probe

            class Own:
                pass

            self.own = Own()
            weakref.finalize(self.own, probe.write, path, "own")
            probe.PATH[0] = path
            return os.getpid(), found

    deadline = time.monotonic() + 120
    while True:  # until a proc is the fork of the successor that preloaded the probe
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        pid, found = procs.spawn("arm", Arm).arm.call_one(sys.argv[1]).get(timeout=60)
        procs.stop().get(timeout=60)
        if found:
            break
        assert time.monotonic() < deadline, "no proc forked by the preloading successor"
    print(pid)
"""


def test_a_proc_runs_its_own_finalizers_at_exit_not_those_its_zygote_registered(
    tmp_path: Path,
) -> None:
    """``weakref.finalize`` callbacks registered by what the zygote imported (torch's: one
    per operator library, ~26 ms of CPU a proc) are left to the exit, as the zygote's
    objects are; the proc's own still run."""
    out = run_script(FINALIZERS, str(tmp_path), MONARCH_PROC_PRELOAD="zygote_finalizer_probe")
    pid = int(out.split()[-1])
    assert (tmp_path / f"own.{pid}").exists(), sorted(p.name for p in tmp_path.iterdir())
    assert not (tmp_path / f"zygote.{pid}").exists()
