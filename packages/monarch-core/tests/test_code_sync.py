"""``sync_workspace``: only changed files travel, whole files only, reload in running procs.

Hosts are ``monarch worker`` processes, each with a ``WORKSPACE_DIR`` of its own: on
hosts in network namespaces when this machine can make them (root, iproute2), else on
this machine's loopback (the same code path: only the addresses differ). Controllers run
as their own processes (``sync_controller.py``).
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hostkit import SECRET_ENV, NetnsUnavailable, children, network_namespaces, start_worker
from hypothesis import given
from hypothesis import strategies as st

from monarch.core._host._reload import Reloader
from monarch.core._mesh._workspace import (
    TEMPORARY,
    Hashes,
    Workspace,
    batches,
    changes,
    remove,
    remove_temporaries,
    write_whole,
)
from monarch.core.testing import Child, wait_until

CONTROLLER = Path(__file__).with_name("sync_controller.py")


# -- the pieces ------------------------------------------------------------------------------

names = st.sampled_from(["a", "b", "c/d", "c/e", "f/g/h", "x.py"])
manifests = st.dictionaries(names, st.tuples(st.integers(0, 9), st.sampled_from(["1", "2"])))


@given(manifests, manifests)
def test_applying_the_changes_makes_the_host_match(
    local: dict[str, tuple[int, str]], remote: dict[str, tuple[int, str]]
) -> None:
    send, gone = changes(local, remote)
    after = {k: v for k, v in remote.items() if k not in gone}
    after.update({k: local[k] for k in send})
    assert after == local
    assert not set(send) & set(gone)
    assert all(remote.get(k) != local[k] for k in send)  # nothing equal is sent


@given(st.lists(st.integers(0, 100), max_size=30), st.integers(1, 120))
def test_batches_keep_order_and_bound(sizes: list[int], most: int) -> None:
    items = [(str(i), s) for i, s in enumerate(sizes)]
    groups = batches(items, most)
    assert [p for g in groups for p in g] == [p for p, _ in items]
    size = dict(items)
    for group in groups:
        assert len(group) == 1 or sum(size[p] for p in group) <= most


def test_workspace_is_upstreams() -> None:
    assert Workspace(dirs=["/a/b", Path("/c/d")]).dirs == {Path("/a/b"): "b", Path("/c/d"): "d"}
    assert Workspace(dirs={"/a/b": "x/y", "/c": ""}).dirs == {Path("/a/b"): "x/y", Path("/c"): ""}
    assert Workspace.null().dirs == {}
    with pytest.raises(ValueError, match="must not be empty"):
        Workspace(dirs=[""])
    with pytest.raises(ValueError, match="relative path inside"):
        Workspace(dirs={"/a": "../escape"})


def test_files_are_written_whole_and_hashes_follow_changes(tmp_path: Path) -> None:
    hashes = Hashes()
    write_whole(tmp_path, "pkg/mod.py", b"x = 1\n", 0o755)
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "mod.pyc").write_bytes(b"cached")
    (tmp_path / "pkg" / f"{TEMPORARY}half").write_bytes(b"cut")
    first = hashes.manifest(tmp_path)
    assert list(first) == ["pkg/mod.py"]  # no __pycache__, no temporaries
    assert os.stat(tmp_path / "pkg/mod.py").st_mode & 0o777 == 0o755
    write_whole(tmp_path, "pkg/mod.py", b"x = 2\n", 0o644)
    assert hashes.manifest(tmp_path)["pkg/mod.py"] != first["pkg/mod.py"]
    assert remove_temporaries(tmp_path) == 1
    remove(tmp_path, ["pkg/mod.py"])
    assert not (tmp_path / "pkg" / "mod.py").exists()
    assert (tmp_path / "pkg").exists()  # still holds __pycache__
    with pytest.raises(ValueError, match="relative path inside"):
        write_whole(tmp_path, "../outside", b"", 0o644)


def test_reload_updates_live_objects(tmp_path: Path) -> None:
    name = f"reloadme_{secrets.token_hex(4)}"
    module_file = tmp_path / f"{name}.py"
    source = """
        class Greeter:
            def hello(self):
                return "old"

        def helper():
            return 1
    """
    module_file.write_text(textwrap.dedent(source))
    reloader = Reloader()
    reloader.watch(tmp_path)
    module = __import__(name)
    greeter = module.Greeter()
    helper = module.helper
    assert reloader.reload_files([tmp_path / "other.py"]) == []
    module_file.write_text(textwrap.dedent(source.replace('"old"', '"new"').replace("1", "2")))
    assert reloader.reload_files([module_file]) == [name]
    assert greeter.hello() == "new"  # an instance made before the reload
    assert helper() == 2  # a reference taken before the reload
    module_file.write_text(textwrap.dedent(source.replace('"old"', '"newer"')))
    assert reloader.reload_files([module_file]) == [name]
    assert greeter.hello() == "newer"  # a second reload reaches them too
    assert helper() == 1
    assert module.Greeter is type(greeter)
    module_file.write_text("raise RuntimeError('broken')\n")
    with pytest.raises(ImportError, match=f"reloading {name} failed"):
        reloader.reload_files([module_file])
    assert greeter.hello() == "newer"  # the old code stays
    sys.modules.pop(name, None)


# -- hosts -----------------------------------------------------------------------------------


@pytest.fixture
def env() -> dict[str, str]:
    return {**os.environ, SECRET_ENV: secrets.token_hex(32)}


@pytest.fixture
def start() -> Iterator[Callable[..., Child]]:
    with children() as start:
        yield start


@pytest.fixture
def hosts() -> Iterator[list[str | None]]:
    """Up to 3 hosts: namespaces (the controller on the first), else this machine (None)."""
    try:
        with network_namespaces(3, f"mcs{os.getpid() % 100000}") as made:
            yield list(made)
    except NetnsUnavailable:
        yield [None, None, None]


def start_hosts(
    start: Callable[..., Child], env: dict[str, str], hosts: list[str | None], root: Path
) -> tuple[list[Child], list[str], list[Path]]:
    """Workers on ``hosts[1:]``, each with a WORKSPACE_DIR of its own."""
    workers, addresses, dirs = [], [], []
    for i, netns in enumerate(hosts[1:], start=2):
        workspace = root / f"host{i}"
        listen = f"tcp://10.0.0.{i}:0" if netns else "tcp://127.0.0.1:0"
        child, address = start_worker(
            start, {**env, "WORKSPACE_DIR": str(workspace)}, listen, netns
        )
        workers.append(child)
        addresses.append(address)
        dirs.append(workspace)
    return workers, addresses, dirs


def controller_argv(hosts: list[str | None], *args: str) -> list[str]:
    prefix = ["ip", "netns", "exec", hosts[0]] if hosts[0] else []
    return [*prefix, sys.executable, str(CONTROLLER), *args]


TRAINLIB = """
from monarch.actor import Actor, endpoint

def version():
    return {v}

class Counter(Actor):
    @endpoint
    def value(self):
        return {v} * 10
"""


def test_sync_sends_changes_and_reloads_running_procs(
    tmp_path: Path, env: dict[str, str], start: Callable[..., Child], hosts: list[str | None]
) -> None:
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "trainlib.py").write_text(TRAINLIB.format(v=1))
    for i in range(20):
        (src / "data" / f"{i}.bin").write_bytes(os.urandom(1000))
    _, addresses, dirs = start_hosts(start, env, hosts, tmp_path)
    controller = start(controller_argv(hosts, "reload", str(src), *addresses), env, stdin=True)

    first = controller.json(90)
    assert first["uses"] == [1, 1, 1, 1] and first["counter"] == [10, 10, 10, 10]
    for d in dirs:
        assert (d / "src" / "trainlib.py").read_text() == TRAINLIB.format(v=1)
        assert len(list((d / "src" / "data").iterdir())) == 20
    inodes = [os.stat(d / "src" / "data" / "0.bin").st_ino for d in dirs]

    (src / "trainlib.py").write_text(TRAINLIB.format(v=2))
    controller.send_line("next")
    edited = controller.json(60)
    # The same actors (one defined in __main__, one in the synced module) run the new code.
    assert edited["uses"] == [2, 2, 2, 2] and edited["counter"] == [20, 20, 20, 20]
    for d, inode in zip(dirs, inodes, strict=True):
        assert (d / "src" / "trainlib.py").read_text() == TRAINLIB.format(v=2)
        assert os.stat(d / "src" / "data" / "0.bin").st_ino == inode  # not sent again

    (src / "data" / "0.bin").unlink()
    controller.send_line("next")
    assert controller.json(60)["step"] == "removed"
    for d in dirs:
        assert not (d / "src" / "data" / "0.bin").exists()
        assert len(list((d / "src" / "data").iterdir())) == 19
    (src / "trainlib.py").write_text(TRAINLIB.format(v=3))
    controller.send_line("next")
    by_procs = controller.json(60)  # ProcMesh.sync_workspace: its procs' hosts, reloaded
    assert by_procs["step"] == "procs"
    assert by_procs["uses"] == [3, 3, 3, 3] and by_procs["counter"] == [30, 30, 30, 30]
    for d in dirs:
        assert (d / "src" / "trainlib.py").read_text() == TRAINLIB.format(v=3)
    controller.send_line("next")
    again = controller.json(60)
    assert again["step"] == "again" and again["later"] == [3, 3]  # procs spawned later too


def test_a_host_dying_mid_sync_is_named_and_leaves_only_whole_files(
    tmp_path: Path, env: dict[str, str], start: Callable[..., Child], hosts: list[str | None]
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    contents = {f"f{i:02}.bin": os.urandom(4 << 20) for i in range(24)}  # 96 MiB
    for name, data in contents.items():
        (src / name).write_bytes(data)
    workers, addresses, dirs = start_hosts(start, env, hosts, tmp_path)
    controller = start(controller_argv(hosts, "fault", str(src), *addresses), env)
    assert controller.json(60)["step"] == "syncing"
    victim = dirs[1] / "ws"
    # Once host 1 is writing (a temporary exists), freeze its writer, then kill the host.
    writers: list[int] = []

    def caught_writing() -> bool:
        writers[:] = pids_writing(victim, descendants(workers[1].pid))
        for pid in writers:
            os.kill(pid, signal.SIGSTOP)
        return bool(writers)

    wait_until(caught_writing, 60, "host 1 writing a file")
    workers[1].popen.send_signal(signal.SIGKILL)
    outcome = controller.json(60)
    assert outcome["step"] == "failed", outcome
    assert outcome["ranks"] == [1]
    assert "failed on 1 of 2 hosts" in outcome["message"]
    assert addresses[1] in outcome["message"]
    for name, data in contents.items():  # host 0: everything
        assert (dirs[0] / "ws" / name).read_bytes() == data
    for path in listing(victim):  # host 1: whole files, or temporaries
        if not path.name.startswith(TEMPORARY):
            assert path.read_bytes() == contents[path.name]
    assert len([p for p in listing(victim) if not p.name.startswith(TEMPORARY)]) < len(contents)


def listing(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except FileNotFoundError:
        return []


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
            kids = [
                int(k) for t in tasks for k in read(f"/proc/{parent}/task/{t}/children").split()
            ]
        except OSError:
            continue
        found.extend(kids)
        todo.extend(kids)
    return found


def read(path: str) -> str:
    with open(path) as file:
        return file.read()


def pids_writing(directory: Path, pids: list[int]) -> list[int]:
    """Those of ``pids`` with a file under ``directory`` open."""
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
        except OSError:
            continue
        if any(link.startswith(str(directory)) for link in links):
            found.append(int(pid))
    return found
