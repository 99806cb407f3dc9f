"""How the processes of a job come to be: the one place that starts a runtime.

Three kinds of process run a runtime, and each is started here: the controller (the
user's script: a background thread, started by the first ``current_runtime()``), a proc
(``python -m monarch.core._host._proc``, started by a host agent) and a worker (``monarch
worker``, the host agent of another machine). Starting one means: a loop, a ``Runtime``
listening, the job's secret and root, the control handlers every process answers
(``install_services``), and the runtime installed as this process's.

The ``MONARCH_*`` environment names by which a parent hands a child its job are in
``_environ``; how a host agent starts, watches and kills its procs is in ``_spawning``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import gc
import importlib
import io
import logging
import os
import signal
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Final

from monarch._wheels import install_hint
from monarch.core._config import current_config
from monarch.core._debugger import breakpoint_hook, install_console
from monarch.core._mesh._ask import handle_ask_service
from monarch.core._mesh._client_end import exit_status
from monarch.core._mesh._client_end import prepare as prepare_client_end
from monarch.core._mesh._controller import handle_get_controller
from monarch.core._mesh._future import Future
from monarch.core._mesh._logs import handle_set_log_level
from monarch.core._mesh._mesh_state import handle_how_ended
from monarch.core._mesh._pending import handle_procs_of
from monarch.core._mesh._proc_group import handle_run_bootstrap
from monarch.core._mesh._proc_mesh import host_python, shutdown_context
from monarch.core._mesh._spawn_actors import handle_actor_failed
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
from monarch.core._runtime._internal_logs import install_internal_logs, log_path
from monarch.core._runtime._messages import (
    ActorFailed,
    AskService,
    GetController,
    HowEnded,
    KillProcs,
    PortRef,
    ProcReady,
    ProcsOf,
    Relay,
    RunBootstrap,
    SetLogLevel,
    SpawnActor,
    SpawnProcs,
)
from monarch.core._runtime._netaddr import inherited, split_alias
from monarch.transport import ENTRY_POINT_GROUP, Buffer, get_transport, plugin_group

from ._adopt import adopt_listener
from ._environ import (
    LISTEN_ENV,
    PARENT_ENV,
    PYTHON_ENV,
    RANK_ENV,
    READY_ENV,
    ROOT_ENV,
    _inherited_root,
    job_secret,
    listen_address,
)
from ._introspect import PROC_SERVICE  # noqa: F401 - every proc serves it
from ._spawning import die_with_parent, handle_kill_procs, handle_spawn_procs, kill_children
from ._watching import handle_proc_ready, handle_relay, vouch_for
from ._zygote import Child, prestart_zygote, stop_zygote

log = logging.getLogger("monarch.core")

# A transport another wheel provides (ibverbs: monarch-rdma) is named with the command that
# installs it from a checkout; the transport wheel, below the core, knows only "pip install".
plugin_group(ENTRY_POINT_GROUP, hint=install_hint)


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
            ProcReady: handle_proc_ready,
            Relay: handle_relay,
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


def start_controller(listen: str | None = None) -> Runtime:
    """Start the client's runtime on a background thread and install it (the starter of
    ``current_runtime``): plain code can then block on futures while the loop works."""
    whole_lines()
    prepare_client_end()
    install_internal_logs("client", banner=True)
    loop = new_event_loop()
    ready = threading.Event()
    runtime = Runtime(loop, job_secret(), own_thread=True)
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


async def serve_proc() -> None:
    """Serve as a proc until told to stop or until the parent is gone."""
    parent = os.environ[PARENT_ENV]
    ready_proc, _, ready_port = os.environ[READY_ENV].rpartition("#")
    runtime = Runtime(asyncio.get_running_loop(), job_secret(), own_thread=True)
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
    unreached: list[BaseException] = []

    def parent_gone(address: str, exc: BaseException) -> None:
        if not runtime.reached(parent):  # it never heard of us: our exit must say why
            unreached.append(exc)
        runtime.stopped.set()

    runtime.watch_peer(parent, parent_gone)
    ready = ProcReady(runtime.address, os.getpid(), int(os.environ[RANK_ENV]))
    # Before we first write to the spawner; where the agent watches us for it, the agent
    # tells it we are ready (no connection of ours to the spawner: see ``_watching``).
    if not vouch_for(runtime, parent, ready_proc, ready):
        runtime.send_to_port(PortRef(ready_proc, int(ready_port)), ready)
    await runtime.stopped.wait()
    release_actors(runtime)
    await asyncio.sleep(0)  # let what the release scheduled run before the loop closes
    shutdown_instrumentation()  # what telemetry holds goes out while the loop still runs
    await runtime.aclose()
    if unreached:  # the spawn fails with this on the proc's stderr, not a clean exit
        sys.exit(
            f"monarch proc {os.environ[RANK_ENV]}: its host agent at {parent} could not be "
            f"reached before the proc was ready: {unreached[0]}"
        )


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
    log_path()  # its user's name, looked up once (``_internal_logs._user``)


def run_proc(started_with: frozenset[str] | None = None) -> None:
    """The main of a proc process (``python -m monarch.core._host._proc``, or a zygote's fork).

    It never returns: once served, the proc ends as the interpreter would (non-daemon
    threads joined, atexit handlers run, streams flushed, the same exit status) but skips
    the interpreter's teardown (see ``exit_now``). ``started_with``: the modules imported
    by now, when the caller knows them (``exit_now``)."""
    if started_with is None:
        started_with = frozenset(sys.modules)
    first_own = next_finalizer()
    try:
        die_with_parent()
        if os.getppid() == 1:
            sys.exit("monarch proc: parent already gone")
        whole_lines()
        loop = new_event_loop()
        try:
            loop.run_until_complete(serve_proc())
        finally:
            loop.close()
    except SystemExit as exc:
        code = exit_code(exc)
    except KeyboardInterrupt:  # the interpreter ends by SIGINT then, as a shell expects
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, status 1
        sys.excepthook(*sys.exc_info())
        code = 1
    else:
        code = 0
    exit_now(code, started_with, first_own)


def finalize_modules(started_with: frozenset[str]) -> None:
    """Clear the modules not in ``started_with``, latest first, as the interpreter's
    teardown does (each global set to None), then collect what that left unreachable:
    the finalizers of what they held run. Only those: the rest (what the zygote imported)
    is frozen, and clearing it would copy every page the proc shares with its zygote.

    ``sys.modules`` keeps the order of import, so the modules imported since are its last
    ones: the walk back from its end stops at the first the process started with. Reading
    every name would write each one's reference count (a proc forked with torch copied
    ~560 pages of the zygote's for that, ~1.7 ms of CPU). A module the process started
    with, then removed from ``sys.modules`` and imported again, ends the walk where it
    now stands: the modules imported before it since the start are not cleared."""
    since: list[str] = []
    for name in reversed(sys.modules):
        if name in started_with:
            break
        since.append(name)
    for name in since:
        namespace = getattr(sys.modules.pop(name, None), "__dict__", None)
        if isinstance(namespace, dict):
            for key in list(namespace):
                if key != "__builtins__":
                    namespace[key] = None
    gc.collect()


def exit_code(exc: SystemExit) -> int:
    """The status the interpreter exits with for ``exc`` (a message is printed, status 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def next_finalizer() -> int:
    """The index the next ``weakref.finalize`` of this process gets: those below it were
    registered before now (for a zygote's fork: by what the zygote imported)."""
    index: int = next(weakref.finalize._index_iter)  # type: ignore[attr-defined]
    return index


def skip_finalizers_before(first_own: int) -> None:
    """Keep the exit from calling the ``weakref.finalize`` callbacks registered before the
    process started (``next_finalizer``): they release what the zygote's imports made, as
    its objects' deallocation would, which ``exit_now`` skips for the same reason. torch
    registers one per operator library it defines: run at exit, they unregister every one
    (~26 ms of CPU and ~6,900 page copies a proc; 300 procs forked with torch stopped in
    6.5 s, 1,024 in 17-29 s). Those registered since the process started still run.

    The registry keeps the order of registration, so the process's own are its last: it
    is replaced by a registry of those alone, read back from its end. Marking each of the
    others would write to it (and reading it to its reference count): ~260 page copies,
    ~1 ms, in a proc forked with torch. A callback of theirs is not called at all since
    (``finalize.__call__`` finds it no longer registered)."""
    finalize = weakref.finalize
    registry = getattr(finalize, "_registry", None)
    if not isinstance(registry, dict):
        return
    own: list[tuple[Any, Any]] = []
    for item in reversed(registry.items()):
        if getattr(item[1], "index", first_own) < first_own:
            break
        own.append(item)
    _kept.append(registry)  # deallocated, it would write to every one of them after all
    finalize._registry = dict(reversed(own))  # type: ignore[attr-defined]


_kept: list[object] = []
"""What the exit leaves for ``os._exit`` rather than deallocate (``skip_finalizers_before``)."""


def exit_now(code: int, started_with: frozenset[str] = frozenset(), first_own: int = 0) -> None:
    """End this process as the interpreter's own exit would, without its teardown.

    The teardown deallocates every object: in a proc forked from a zygote that writes to
    every page it shares with the zygote, so each proc copies ~20 MB and takes ~0.25 s of
    CPU to exit (a mesh of 256 stopped in 10 s on 2 CPUs). What a program can see of an
    exit happens first, in the interpreter's order: non-daemon threads joined, atexit
    handlers (the ``weakref.finalize`` callbacks from ``first_own`` on: see
    ``skip_finalizers_before``), the modules imported since the process had
    ``started_with`` finalized (the user's: their globals' finalizers run, as upstream's
    procs run them), Python's and C's standard streams flushed. A negative ``code`` ends
    it by that signal."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize waits for
        skip_finalizers_before(first_own)
        atexit._run_exitfuncs()
        finalize_modules(started_with)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.flush()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).fflush(None)  # what C code printed to a buffered stdout
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
    finally:
        os._exit(code if code >= 0 else 128 - code)


# -- the host agent: procs started for a spawner ------------------------------------------


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
        self.runtime = Runtime(self.loop, secret, own_thread=True)
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
            timeout = current_config().transport_handshake_timeout
            runtime.listener = await adopt_listener(*handed, runtime.secret, timeout)
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
