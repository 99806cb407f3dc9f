"""The debugger: ``breakpoint()`` in endpoints on real procs, ``monarch debug`` driven under
a pseudo-terminal, as a user types at it.

The console listens on a free port (``MONARCH_DEBUG_SERVER_PORT=0``) and keeps its token
under a HOME of the test's own; ``monarch debug`` reads it from there.
"""

from __future__ import annotations

import linecache
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import (
    Actor,
    ActorError,
    current_rank,
    debug_controller,
    endpoint,
    this_host,
)
from monarch.core._debugger._commands import (
    Attach,
    Cast,
    Continue,
    ListSessions,
    Quit,
    Ranks,
    parse,
    parse_ranks,
    selects,
)
from monarch.core._debugger._console import console

DEADLINE = 60.0
STOPS_ON_ITS_LINE = sys.version_info >= (3, 13)
"""Python 3.13's ``breakpoint()`` stops on its own line; earlier ones on the next."""


class Debugee(Actor):
    @endpoint
    def compute(self, x: int) -> int:
        y = x * 2
        breakpoint()
        z = y + 1
        return z

    @endpoint
    def fails_after_a_stop(self, x: int) -> int:
        y = x + 1
        breakpoint()
        raise ValueError(f"boom {y}")

    @endpoint
    def stop_on(self, rank: int, x: int) -> int:
        """A breakpoint on rank ``rank`` only."""
        if current_rank().rank == rank:
            breakpoint()
        return x + 1

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class AsyncDebugee(Actor):
    @endpoint
    async def compute(self, x: int) -> int:
        y = x * 3
        breakpoint()
        return y + 1


class Terminal:
    """``monarch debug`` on a pseudo-terminal."""

    def __init__(self, port: int, env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "monarch.core._command._cli", "debug", "--port", str(port)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            close_fds=True,
        )
        os.close(slave)
        self.seen = ""

    def expect(self, pattern: str) -> str:
        """Read until ``pattern`` (a regex) shows; what came before it and it."""
        deadline = time.monotonic() + DEADLINE
        regex = re.compile(pattern)
        while (found := regex.search(self.seen)) is None:
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in:\n{self.seen}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:  # the command exited
                    data = b""
                assert data, f"monarch debug ended before {pattern!r}:\n{self.seen}"
                self.seen += data.decode(errors="replace").replace("\r\n", "\n")
        shown, self.seen = self.seen[: found.end()], self.seen[found.end() :]
        return shown

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=DEADLINE)
        finally:
            os.close(self.master)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A HOME of our own (the token file) and a free console port, for the module."""
    home = tmp_path_factory.mktemp("home")
    saved = {k: os.environ.get(k) for k in ("HOME", "MONARCH_DEBUG_SERVER_PORT")}
    os.environ["HOME"] = str(home)
    os.environ["MONARCH_DEBUG_SERVER_PORT"] = "0"
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def wait_for_sessions(count: int) -> list[Any]:
    controller = debug_controller()
    deadline = time.monotonic() + DEADLINE
    while len(infos := controller.list.call_one(print_output=False).get(timeout=DEADLINE)) < count:
        assert time.monotonic() < deadline, f"{len(infos)} sessions, not {count}"
    return list(infos)


def open_terminal(home: Path) -> Terminal:
    terminal = Terminal(console.port, {**os.environ, "HOME": str(home)})
    terminal.expect("monarch_dbg> ")
    return terminal


def test_two_ranks_stop_attach_step_cast_and_continue(home: Path) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("debugee", Debugee)
    result = mesh.compute.call(10)
    infos = wait_for_sessions(2)
    assert [(i.actor_name, i.rank, i.coords) for i in infos] == [
        ("debugee", 0, {"gpus": 0}),
        ("debugee", 1, {"gpus": 1}),
    ]
    assert all(i.function.endswith(".compute") and i.lineno > 0 for i in infos)
    terminal = open_terminal(home)
    terminal.send("list")
    listing = terminal.expect("monarch_dbg> ")
    assert re.search(r"\| debugee\s+\| 0\s+\| \{'gpus': 0\}", listing), listing
    assert re.search(r"\| debugee\s+\| 1\s+\| \{'gpus': 1\}", listing), listing
    terminal.send("attach debugee 1")
    terminal.expect(r"Attached to debug session for debugee 1")
    terminal.expect(r"\(Pdb\) ")
    terminal.send("p y")
    assert "20" in terminal.expect(r"\(Pdb\) ")
    if STOPS_ON_ITS_LINE:
        terminal.send("n")
        terminal.expect(r"z = y \+ 1\n\(Pdb\) ")
    terminal.send("n")
    terminal.expect(r"return z\n\(Pdb\) ")
    terminal.send("p z")
    assert "21" in terminal.expect(r"\(Pdb\) ")
    terminal.send("detach")
    terminal.expect("Detached from debug session for debugee 1")
    # One pdb command to several ranks; each keeps its output for whoever attaches.
    terminal.send("cast debugee ranks(0,1) p y * 5")
    terminal.expect("monarch_dbg> ")
    for rank in (0, 1):
        terminal.send(f"attach debugee {rank}")
        assert "100" in terminal.expect(r"\(Pdb\) ")
        terminal.send("detach")
        terminal.expect("monarch_dbg> ")
    assert not result.done()  # both ranks are still stopped
    terminal.send("continue")
    terminal.expect("monarch_dbg> ")
    assert list(result.get(timeout=DEADLINE).values()) == [21, 21]
    terminal.send("list")
    assert "debugee" not in terminal.expect("monarch_dbg> ")
    terminal.send("quit")
    terminal.expect("Quitting debug session")
    assert terminal.close() == 0
    procs.stop().get(timeout=DEADLINE)


CELL = """
class CellDebugee(Actor):
    @endpoint
    def compute(self, x: int) -> int:
        y = x * 2  # a line only the client can read
        breakpoint()
        return y + 1
"""


def cell_class() -> Any:
    """An actor class defined as a notebook cell defines it: its source in the client's
    linecache only (no file), the class pickled by value."""
    name = "<ipython-input-7-cell>"
    linecache.cache[name] = (len(CELL), None, CELL.splitlines(True), name)
    namespace: dict[str, Any] = {"Actor": Actor, "endpoint": endpoint, "__name__": "__main__"}
    exec(compile(CELL, name, "exec"), namespace)
    return namespace["CellDebugee"]


def test_code_of_a_notebook_cell_is_listed_and_a_cast_prints_each_ranks_answer(
    home: Path,
) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("cell", cell_class())
    result = mesh.compute.call(10)
    wait_for_sessions(2)
    terminal = open_terminal(home)
    terminal.send("cast cell ranks(0,1) p y")
    shown = terminal.expect("monarch_dbg> ")
    assert "[cell 0] 20\n" in shown and "[cell 1] 20\n" in shown, shown
    terminal.send("attach cell 0")
    terminal.expect(r"\(Pdb\) ")
    terminal.send("l")
    listing = terminal.expect(r"\(Pdb\) ")
    assert "y = x * 2  # a line only the client can read" in listing, listing
    here = "breakpoint()" if STOPS_ON_ITS_LINE else "return y + 1"
    assert f"->\t        {here}" in listing, listing  # where it stopped, in the cell
    terminal.send("detach")
    terminal.expect("monarch_dbg> ")
    terminal.send("continue")
    terminal.expect("monarch_dbg> ")
    assert list(result.get(timeout=DEADLINE).values()) == [21, 21]
    terminal.send("quit")
    terminal.expect("Quitting debug session")
    assert terminal.close() == 0
    procs.stop().get(timeout=DEADLINE)


def test_one_rank_stops_and_the_others_go_on(home: Path) -> None:
    """A breakpoint pauses that actor only: the other ranks answer, and so does another
    actor of the stopped rank's proc, while it waits at its prompt."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("partial", Debugee)
    neighbours = procs.spawn("neighbours", Debugee)
    stopped = mesh.stop_on.call(1, 7)
    [info] = wait_for_sessions(1)
    assert (info.actor_name, info.rank) == ("partial", 1)
    assert mesh.slice(gpus=0).pid.call_one().get(timeout=DEADLINE) > 0
    assert list(neighbours.pid.call().get(timeout=DEADLINE).values())[1] > 0
    assert not stopped.done()
    terminal = open_terminal(home)
    terminal.send("continue")
    terminal.expect("monarch_dbg> ")
    assert list(stopped.get(timeout=DEADLINE).values()) == [8, 8]
    terminal.send("quit")
    assert terminal.close() == 0
    procs.stop().get(timeout=DEADLINE)


def test_an_async_actor_stops_and_its_proc_keeps_serving_others(home: Path) -> None:
    procs = this_host().spawn_procs(per_host={"x": 1})
    stopped = procs.spawn("adebugee", AsyncDebugee)
    other = procs.spawn("other", Debugee)
    result = stopped.compute.call_one(5)
    wait_for_sessions(1)
    # The async actor's breakpoint blocks its own loop, not its proc's: the other actor
    # answers meanwhile; its session has a connection of its own, and once it goes on,
    # the actor answers again.
    assert other.pid.call_one().get(timeout=DEADLINE) > 0
    assert not result.done()
    terminal = open_terminal(home)
    terminal.send("attach adebugee 0")
    terminal.expect(r"\(Pdb\) ")
    terminal.send("p y")
    assert "15" in terminal.expect(r"\(Pdb\) ")
    terminal.send("c")
    terminal.expect("Detached from debug session for adebugee 0")
    assert result.get(timeout=DEADLINE) == 16
    assert other.pid.call_one().get(timeout=DEADLINE) > 0
    terminal.send("quit")
    assert terminal.close() == 0
    procs.stop().get(timeout=DEADLINE)


def test_an_endpoint_that_raises_after_a_stop_gets_a_post_mortem(home: Path) -> None:
    procs = this_host().spawn_procs(per_host={"x": 1})
    mesh = procs.spawn("failing", Debugee)
    result = mesh.fails_after_a_stop.call_one(1)
    wait_for_sessions(1)
    terminal = open_terminal(home)
    terminal.send("attach failing 0")
    terminal.expect(r"\(Pdb\) ")
    terminal.send("c")
    terminal.expect("Detached from debug session for failing 0")
    wait_for_sessions(1)  # the post-mortem session
    terminal.send("attach failing 0")
    shown = terminal.expect(r"\(Pdb\) ")
    assert "fails_after_a_stop" in shown, shown
    terminal.send("p y")
    assert "2" in terminal.expect(r"\(Pdb\) ")
    terminal.send("c")
    terminal.expect("Detached")
    with pytest.raises(ActorError, match="boom 2"):
        result.get(timeout=DEADLINE)
    terminal.send("quit")
    assert terminal.close() == 0
    procs.stop().get(timeout=DEADLINE)


def test_a_stopped_proc_that_dies_leaves_no_session(home: Path) -> None:
    procs = this_host().spawn_procs(per_host={"x": 1})
    mesh = procs.spawn("doomed", Debugee)
    pid = mesh.pid.call_one().get(timeout=DEADLINE)
    mesh.compute.call_one(1)
    wait_for_sessions(1)
    os.kill(pid, signal.SIGKILL)
    controller = debug_controller()
    deadline = time.monotonic() + DEADLINE
    while controller.list.call_one(print_output=False).get(timeout=DEADLINE):
        assert time.monotonic() < deadline, "the dead proc's session stayed"
    procs.stop().get(timeout=DEADLINE)


def test_a_console_without_the_token_is_refused(home: Path) -> None:
    procs = this_host().spawn_procs(per_host={"x": 1})
    mesh = procs.spawn("guarded", Debugee)
    result = mesh.compute.call_one(1)
    wait_for_sessions(1)
    env = {**os.environ, "HOME": str(home), "MONARCH_DEBUG_TOKEN": "0" * 32}
    refused = Terminal(console.port, env)
    refused.expect("refused: wrong token")
    assert refused.close() == 0
    terminal = open_terminal(home)
    terminal.send("continue")
    terminal.expect("monarch_dbg> ")
    assert result.get(timeout=DEADLINE) == 3
    terminal.send("quit")
    assert terminal.close() == 0
    procs.stop().get(timeout=DEADLINE)


def test_monarch_debug_without_a_token_file_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("MONARCH_DEBUG_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "monarch.core._command._cli", "debug", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode != 0
    assert "no token for port 1" in done.stderr


def test_the_console_token_file_goes_when_the_client_ends_cleanly(tmp_path: Path) -> None:
    """The console's token is only good while its client runs: a clean exit removes it
    (nothing closes the console before that), so no stale file names a dead port."""
    script = (
        "import asyncio\n"
        "from monarch.core._debugger._console import console\n"
        "asyncio.run(console.start())\n"
        "print(console.token_path, console.token_path.exists(), flush=True)\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "MONARCH_DEBUG_SERVER_PORT": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=DEADLINE
    )
    assert done.returncode == 0, done.stderr
    path, existed = done.stdout.split()
    assert existed == "True" and Path(path).parent.parent.parent == tmp_path
    assert not Path(path).exists()


def test_commands_parse_as_upstream_writes_them() -> None:
    assert parse("list") == parse("l") == ListSessions()
    assert parse("continue") == parse("c") == Continue()
    assert parse("quit") == parse("q") == Quit()
    assert parse("attach debugee 3") == parse("a debugee 3") == Attach("debugee", 3)
    assert parse("cast debugee ranks(1,4,6) p x") == Cast("debugee", [1, 4, 6], "p x")
    assert parse("cast m ranks(dim1=1:5:2,dim2=3, dim4=(3,6)) n") == Cast(
        "m", {"dim1": range(1, 5, 2), "dim2": 3, "dim4": [3, 6]}, "n"
    )
    for bad in ("attach", "cast m ranks() n", "cast m ranks(1:2:3:4) n", "frobnicate"):
        with pytest.raises(ValueError, match=r"unknown command|ranks\(\) names no rank|bad range"):
            parse(bad)


def _written(ranks: Ranks) -> str:
    """How a user writes ``ranks`` inside ``ranks(...)``."""

    def one(value: int | list[int] | range) -> str:
        if isinstance(value, range):
            return f"{value.start}:{value.stop}:{value.step}"
        if isinstance(value, list):
            return ",".join(map(str, value))
        return str(value)

    if isinstance(ranks, dict):
        return ",".join(
            f"{dim}=({one(v)})" if isinstance(v, list) else f"{dim}={one(v)}"
            for dim, v in ranks.items()
        )
    return one(ranks)


_rank = st.integers(0, 10_000)
_range = st.builds(range, _rank, _rank, st.integers(1, 50))
_list = st.lists(_rank, min_size=2, max_size=6)
_value = st.one_of(_rank, _range, _list)
_ranks = st.one_of(
    _rank,
    _range,
    _list,
    st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), _value, min_size=1),
)


@given(_ranks)
def test_any_ranks_written_parse_back(ranks: Ranks) -> None:
    assert parse_ranks(_written(ranks)) == ranks


@given(_ranks, _rank, st.dictionaries(st.sampled_from("abc"), _rank))
def test_a_selection_is_what_its_parts_select(
    ranks: Ranks, rank: int, coords: dict[str, int]
) -> None:
    chosen = selects(ranks, rank, coords)
    if isinstance(ranks, int):
        assert chosen == (rank == ranks)
    elif isinstance(ranks, (list, range)):
        assert chosen == (rank in ranks)
    else:
        assert chosen == all(
            dim in coords
            and (coords[dim] == want if isinstance(want, int) else coords[dim] in want)
            for dim, want in ranks.items()
        )
