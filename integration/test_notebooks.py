"""Monarch in a Jupyter kernel, for real: the notebooks of ``examples/notebooks/`` executed
with nbclient in an ipykernel kernel, and a kernel driven as a person would (interrupt a
waiting cell, restart the kernel)."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "examples" / "notebooks"


def kernel_environment() -> dict[str, str]:
    """ipykernel shows what the kernel's processes write to its stdout and stderr (what
    procs print) in the notebook, except under pytest (``PYTEST_CURRENT_TEST``): a kernel
    as a person's runs."""
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


@contextmanager
def notebook_in_kernel(path: Path, tmp_path: Path) -> Iterator[tuple[Any, NotebookClient]]:
    """``path`` read, and a client of a fresh kernel to run its cells (``run_cells``)."""
    notebook = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    client = NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    with client.setup_kernel(env=kernel_environment()):
        yield notebook, client


def run_cells(notebook: Any, client: NotebookClient, first: int = 0) -> list[str]:
    """Run the notebook's cells from index ``first`` on, as "Run all below" does (outputs
    of a cell run before replaced); each code cell's outputs, from ``first`` on, as one text."""
    texts = []
    for index, cell in enumerate(notebook.cells[first:], start=first):
        if cell.cell_type == "code":
            client.execute_cell(cell, index)
            texts.append(cell_text(cell))
    return texts


def run_notebook(path: Path, tmp_path: Path) -> list[str]:
    """Execute ``path`` in a fresh kernel; each code cell's outputs as one text."""
    with notebook_in_kernel(path, tmp_path) as (notebook, client):
        return run_cells(notebook, client)


def cell_text(cell: Any) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] in ("execute_result", "display_data"):
            parts.extend(str(v) for v in output["data"].values())
        elif output["output_type"] == "error":
            parts.append(f"{output['ename']}: {output['evalue']}")
    return "".join(parts)


def shown_until(notebook: Any, client: NotebookClient, shown: str, *wanted: str) -> str:
    """``shown`` and what a probe cell run after the notebook's shows, run until every
    one of ``wanted`` has shown. ipykernel's thread that reads the kernel's stdout (what
    procs print) hands a line to the cell running when it reads it: on a busy machine,
    after the cells that made the lines had finished (a fresh-clone CI run lost an
    edited actor's lines so)."""
    probe = nbformat.v4.new_code_cell(  # type: ignore[no-untyped-call]
        "import sys, time; time.sleep(0.05); sys.stdout.flush()"
    )
    notebook.cells.append(probe)
    deadline = time.monotonic() + 60
    try:
        while not all(line in shown for line in wanted):
            assert time.monotonic() < deadline, f"not shown within 60 s: {wanted} in {shown!r}"
            client.execute_cell(probe, len(notebook.cells) - 1)
            shown += cell_text(probe)
    finally:
        notebook.cells.remove(probe)
    return shown


def test_ddp_notebook_and_editing_its_actor_class(tmp_path: Path) -> None:
    with notebook_in_kernel(NOTEBOOKS / "ddp.ipynb", tmp_path) as (notebook, client):
        cells = run_cells(notebook, client)
        assert "<ProcMesh {gpus: 2}>" in cells[0]
        assert "'gloo'" in cells[3]  # setup, on both ranks
        # The actors' prints reach the notebook, under the cell that made them: the procs
        # write the kernel's stdout, a pipe that ipykernel's thread reads and hands to the
        # cell running when it reads, so a busy machine may show a cell's lines under the
        # cells after it (in a fresh-clone CI run, all of them came under later cells).
        lines = ("rank 0 step 1 loss", "rank 1 step 3 loss")
        shown_until(notebook, client, "".join(cells[4:]), *lines)
        assert "step 2: losses" in cells[4]
        assert "weights equal on every rank: True" in cells[5]
        # The class redefined in a later cell: the new actors run the new code.
        assert "clipped_from" in cells[6]
        assert "<table>" in cells[6]  # ValueMesh's HTML table

        # As a person would, after "Run all": edit the actor class in its cell, then run
        # that cell and those below it again, on the same procs.
        index, cell = next(
            (i, c) for i, c in enumerate(notebook.cells) if c.source.startswith("class DDPActor")
        )
        edited = cell.source.replace('print(f"rank {self.rank}', 'print(f"edited: rank {self.rank}')
        assert edited != cell.source
        cell.source = edited
        again = run_cells(notebook, client, index)
        assert "'gloo'" in again[1]  # setup again: the new actors took the process group over
        # The new code runs (the actors' lines: as above).
        edited = ("edited: rank 0 step 1 loss", "edited: rank 1 step 3 loss")
        shown_until(notebook, client, "".join(again[2:]), *edited)
        assert "weights equal on every rank: True" in again[3]
        assert "clipped_from" in again[4]


def test_supervision_notebook(tmp_path: Path) -> None:
    cells = run_notebook(NOTEBOOKS / "supervision.ipynb", tmp_path)
    assert "caught ActorError: division by zero" in cells[1]
    assert "0.25" in cells[1]  # the actor lives on
    assert "caught SupervisionError" in cells[2]
    assert "exited with non-zero code 3" in cells[2]
    assert "MeshFailure(mesh_name=workers-" in cells[3]  # readable in a notebook
    assert "crashed_ranks=[1]" in cells[3]
    assert "manager: restarting after" in cells[5]
    assert "restarts: 1 workers alive: 2" in cells[5]


# -- a kernel driven by hand ---------------------------------------------------------------------


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    manager = KernelManager(kernel_name="python3")
    workspace = {"WORKSPACE_DIR": str(tmp_path / "hosts_workspace")}  # sync_workspace's
    manager.start_kernel(cwd=str(tmp_path), env={**kernel_environment(), **workspace})
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


BANNER = "Monarch internal logs are being written"
"""What the client says on stderr as its runtime starts (where the runtime's log goes)."""


def execute(client: BlockingKernelClient, code: str, timeout: float = 60) -> dict[str, Any]:
    """Run ``code``; its reply's content, with ``text``: everything the cell showed."""
    shown: list[str] = []

    def output(message: dict[str, Any]) -> None:
        content = message["content"]
        if message["msg_type"] == "stream":
            lines = content["text"].splitlines(keepends=True)  # less the client's banner:
            shown.extend(line for line in lines if not line.startswith(BANNER))
        elif message["msg_type"] in ("execute_result", "display_data"):
            shown.append(content["data"].get("text/plain", ""))
        elif message["msg_type"] == "error":
            shown.append(f"{content['ename']}: {content['evalue']}")

    reply = client.execute_interactive(code, timeout=timeout, output_hook=output)
    return {**reply["content"], "text": "".join(shown)}


def wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


SETUP = """
import os, pathlib, time
from monarch.actor import Actor, endpoint, this_host

class Gate(Actor):
    @endpoint
    def wait(self, started: str, release: str) -> str:
        pathlib.Path(started).touch()
        while not os.path.exists(release):
            time.sleep(0.01)
        return "released"

    @endpoint
    def pid(self) -> int:
        return os.getpid()

procs = this_host().spawn_procs(per_host={"gpus": 2})
gate = procs.spawn("gate", Gate)
print(sorted(gate.pid.call().get().values()))
"""


ADVERBS = """
import asyncio
from monarch.actor import Accumulator, Actor, Channel, current_rank, endpoint, send, this_host

class Adder(Actor):
    def __init__(self) -> None:
        self.total = current_rank().rank * 100  # its rank in the mesh spawned

    @endpoint
    def add(self, n: int) -> int:
        self.total += n
        return self.total

procs = this_host().spawn_procs(per_host={"gpus": 2})
adders = procs.spawn("adders", Adder)
one = adders.slice(gpus=1)
"""


def wait(style: str, future: str) -> str:
    """``future``'s value in a cell: awaited at top level, or ``.get()``."""
    return f"(await {future})" if style == "await" else f"{future}.get()"


@pytest.mark.parametrize("style", ["get", "await"])
def test_every_adverb_and_future_in_a_kernel(
    kernel: tuple[KernelManager, BlockingKernelClient], style: str
) -> None:
    _, client = kernel
    assert execute(client, ADVERBS)["status"] == "ok"
    cells = {
        "call": f"{wait(style, 'adders.add.call(1)')}.values()",
        "call_one": wait(style, "one.add.call_one(1)"),
        "choose": f"{wait(style, 'adders.add.choose(0)')} in (1, 102)",
        "stream": f"sorted([{wait(style, 'f')} for f in adders.add.stream(0)])",
        "broadcast": f"adders.add.broadcast(10); {wait(style, 'adders.add.call(0)')}.values()",
        "accumulate": wait(style, "Accumulator(adders.add, 0, lambda a, b: a + b).accumulate(0)"),
        "send": (
            "port, receiver = Channel.open()\n"
            "send(adders.add, (0,), {}, port=port)\n"
            f"sorted([{wait(style, 'receiver.recv()')} for _ in range(2)])"
        ),
        "then": wait(style, "one.add.call_one(0).then(lambda v: v * 2)"),
        "gather": (
            "async def both():\n"
            "    return await asyncio.gather(one.add.call_one(0), adders.add.choose(0))\n"
            "len(await both())"
            if style == "await"
            else "len([f.get() for f in [one.add.call_one(0), adders.add.choose(0)]])"
        ),
        "a mesh, shown": "adders",
    }
    expected = {
        "call": "[1, 101]",
        "call_one": "102",
        "choose": "True",
        "stream": "[1, 102]",
        "broadcast": "[11, 112]",
        "accumulate": "123",
        "send": "[11, 112]",
        "then": "224",
        "gather": "2",
        "a mesh, shown": "<ActorMesh adders of Adder {gpus: 2}>",
    }
    for name, code in cells.items():
        result = execute(client, code)
        assert result["status"] == "ok", (name, result)
        assert result["text"].strip() == expected[name], (name, result["text"])


@pytest.mark.parametrize("style", ["get", "await", "gather"])
def test_interrupt_while_waiting_leaves_the_mesh_usable(
    kernel: tuple[KernelManager, BlockingKernelClient], tmp_path: Path, style: str
) -> None:
    manager, client = kernel
    assert execute(client, SETUP)["status"] == "ok"
    started, release = tmp_path / "started", tmp_path / "release"
    call = f"gate.wait.call({str(started)!r}, {str(release)!r})"
    code = {
        "get": f"{call}.get()",
        "await": f"await {call}",
        "gather": f"import asyncio\nawait asyncio.gather({call})",  # awaited in an inner task
    }[style]
    # ipykernel aborts the requests that reach it while it clears its queue after a failed
    # cell (``stop_on_error``): the next cell, sent at once here, could be aborted unrun.
    message_id = client.execute(code, stop_on_error=False)
    wait_for(started.exists, 30, "the actors to start waiting")
    manager.interrupt_kernel()
    reply = reply_to(client, message_id)
    assert reply["status"] == "error"
    # As Ctrl-C in a terminal (ipykernel itself would end an awaiting cell with CancelledError);
    # a Future awaited in an inner task (gather's) stays cancelled: a KeyboardInterrupt there
    # would escape into the kernel's loop.
    expected = "CancelledError" if style == "gather" else "KeyboardInterrupt"
    assert reply["ename"] == expected
    release.touch()
    after = execute(client, "print(gate.wait.call('/dev/null', '/').get().values())")
    assert after["status"] == "ok", after
    assert "['released', 'released']" in after["text"]
    assert execute(client, "print(len(gate.pid.call().get()))")["text"].strip() == "2"


SYNC = """
import pathlib
from monarch.actor import Actor, endpoint, this_host
from monarch.tools.config import Workspace

lib = pathlib.Path("mylib")
lib.mkdir()
(lib / "greeting.py").write_text("def hello():\\n    return 'v1'\\n")

class Greeter(Actor):
    @endpoint
    def hello(self) -> str:
        import greeting  # synced: on the procs' sys.path
        return greeting.hello()

procs = this_host().spawn_procs(per_host={"gpus": 2})
greeters = procs.spawn("greeters", Greeter)
await this_host().sync_workspace(Workspace(dirs=[lib]), auto_reload=True)
print((await greeters.hello.call()).values())
"""


def test_code_in_files_follows_a_notebook_with_auto_reload(
    kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    """The README's notebook story for code in files: edit, sync, the same actors run it."""
    _, client = kernel
    first = execute(client, SYNC)
    assert first["status"] == "ok", first
    assert "['v1', 'v1']" in first["text"]
    edit = """(lib / "greeting.py").write_text("def hello():\\n    return 'v2'\\n")
await this_host().sync_workspace(Workspace(dirs=[lib]), auto_reload=True)
print((await greeters.hello.call()).values())"""
    second = execute(client, edit)
    assert second["status"] == "ok", second
    assert "['v2', 'v2']" in second["text"]


def reply_to(client: BlockingKernelClient, message_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        try:
            reply = client.get_shell_msg(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise AssertionError("no execute_reply after the interrupt") from None
        if reply["parent_header"].get("msg_id") == message_id:
            content: dict[str, Any] = reply["content"]
            return content


def test_restarting_the_kernel_leaves_no_proc(
    kernel: tuple[KernelManager, BlockingKernelClient],
) -> None:
    manager, client = kernel
    result = execute(client, SETUP)
    assert result["status"] == "ok", result
    pids = [int(p) for p in result["text"].strip().strip("[]").split(",")]
    assert all(alive(pid) for pid in pids)
    manager.restart_kernel(now=True)
    wait_for(lambda: not any(alive(pid) for pid in pids), 30, f"procs {pids} to end")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: its parent, the kernel, is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return os.path.exists(f"/proc/{pid}")
