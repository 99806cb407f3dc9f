"""``monarch top`` driven as a user would: textual's own pilot, and a real terminal (tmux);
``monarch dashboard``."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from adminkit import Job, wait_for
from textual.widgets import Static, Tree

from monarch.admin import AdminServer
from monarch.admin._auth import token_file
from monarch.admin._client import AdminClient, find_server
from monarch.admin._top import TopApp


async def until(pilot_pause: Callable[[], object], check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot_pause()  # type: ignore[misc]


def labels(app: TopApp) -> dict[str, str]:
    return {ref: str(node.label) for ref, node in app.nodes.items()}


def proc_ref(app: TopApp, mesh: str, rank: int) -> str:
    return next(
        ref
        for ref, (kind, item) in app.items.items()
        if kind == "proc" and item["mesh"] == mesh and item["rank"] == rank
    )


def actor_ref(app: TopApp, mesh: str, rank: int) -> str:
    return next(
        ref
        for ref, (kind, item) in app.items.items()
        if kind == "actor" and item["mesh"] == mesh and item["rank"] == rank
    )


def test_the_pilot_finds_the_stuck_actor_and_sees_a_failure(job: Job) -> None:
    async def drive() -> None:
        app = TopApp(AdminClient(job.addr, job.token), interval=0.2)
        async with app.run_test(size=(180, 50)) as pilot:
            pause = lambda: pilot.pause(0.05)  # noqa: E731
            await until(pause, lambda: sum(r.startswith("actor:") for r in app.nodes) == 3, "3")
            shown = labels(app)
            assert any(s.startswith("workers {'gpus': 0/2} running") for s in shown.values()), shown
            assert any(label.startswith("workers[1] running") for label in shown.values())
            # Per proc its CPU and RSS; per actor its messages per second and queue depth.
            await until(pause, lambda: "cpu " in labels(app)[proc_ref(app, "workers", 1)], "cpu")
            assert re.search(r"rss \d+ MiB", labels(app)[proc_ref(app, "workers", 1)])
            worker = labels(app)[actor_ref(app, "workers", 1)]
            assert re.search(r"\d+\.\d msg/s  queued 0  handled 1", worker), worker
            await asyncio.to_thread(job.command, "ping-one 50")
            await until(
                pause,
                lambda: "handled 51" in labels(app)[actor_ref(app, "workers", 1)],
                "the calls counted",
            )
            # Enter on a proc: its stacks.
            tree = app.query_one("#tree", Tree)
            tree.move_cursor(app.nodes[proc_ref(app, "loopers", 0)])
            await pilot.press("enter")
            await until(pause, lambda: "stacks of proc:" in app.detail, "the proc's stacks")
            assert "Thread MainThread" in app.detail
            await asyncio.to_thread(job.command, "hang")
            await until(pause, lambda: any("in hang for" in s for s in labels(app).values()), "1")
            await pilot.press("b")
            await until(pause, lambda: "Thread actor-workers" in app.detail, "the stuck stack")
            assert "in hang" in app.detail
            side = app.query_one("#side")
            width = side.size.width
            await pilot.press("w")
            await until(pause, lambda: side.size.width > width, "a wider side pane")
            assert tree.has_class("narrow")
            await pilot.press("w")
            await until(pause, lambda: side.size.width == width, "the side pane back")
            cursor = app.query_one("#tree", Tree).cursor_node
            assert cursor is not None and str(cursor.data).startswith("actor:workers")
            await asyncio.to_thread(job.command, "fail")
            await until(pause, lambda: any("disk on fire" in s for s in labels(app).values()), "!")
            failed = next(n for n in app.nodes.values() if "disk on fire" in str(n.label))
            assert "failed" in str(failed.label)
            assert any(span.style == "bold red" for span in failed.label.spans)  # type: ignore[union-attr]
            await pilot.press("f")
            await until(pause, lambda: "disk on fire" in app.detail, "the error in the side pane")
            await pilot.press("q")

    asyncio.run(drive())


def test_the_pilot_shows_procs_that_die_hang_and_stop(job: Job) -> None:
    """The view goes on while procs die and meshes stop: a killed proc is shown dead, one
    that does not answer in orange, a stopped mesh stopped."""

    async def drive() -> None:
        app = TopApp(AdminClient(job.addr, job.token), interval=0.2)
        async with app.run_test(size=(180, 50)) as pilot:
            pause = lambda: pilot.pause(0.05)  # noqa: E731
            await until(pause, lambda: sum(r.startswith("actor:") for r in app.nodes) == 3, "3")
            victim = next(
                item
                for kind, item in app.items.values()
                if kind == "proc" and item["mesh"] == "workers" and item["rank"] == 1
            )
            os.kill(victim["pid"], signal.SIGKILL)
            await until(pause, lambda: "signal 9" in labels(app)[victim["ref"]], "a dead proc")
            assert labels(app)[victim["ref"]].startswith("workers[1] died")
            assert "1 died" in str(app.query_one("#status", Static).render())
            await asyncio.to_thread(job.command, "block")
            looper = proc_ref(app, "loopers", 0)
            await until(pause, lambda: "not answering" in labels(app)[looper], "a held proc")
            held = app.nodes[looper].label
            assert any(span.style == "bold dark_orange" for span in held.spans)  # type: ignore[union-attr]
            await asyncio.to_thread(job.command, "stop")
            worker0 = proc_ref(app, "workers", 0)
            await until(pause, lambda: "stopped" in labels(app)[worker0], "a stopped proc")
            assert labels(app)[victim["ref"]].startswith("workers[1] died")  # as it was
            await pilot.press("q")

    asyncio.run(drive())


def test_the_pilot_keeps_going_when_the_server_goes(job: Job) -> None:
    async def drive() -> None:
        app = TopApp(AdminClient(job.addr, job.token), interval=0.2)
        async with app.run_test(size=(160, 40)) as pilot:
            pause = lambda: pilot.pause(0.05)  # noqa: E731
            await until(pause, lambda: bool(app.nodes), "the tree")
            await asyncio.to_thread(job.close)
            await until(pause, lambda: "cannot reach" in app.error, "the server gone")
            assert app.nodes  # what it saw last stays
            await pilot.press("q")

    asyncio.run(drive())


def tmux(socket: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run tmux on a server of its own (``-L``), without a configuration file."""
    command = ["tmux", "-L", socket, "-f", "/dev/null", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout


@pytest.mark.system
@pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (tools/system-packages.sh)"
)
def test_monarch_top_in_a_real_terminal(tmp_path: Path) -> None:
    """As the README says: the job runs, ``monarch top`` (no arguments: it finds the server
    and its token) in another terminal, ``b`` shows the stuck actor's stack."""
    job = Job(home=str(tmp_path))
    server = f"monarch-top-test-{os.getpid()}"
    monarch = os.path.join(os.path.dirname(sys.executable), "monarch")
    # A terminal as a user's: none of pytest's environment (COLUMNS, say) in the way.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
    }
    size = ("-x", "200", "-y", "50")
    tmux(server, "new-session", "-d", "-s", "top", *size, monarch + " top", env=env)
    try:

        def screen() -> str:
            return tmux(server, "capture-pane", "-p", "-t", "top")

        wait_for(lambda: "workers {'gpus': 1/2}" in screen(), message=f"the actors in:\n{screen()}")
        job.command("hang")
        wait_for(lambda: "in hang for" in screen(), message=f"the stuck call in:\n{screen()}")
        tmux(server, "send-keys", "-t", "top", "b")
        wait_for(lambda: "Thread actor-workers" in screen(), message=f"the stack in:\n{screen()}")
        assert "in hang" in screen()
        job.command("fail")
        wait_for(lambda: "disk on fire" in screen(), message=f"the failure in:\n{screen()}")
        tmux(server, "send-keys", "-t", "top", "q")
        wait_for(
            lambda: (
                subprocess.run(
                    ["tmux", "-L", server, "has-session"], capture_output=True
                ).returncode
            ),
            message="monarch top to quit (its session ends with it)",
        )
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True)
        job.close()


@pytest.mark.parametrize("command", ["top", "tui"])  # tui: upstream's name
def test_monarch_top_without_a_token_says_what_to_do(tmp_path: Path, command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "monarch.core", command, "--addr", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path), "MONARCH_ADMIN_TOKEN": ""},
        timeout=60,
    )
    assert done.returncode == 2
    assert "no token for 127.0.0.1:9" in done.stderr


def test_monarch_dashboard_gives_the_newest_servers_page(tmp_path: Path) -> None:
    """``monarch dashboard`` (upstream's command): the link to the job's dashboard page, its
    token in it, found as ``monarch top`` finds the server; the link opens the page."""
    job = Job(home=str(tmp_path))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "monarch.core", "dashboard"],
            capture_output=True,
            text=True,
            env={**os.environ, "HOME": str(tmp_path), "MONARCH_ADMIN_TOKEN": ""},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        url = done.stdout.strip()
        assert url == f"{job.url}/?token={job.token}"
        with urllib.request.urlopen(url, timeout=30) as page:
            assert "<html" in page.read().decode().lower()
    finally:
        job.close()
    missing = subprocess.run(
        [sys.executable, "-m", "monarch.core", "dashboard", "--addr", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path), "MONARCH_ADMIN_TOKEN": ""},
        timeout=60,
    )
    assert missing.returncode == 2 and "no token for 127.0.0.1:9" in missing.stderr


def test_the_newest_server_that_still_listens_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token file left by a client that was killed (newer than the live server's) is
    passed over: ``monarch top`` with no ``--addr`` finds the server that listens."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("MONARCH_ADMIN_TOKEN", raising=False)
    with AdminServer("127.0.0.1:0") as server:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            dead = sock.getsockname()[1]  # nobody listens there once it is closed
        stale = token_file(dead)
        stale.write_text("a-dead-servers-token\n")
        later = token_file(server.port).stat().st_mtime + 10
        os.utime(stale, (later, later))
        assert find_server(None, None) == (server.addr, server.token)
        assert find_server(f"127.0.0.1:{dead}", None) == (
            f"127.0.0.1:{dead}",
            "a-dead-servers-token",
        )
