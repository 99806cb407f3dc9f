"""How the processes of a job come to be: the one place that starts a runtime.

Three kinds of process run a runtime, and each is started here: the controller (the
user's script: a background thread, started by the first ``current_runtime()``), a proc
(``python -m monarch.core._host._proc``, started by a host agent) and a worker (``monarch
worker``, the host agent of another machine). Starting one means: a loop, a ``Runtime``
listening, the job's secret and root, the control handlers every process answers
(``install_services``), and the runtime installed as this process's.

This module also owns the ``MONARCH_*`` environment names by which a parent hands a child
its job: the secret (never on a command line), the root client, the parent to die with,
where to report ready, its rank and where to listen.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import functools
import gc
import importlib
import io
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from monarch._wheels import install_hint
from monarch.core._config import KEYS, current_config
from monarch.core._debugger import breakpoint_hook, install_console
from monarch.core._mesh._actor_mesh import handle_actor_failed, handle_how_ended
from monarch.core._mesh._ask import handle_ask_service
from monarch.core._mesh._client_end import exit_status
from monarch.core._mesh._client_end import prepare as prepare_client_end
from monarch.core._mesh._controller import handle_get_controller
from monarch.core._mesh._future import Future
from monarch.core._mesh._logs import (
    OutputPlan,
    ProcOutput,
    drain,
    forward_output,
    handle_set_log_level,
)
from monarch.core._mesh._pending import handle_procs_of
from monarch.core._mesh._proc_mesh import handle_run_bootstrap, host_python, shutdown_context
from monarch.core._mesh._workspace import put_synced_on_path
from monarch.core._runner import handle_spawn_actor, refuse_undeliverable, release_actors
from monarch.core._runtime import (
    Runtime,
    install_runtime,
    new_event_loop,
    running_runtime,
    set_starter,
)
from monarch.core._runtime._instrument import load_instrumentation, shutdown_instrumentation
from monarch.core._runtime._internal_logs import install_internal_logs
from monarch.core._runtime._messages import (
    ActorFailed,
    AskService,
    GetController,
    HowEnded,
    KillProcs,
    Launch,
    PortRef,
    ProcExited,
    ProcReady,
    ProcsOf,
    RunBootstrap,
    SetLogLevel,
    SpawnActor,
    SpawnFailed,
    SpawnProcs,
)
from monarch.core._runtime._netaddr import inherited, split_alias
from monarch.core._runtime._tls import current_identity, installed_identity
from monarch.transport import (
    ENTRY_POINT_GROUP,
    MIN_SECRET_SIZE,
    Address,
    Buffer,
    get_transport,
    plugin_group,
)

from ._adopt import adopt_listener
from ._introspect import PROC_SERVICE  # noqa: F401 - every proc serves it
from ._zygote import (
    Child,
    ForkedProc,
    fork_proc,
    prestart_zygote,
    stop_zygote,
    zygote_started,
    zygote_usable,
)

log = logging.getLogger("monarch.core")

# A transport another wheel provides (ibverbs: monarch-rdma) is named with the command that
# installs it from a checkout; the transport wheel, below the core, knows only "pip install".
plugin_group(ENTRY_POINT_GROUP, hint=install_hint)

SECRET_ENV: Final = "MONARCH_JOB_SECRET"
"""The job secret (hex): children get it through their environment, never a command line."""
ROOT_ENV: Final = "MONARCH_ROOT_ADDRESS"
"""The root client's address, inherited by every process of the job."""
PARENT_ENV: Final = "MONARCH_PARENT_ADDRESS"
"""A proc's host agent: the proc stops when it is gone."""
READY_ENV: Final = "MONARCH_READY_PORT"
"""``<proc address>#<port>``: where a new proc reports that it is listening."""
RANK_ENV: Final = "MONARCH_PROC_RANK"
LISTEN_ENV: Final = "MONARCH_LISTEN"
"""Where a new proc listens (like its agent: a network agent's procs must be reachable)."""
PYTHON_ENV: Final = "MONARCH_PYTHON"
"""The Python a proc was started with by ``with_python_executable``: its own procs use it."""


def decode_secret(text: str, source: str) -> bytes:
    """The job secret from its hex text, read from ``source`` (for the error message).

    Raises ValueError unless it is hex of at least MIN_SECRET_SIZE bytes (128 bits): a
    shorter secret would let whoever captures one handshake proof search for it offline.
    """
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"{source} must hold the job secret as hex text") from None
    if len(secret) < MIN_SECRET_SIZE:
        raise ValueError(
            f"{source} holds a job secret of {len(secret)} bytes; it must be at least "
            f"{MIN_SECRET_SIZE} bytes (128 bits, {2 * MIN_SECRET_SIZE} hex digits) of random "
            "data (python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return secret


_secret: list[bytes] = []
"""The job secret once known: kept here, not in ``os.environ``."""
_secret_inherited: list[bool] = [False]
"""Whether this process was given its job's secret (it joins that job), not made it."""


def job_secret() -> bytes:
    """This job's secret: inherited, or made now by the process that starts the job.

    An inherited one is taken out of the environment when first read, so that a
    subprocess an actor (or the user's script) starts does not inherit it; the procs
    this process spawns are given it explicitly (``_spawn_procs_for_owner``).
    """
    if _secret:
        return _secret[0]
    value = os.environ.pop(SECRET_ENV, None)
    secret = decode_secret(value, SECRET_ENV) if value else secrets.token_bytes(32)
    _secret.append(secret)
    _secret_inherited[0] = bool(value)
    return secret


def use_job_secret(secret: bytes) -> None:
    """Make ``secret`` this process's job secret: for a client that re-attaches to the
    workers of a job another process started (a job's saved state holds its secret).

    Raises RuntimeError once this process has a different one (its runtime, or a spawn,
    has used it: nothing already started could authenticate with the new one).
    """
    if len(secret) < MIN_SECRET_SIZE:
        raise ValueError(f"a job secret must be at least {MIN_SECRET_SIZE} bytes")
    if not _secret:
        os.environ.pop(SECRET_ENV, None)
        _secret.append(secret)
    elif _secret[0] != secret:
        raise RuntimeError(
            "this process already has another job secret (its runtime started, or it "
            "spawned procs): attach to this job from a fresh process"
        )


def install_services(runtime: Runtime) -> None:
    """The control messages every process answers besides its actors."""
    runtime.undeliverable = refuse_undeliverable
    runtime.control.update(
        {
            SpawnActor: handle_spawn_actor,
            SpawnProcs: handle_spawn_procs,
            RunBootstrap: handle_run_bootstrap,
            GetController: handle_get_controller,
            ActorFailed: handle_actor_failed,
            KillProcs: handle_kill_procs,
            ProcsOf: handle_procs_of,
            HowEnded: handle_how_ended,
            SetLogLevel: handle_set_log_level,
            AskService: handle_ask_service,
        }
    )


def whole_lines() -> None:
    """Make this process write its output a line at a time.

    The procs of a job (and its client) share one terminal or pipe. Through a pipe,
    Python buffers stdout by blocks and flushes a block wherever it ends, mid-line, so a
    log line from another process (or this one's stderr) lands inside a user's print.
    A line at a time, each write is a whole line (writes up to PIPE_BUF never interleave).
    Not write-through (``PYTHONUNBUFFERED``, often set in containers, would write every
    piece of a print at once): a line is still written as soon as it ends.
    """
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=False)


def _boot(runtime: Runtime, root: str) -> None:
    """What every runtime gets once it listens (on its loop, before any message)."""
    runtime.root = root or runtime.address
    install_services(runtime)
    install_runtime(runtime)


# -- the controller ----------------------------------------------------------------------


def listen_address() -> str:
    """Where a controller listens, per the ``default_transport`` key."""
    transport = current_config().default_transport
    if transport in ("unix", "ipc", "local"):
        return "unix://@"
    if transport in ("tcp", "tls", "ibverbs"):
        # Every interface, known by an address other machines can reach (Runtime.start).
        return f"{transport}://0.0.0.0:0"
    return str(transport)


def _inherited_root() -> str:
    """The root a client takes from its environment: only a client given its job's secret
    joins that job. One that made its secret starts a job of its own, whose root it is,
    even when started by another job's process (a test isolated in a subprocess, a
    script's helper): that process's root, named in the environment it passed on, would
    refuse it (another secret), and its controllers are not this job's."""
    return os.environ.get(ROOT_ENV, "") if _secret_inherited[0] else ""


def start_controller(listen: str | None = None) -> Runtime:
    """Start the client's runtime on a background thread and install it (the starter of
    ``current_runtime``): plain code can then block on futures while the loop works."""
    whole_lines()
    prepare_client_end()
    install_internal_logs("client", banner=True)
    loop = new_event_loop()
    ready = threading.Event()
    runtime = Runtime(loop, job_secret())
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            try:
                await runtime.start(listen or listen_address())
                _boot(runtime, _inherited_root())
                if runtime.root == runtime.address:  # procs' breakpoints come here
                    install_console(runtime)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(exc)
            finally:
                ready.set()

        loop.create_task(boot())
        loop.run_forever()

    thread = threading.Thread(target=run, name="monarch-runtime", daemon=True)
    thread.start()
    ready.wait()
    if failure:
        raise failure[0]
    _controller_loops.append((loop, thread))
    os.environ[ROOT_ENV] = runtime.root  # what this process starts belongs to its job
    log.info("client %d listening at %s (job root %s)", os.getpid(), runtime.address, runtime.root)
    return runtime


# -- a proc ------------------------------------------------------------------------------


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


async def serve_proc() -> None:
    """Serve as a proc until told to stop or until the parent is gone."""
    parent = os.environ[PARENT_ENV]
    ready_proc, _, ready_port = os.environ[READY_ENV].rpartition("#")
    runtime = Runtime(asyncio.get_running_loop(), job_secret())
    host_python[0] = os.environ.get(PYTHON_ENV, "")
    install_internal_logs(f"proc {os.environ[RANK_ENV]}")
    put_synced_on_path()  # before any actor's class is unpickled
    await runtime.start(os.environ.get(LISTEN_ENV, "unix://@"))
    _boot(runtime, os.environ.get(ROOT_ENV, ""))
    log.info("proc %d listening at %s for %s", os.getpid(), runtime.address, parent)
    sys.breakpointhook = breakpoint_hook  # a session at the root's console (_debugger)
    if current_config().enable_telemetry:
        load_instrumentation()
    # What booting made (modules, the runtime) lives as long as the process: out of the
    # collector's sight, a full collection walks only what actors made since, not the
    # whole heap (under a stream of messages those cost a third of a proc's time).
    gc.freeze()
    gc.enable()  # off since the core's import in a proc started as a program (__init__)
    runtime.watch_peer(parent, lambda address, exc: runtime.stopped.set())
    ready = ProcReady(runtime.address, os.getpid(), int(os.environ[RANK_ENV]))
    runtime.send_to_port(PortRef(ready_proc, int(ready_port)), ready)
    await runtime.stopped.wait()
    release_actors(runtime)
    await asyncio.sleep(0)  # let what the release scheduled run before the loop closes
    shutdown_instrumentation()  # what telemetry holds goes out while the loop still runs
    await runtime.aclose()


PROC_START_MODULES: Final = ("uvloop", "anyio._backends._asyncio")
"""What a proc imports only as it starts serving, beyond what importing the core brings:
its event loop's module and anyio's asyncio backend (its first listen and dial)."""


def import_proc_start() -> None:
    """Import now what a proc imports only as it starts serving (``PROC_START_MODULES``,
    and the transports it listens and dials with): a zygote does, so that none of the
    procs it forks spends ~20 ms on it, each at its start."""
    for name in PROC_START_MODULES:
        if name == "uvloop" and current_config().event_loop == "asyncio":
            continue
        with contextlib.suppress(ImportError):  # no uvloop; anyio laid out otherwise
            importlib.import_module(name)
    for scheme in ("unix", "tcp"):
        get_transport(scheme)


def run_proc() -> None:
    """The main of a proc process (``python -m monarch.core._host._proc``)."""
    die_with_parent()
    if os.getppid() == 1:
        sys.exit("monarch proc: parent already gone")
    whole_lines()
    loop = new_event_loop()
    try:
        loop.run_until_complete(serve_proc())
    finally:
        loop.close()


# -- the host agent: procs started for a spawner ------------------------------------------

_children: list[Child] = []


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
            runtime.send_to_port(body.events, SpawnFailed(rank, f"cannot start a proc: {exc}"))
            continue
        start = functools.partial(
            _start_proc, runtime, body, plan, rank, launch, argv, program, env
        )
        if forking and forkable(launch, argv, body.python):
            fork_proc(env, plan.piped, functools.partial(_forked, start, on_child))
        else:
            _started(start(), on_child)
    if alone:  # once the proc has started (both at once contend for the CPUs it needs)
        runtime.loop.call_later(ZYGOTE_AFTER, prestart_zygote)


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
            runtime.send_to_port(body.events, SpawnFailed(rank, f"cannot start a proc: {exc}"))
            return None
    _children.append(child)
    log.info("proc %d (rank %d) started%s", child.pid, rank, " (forked)" if forked else "")
    cpus = launch.bind.get("cpus") or launch.bind.get("physcpubind")
    if cpus:
        try:
            os.sched_setaffinity(child.pid, cpu_list(cpus))  # before its threads start
        except (OSError, ValueError) as exc:
            log.warning("proc_bind %r for proc %d: %s", cpus, rank, exc)
    output = forward_output(runtime, child, rank, body.events, plan) if plan.piped else None
    _watch(runtime, child, rank, body.events, output)
    return child


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
    """Report the child's exit the moment it happens (a thread blocked in wait), after the
    last of its output (``output``: the threads reading it, see ``_logs``)."""

    def wait() -> None:
        code = child.wait()
        drain(output)
        how = f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
        log.info("proc %d (rank %d) %s", child.pid, rank, how)
        exited = ProcExited(rank, child.pid, how, output.tail() if output is not None else ())
        if not runtime.loop.is_closed():
            runtime.send_to_port(events, exited)

    threading.Thread(target=wait, name=f"monarch-wait-{child.pid}", daemon=True).start()


def handle_kill_procs(
    runtime: Runtime, body: KillProcs, payload: Sequence[Buffer], sender: str
) -> None:
    """Kill the procs named that this process started (no other process: a pid may be
    anyone's); their exits are reported by their watchers as any exit is."""
    for child in _children:
        if child.pid in body.pids and child.poll() is None:
            log.warning("killing proc (pid %d): %s", child.pid, body.reason)
            child.kill()  # SIGKILL ends a stopped (SIGSTOP) process too


def kill_children() -> None:
    """Kill the procs this process started that are still running."""
    for child in _children:
        if child.poll() is None:
            child.kill()


def _spawn_procs_for_owner(
    runtime: Runtime, body: SpawnProcs, payload: Sequence[Buffer], sender: str
) -> None:
    """A worker's ``SpawnProcs``: start procs as any host agent does, and kill them if
    their owner goes away (so no proc outlives its job)."""
    started: list[Child] = []
    lost: list[str] = []

    def on_child(child: Child) -> None:
        started.append(child)
        if lost:  # started (forked) after its owner was lost
            child.kill()

    def owner_lost(address: str, exc: BaseException) -> None:
        lost.append(address)
        alive = [child for child in started if child.poll() is None]
        if alive:
            log.warning("controller %s lost (%s): killing its %d procs", address, exc, len(alive))
        for child in alive:
            child.kill()

    handle_spawn_procs(runtime, body, payload, sender, on_child)
    runtime.watch_peer(body.events.proc, owner_lost)


# -- a worker ----------------------------------------------------------------------------


class WorkerRuntime:
    """A worker's runtime on its own thread (the process's runtime while it runs)."""

    def __init__(self, address: str, secret: bytes) -> None:
        self.advertise, self.bind = split_alias(address)
        self.loop = new_event_loop()
        self.runtime = Runtime(self.loop, secret)
        self.done: Future[None] = Future._new()
        self.thread = threading.Thread(target=self._run, name="monarch-worker", daemon=True)
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    def start(self) -> str:
        """Listen and serve; returns the worker's address once it listens."""
        running = running_runtime()
        if running is not None:
            raise RuntimeError(
                f"this process already runs a Monarch runtime ({running.address}); "
                "start the worker loop before any other Monarch use"
            )
        self.thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure
        return self.runtime.address

    def stop(self) -> None:
        """Ask the worker to stop (any thread, signal handlers included)."""
        if not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.runtime.stopped.set)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the worker
            if not self._ready.is_set():
                self._failure = exc
                self._ready.set()
            failure: BaseException | None = exc
        else:
            failure = None
        finally:
            if running_runtime() is self.runtime:
                install_runtime(None)
            leftover = asyncio.all_tasks(loop)
            for task in leftover:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
            loop.close()
        if failure is not None:
            self.done.set_exception(failure)
        else:
            self.done.set_result(None)

    async def _serve(self) -> None:
        install_internal_logs("worker")
        runtime = self.runtime
        advertise = self.advertise if self.advertise != self.bind else None
        handed = inherited(self.bind)
        if handed is None:
            await runtime.start(self.bind, advertise)
        else:  # as Runtime.start does, on the listening socket this process inherited
            runtime.loop_thread_id = threading.get_ident()
            runtime.listener = await adopt_listener(*handed, runtime.secret)
            runtime.address = str(runtime.listener.address)
            runtime.spawn_task(runtime.listener.serve(runtime._serve_connection))
        _boot(runtime, os.environ.get(ROOT_ENV, ""))  # before any message is read
        runtime.control[SpawnProcs] = _spawn_procs_for_owner
        if current_config().fork_procs:
            prestart_zygote()  # ready by the time procs are asked for
        log.info("monarch worker listening at %s", runtime.address)
        self._ready.set()
        try:
            await runtime.stopped.wait()
        finally:
            kill_children()
            await runtime.aclose()


# -- this process ------------------------------------------------------------------------


_controller_loops: list[tuple[asyncio.AbstractEventLoop, threading.Thread]] = []
"""The controller's loop and the daemon thread that runs it (see ``_stop_controller``)."""

STOP_WAIT: Final = 2.0
"""Seconds the exit waits for the controller's loop to stop."""


def _stop_controller() -> None:
    """Stop the controller's loop and let its thread end, before the interpreter is torn
    down: a daemon thread still in uvloop's ``uv_run`` would have a timer fire into a
    finalized interpreter (a segfault at exit, seen with torch's torchrun ranks)."""
    while _controller_loops:
        loop, thread = _controller_loops.pop()
        if loop.is_closed() or not thread.is_alive():
            continue
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:  # closed meanwhile
            continue
        thread.join(STOP_WAIT)


def _shutdown_at_exit() -> None:
    """Stop the procs gracefully, then kill what is left, then the controller's loop: one
    handler, so that the order does not depend on which module registered its handler
    first."""
    try:
        shutdown_context(5.0).get(timeout=10.0)
    except Exception:  # noqa: BLE001 - exiting anyway; children are killed next
        pass
    finally:
        kill_children()
        stop_zygote()
        _stop_controller()
        exit_status()  # after an unhandled failure: status 1, whatever the script did


atexit.register(_shutdown_at_exit)
set_starter(start_controller)
