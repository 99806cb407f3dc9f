"""How a host agent starts its procs (forked by its zygote, or as new Pythons), where their
output goes, and how it watches and kills them; a proc's tie to its parent."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from monarch.core._config import KEYS, current_config
from monarch.core._mesh._logs import OutputPlan, ProcOutput, forward_output
from monarch.core._placement import unpin_this_thread
from monarch.core._runtime import USABLE_CPUS, Runtime
from monarch.core._runtime._fd_watch import fd_watch
from monarch.core._runtime._messages import (
    KillProcs,
    Launch,
    PortRef,
    ProcExited,
    SpawnFailed,
    SpawnProcs,
)
from monarch.core._runtime._tls import current_identity, installed_identity
from monarch.transport import Address, Buffer

from ._environ import LISTEN_ENV, PARENT_ENV, PYTHON_ENV, RANK_ENV, READY_ENV, ROOT_ENV, SECRET_ENV
from ._watching import proc_exited, running_child, running_children, started
from ._zygote import Child, ForkedProc, fork_proc, prestart_zygote, zygote_started, zygote_usable

log = logging.getLogger("monarch.core")


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent dies (Linux)."""
    prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def reap_orphans() -> None:
    """Become the subreaper of this process's descendants: those whose parent dies are
    this process's children from then on, not init's (Linux)."""
    prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def prctl(option: int, value: int) -> None:
    """``prctl(2)`` where there is one (Linux); nothing elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value)
    except (OSError, AttributeError):
        pass


def child_listen_address(agent: str) -> str:
    """Procs listen like their agent: a network agent's procs must be reachable too."""
    address = Address.parse(agent)
    if address.scheme == "unix":
        return "unix://@"
    return str(Address(address.scheme, address.host, 0))


def handle_spawn_procs(
    runtime: Runtime,
    body: SpawnProcs,
    payload: Sequence[Buffer],
    sender: str,
    on_child: Callable[[Child], None] | None = None,
) -> None:
    """Start the procs a ``SpawnProcs`` asks for; report each exit the moment it happens.
    ``on_child`` hears of each proc once it runs (a forked one later, from another thread)."""
    ours = {
        # What this process can import, its procs can: actor classes pickled by
        # reference (from the user's modules) must import the same way there.
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        **body.env,  # the spawner's configuration
        SECRET_ENV: runtime.secret.hex(),
        PARENT_ENV: runtime.address,
        READY_ENV: f"{body.ready.proc}#{body.ready.port}",
        LISTEN_ENV: child_listen_address(runtime.address),
        ROOT_ENV: body.root or runtime.root or runtime.address,
    }
    if body.python:
        ours[PYTHON_ENV] = body.python
    ours.update(crowded(body))
    identity = installed_identity()
    if identity is not None or ours[LISTEN_ENV].startswith("tls:"):
        ours.update((identity or current_identity()).environment())  # certificates, as the secret
    forking = spawner_says(body.env, "fork_procs") and zygote_usable()
    # A lone proc on an agent whose zygote has not started yet: the zygote's start and then
    # a fork take longer than the proc's own start (a script's first proc: its cold start),
    # so it starts as a new Python, and the zygote starts after it for the procs to come.
    alone = forking and body.count == 1 and not zygote_started()
    if alone:
        forking = False
    plan = output_plan(body)
    for i, rank in enumerate(range(body.base_rank, body.base_rank + body.count)):
        launch = body.launches[i] if i < len(body.launches) else Launch()
        try:
            argv, program = proc_command(launch, body.python)
            env = proc_environment(launch, {**ours, RANK_ENV: str(rank)})
        except (OSError, ValueError) as exc:
            _cannot_start(runtime, body, rank, exc)
            continue
        start = functools.partial(
            _start_proc, runtime, body, plan, rank, launch, argv, program, env
        )
        if forking and forkable(launch, argv, body.python):
            try:
                fork_proc(env, plan.piped, functools.partial(_forked, start, on_child))
            except OSError as exc:  # out of descriptors: as a Popen that fails to start
                _cannot_start(runtime, body, rank, exc)
        else:
            _started(start(), on_child)
    if alone:  # once the proc has started (both at once contend for the CPUs it needs)
        runtime.loop.call_later(ZYGOTE_AFTER, prestart_zygote)


SPIN_ENV: Final = KEYS["wait_spin"].env[0]

CROWDED_PER_CPU: Final = 8
"""Procs per CPU on a host beyond which its procs do not spin (``crowded``)."""


def crowded(body: SpawnProcs) -> dict[str, str]:
    """``wait_spin`` off in the procs of a spawn that leaves this host with more than
    ``CROWDED_PER_CPU`` procs per CPU, unless the spawner or this agent set it.

    A proc's loop yields the CPU a while after its messages, to skip the wake-up for the
    next one: that pays while a CPU is free. Where procs outnumber CPUs many times over,
    each yield returns at once and the spin keeps a proc with work off the CPU. A gathered
    call on 2 CPUs with every spin off against on (medians): 4 procs 443-503 against
    352-429 us (the spin helps), 16 the same, 32 3.3-3.9 against 4.1 ms, 64 6.4-7.2
    against 9.5-10.3 ms, 256 39-41 against 52-53 ms; with only the procs' off, 256 procs
    40-50 ms. The agent itself (the spawner, here) keeps its spin: it takes the flood of
    its procs' answers at a spawn (1,024 procs: ~15% slower without it)."""
    if SPIN_ENV in body.env or SPIN_ENV in os.environ:
        return {}
    if len(running_children()) + body.count <= CROWDED_PER_CPU * USABLE_CPUS:
        return {}
    return {SPIN_ENV: "0"}


ZYGOTE_AFTER: Final = 0.5
"""Seconds after a lone first proc's start that its agent starts the zygote (sooner, if a
fork is asked for first)."""


def output_plan(body: SpawnProcs) -> OutputPlan:
    """What this agent does with the output of the procs ``body`` asks for (``_logs``): the
    spawner's configuration says."""
    return OutputPlan(
        forward=body.forward_output,
        capture=bool(
            spawner_says(body.env, "enable_file_capture")
            and spawner_says(body.env, "force_file_log")
        ),
        tail=int(spawner_says(body.env, "tail_log_lines")),
        prefix=bool(spawner_says(body.env, "prefix_with_rank")),
    )


def spawner_says(env: dict[str, str], name: str) -> Any:
    """Key ``name`` as the spawner configured it (its ``configure()`` travels in ``env``),
    else as this agent's configuration has it."""
    key = KEYS[name]
    raw = env.get(key.env[0])
    if raw is not None:
        try:
            return key.parse_text(raw)
        except ValueError:
            pass
    return getattr(current_config(), name)


def forkable(launch: Launch, argv: list[str], python: str) -> bool:
    """Whether the zygote can start this proc: ours, on this Python, with no wrapper."""
    return (
        not launch.program
        and argv[0] == (python or sys.executable)
        and python
        in (
            "",
            sys.executable,
        )
    )


def _forked(
    start: Callable[..., Child | None],
    on_child: Callable[[Child], None] | None,
    child: ForkedProc | None,
    error: str,
) -> None:
    """The zygote's answer: the proc runs, or it is started without the zygote."""
    _started(start(child) if child is not None else start(), on_child)


def _started(child: Child | None, on_child: Callable[[Child], None] | None) -> None:
    if child is not None and on_child is not None:
        on_child(child)


def _start_proc(
    runtime: Runtime,
    body: SpawnProcs,
    plan: OutputPlan,
    rank: int,
    launch: Launch,
    argv: list[str],
    program: str | None,
    env: dict[str, str],
    forked: ForkedProc | None = None,
) -> Child | None:
    """Start the proc (unless the zygote did: ``forked``), then watch it: its CPUs, its
    output, its exit."""
    child: Child
    if forked is not None:
        child = forked
    else:
        try:
            piped = subprocess.PIPE if plan.piped else None
            child = subprocess.Popen(
                argv,
                executable=program,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=piped,
                stderr=piped,
                # A group of its own: a signal to the spawner's group (a terminal's Ctrl-C,
                # a Jupyter kernel interrupt, which signals the kernel's whole group) stops
                # the spawner's wait, not the procs; they still die with their parent.
                process_group=0,
            )
        except (OSError, ValueError) as exc:
            _cannot_start(runtime, body, rank, exc)
            return None
    started(runtime, child, body.events, body.ready)
    log.info("proc %d (rank %d) started%s", child.pid, rank, " (forked)" if forked else "")
    cpus = launch.bind.get("cpus") or launch.bind.get("physcpubind")
    if cpus:
        try:
            os.sched_setaffinity(child.pid, cpu_list(cpus))  # before its threads start
        except (OSError, ValueError) as exc:
            log.warning("proc_bind %r for proc %d: %s", cpus, rank, exc)
    try:
        output = forward_output(runtime, child, rank, body.events, plan) if plan.piped else None
        _watch(runtime, child, rank, body.events, output)
    except RuntimeError as exc:  # no thread could start to watch it: it must not run unwatched
        child.kill()
        if not isinstance(child, ForkedProc):  # the zygote reaps its own (and this may be
            child.wait()  # the thread that hears it: waiting here would never end)
        proc_exited(child)
        _cannot_start(runtime, body, rank, exc)
        return None
    return child


def _cannot_start(runtime: Runtime, body: SpawnProcs, rank: int, exc: Exception) -> None:
    """The spawner hears that proc ``rank`` could not be started, and why."""
    runtime.send_to_port(body.events, SpawnFailed(rank, f"cannot start a proc: {exc}"))


def proc_command(launch: Launch, python: str) -> tuple[list[str], str | None]:
    """The argv of a proc and the program to run (``None``: argv[0]), as ``launch`` says
    (its NUMA binding through numactl)."""
    if launch.program:
        argv, program = [launch.arg0 or launch.program, *launch.args], launch.program
    else:
        argv, program = [python or sys.executable, "-m", "monarch.core._host._proc"], None
    bind = launch.bind
    numa = [f"--{key}={bind[key]}" for key in ("cpunodebind", "membind") if key in bind]
    if numa:
        import shutil  # only for numactl: not imported by every proc

        numactl = shutil.which("numactl")
        if numactl is None:
            raise ValueError("proc_bind cpunodebind/membind need numactl, which is not installed")
        argv, program = [numactl, *numa, program or argv[0], *argv[1:]], None
    return argv, program


def proc_environment(launch: Launch, ours: dict[str, str]) -> dict[str, str]:
    """A proc's environment: the agent's (unless ``launch`` says not to inherit it), the
    launch's changes, then Monarch's own variables."""
    env = dict(os.environ) if launch.inherit_env else {}
    for key, value in launch.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env.update(ours)
    return env


def cpu_list(text: str) -> set[int]:
    """The CPUs of a list such as ``0-3,8`` (numactl's and taskset's notation)."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _watch(
    runtime: Runtime,
    child: Child,
    rank: int,
    events: PortRef,
    output: ProcOutput | None,
) -> None:
    """Report the child's exit the moment it happens, after the last of its output
    (``output``, see ``_logs``): for a forked proc, the zygote's word that it exited; for
    another, its pidfd readable (``_when_exited``). No thread per proc. ``RuntimeError``
    where no thread can start to watch it."""

    def report(code: int) -> None:
        proc_exited(child)
        how = f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
        log.info("proc %d (rank %d) %s", child.pid, rank, how)

        def send() -> None:
            tail = output.tail() if output is not None else ()
            if not runtime.loop.is_closed():
                runtime.send_to_port(events, ProcExited(rank, child.pid, how, tail))

        if output is None:
            send()
        else:
            output.after_end(send)

    if isinstance(child, ForkedProc):
        child.when_exited(report)
    else:
        _when_exited(child, report)


def _when_exited(child: subprocess.Popen[bytes], report: Callable[[int], None]) -> None:
    """Call ``report`` with ``child``'s exit status once it exits: from the process's one
    thread that waits on descriptors (``fd_watch``), on the child's pidfd; where there are
    no pidfds (not Linux 5.3+), from a thread of its own blocked in ``wait``."""
    try:
        pidfd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):

        def wait() -> None:
            unpin_this_thread()  # started by the loop, which may be pinned (``_placement``)
            report(child.wait())

        threading.Thread(target=wait, name=f"monarch-wait-{child.pid}", daemon=True).start()
        return

    def exited() -> bool:
        code = child.poll()  # reaps it: readable, it has exited
        if code is None:
            return True
        os.close(pidfd)
        report(code)
        return False

    try:
        fd_watch.add(pidfd, exited)
    except RuntimeError:
        os.close(pidfd)
        raise


def handle_kill_procs(
    runtime: Runtime, body: KillProcs, payload: Sequence[Buffer], sender: str
) -> None:
    """Kill the procs named that this process started (no other process: a pid may be
    anyone's); their exits are reported by their watchers as any exit is."""
    for pid in body.pids:
        child = running_child(pid)
        if child is not None and child.poll() is None:
            log.warning("killing proc (pid %d): %s", child.pid, body.reason)
            child.kill()  # SIGKILL ends a stopped (SIGSTOP) process too


def kill_children() -> None:
    """Kill the procs this process started that are still running."""
    for child in running_children():
        if child.poll() is None:
            child.kill()
