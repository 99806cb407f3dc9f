"""``monarch worker``: the host agent of a machine that a controller elsewhere attaches to.

A worker is a runtime listening at a network address with the control handlers of a host
agent (``_services``): a controller that knows its address and the job secret joins it
with ``attach_to_workers`` and starts procs on it with ``HostMesh.spawn_procs``. It serves
until SIGTERM/SIGINT or a ``StopProc`` message, then kills the procs it started. It also
kills the procs of a controller it loses (connection closed, or silent past
``heartbeat_timeout``), so no proc outlives its job.

Security: every connection is authenticated by the job secret (HMAC challenge-response,
see ``monarch.transport``), read from ``MONARCH_JOB_SECRET`` (hex) or, for the command,
from a file only its owner can read (``--secret-file``); never from a command line. TLS
certificates (upstream's ``ca``/``private_key``) are not supported yet: pass
``ca="trust_all_connections"`` (or nothing) and no ``private_key``.

Addresses: ``tcp://HOST:PORT`` (port 0 picks one; the real address is printed),
``tcp://*:PORT`` or ``tcp://0.0.0.0:PORT`` (every interface, known by one of this
machine's addresses), and upstream's ``tcp://ADVERTISED:PORT@tcp://BIND:PORT``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

# Only the standard library at import: every ``monarch`` command loads this module to
# register the subcommand. The runtime is imported when a worker starts.
if TYPE_CHECKING:
    from monarch.transport import Buffer

    from ._future import Future
    from ._messages import SpawnProcs
    from ._runtime import Runtime

log = logging.getLogger("monarch.core")

SECRET_ENV: Final = "MONARCH_JOB_SECRET"  # the same as _runtime.SECRET_ENV

TRUST_ALL: Final = "trust_all_connections"
PrivateKey = bytes | Path | None
CA = bytes | Path | Literal["trust_all_connections"] | None


class WorkerConfigError(RuntimeError):
    """A worker cannot start: no usable job secret, or an unsupported address or security."""


# -- security ------------------------------------------------------------------------------


def check_security(*, ca: object, private_key: object, address: str | None = None) -> None:
    """Refuse what we cannot honour: TLS certificates, ``tls://`` addresses."""
    from monarch.transport import Address

    from ._netaddr import split_alias

    if private_key is not None or ca not in (None, TRUST_ALL):
        raise NotImplementedError(
            "TLS certificates (ca=..., private_key=...) are not supported yet: monarch "
            f"authenticates every connection with the job secret ({SECRET_ENV}); "
            f"pass ca={TRUST_ALL!r} and no private_key"
        )
    if address is not None:
        for url in split_alias(address):
            if Address.parse(url).scheme == "tls":
                raise NotImplementedError(
                    f"tls:// worker addresses need certificates, not supported yet: {address!r}; "
                    "use tcp:// (connections are still authenticated with the job secret)"
                )


def read_secret_file(path: str | os.PathLike[str]) -> bytes:
    """The job secret (hex text) from a file that only its owner may read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise WorkerConfigError(f"cannot open secret file {os.fspath(path)!r}: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise WorkerConfigError(f"secret file {os.fspath(path)!r} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise WorkerConfigError(
                f"secret file {os.fspath(path)!r} has mode {mode:04o}: other users may read or "
                f"change it; make it 0600 or stricter (chmod 600 {os.fspath(path)})"
            )
        if info.st_uid != os.geteuid():
            raise WorkerConfigError(f"secret file {os.fspath(path)!r} belongs to another user")
        text = f.read().strip()
    try:
        secret = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise WorkerConfigError(
            f"secret file {os.fspath(path)!r} must hold the job secret as hex text"
        ) from None
    if not secret:
        raise WorkerConfigError(f"secret file {os.fspath(path)!r} is empty")
    return secret


def worker_secret(secret_file: str | os.PathLike[str] | None = None) -> bytes:
    """The job secret: from ``secret_file`` if given, else ``MONARCH_JOB_SECRET``.

    A worker never makes one up: the controller's secret is the only one that works.
    """
    if secret_file is not None:
        return read_secret_file(secret_file)
    value = os.environ.get(SECRET_ENV, "")
    if not value:
        raise WorkerConfigError(
            f"no job secret: set {SECRET_ENV} to the controller's secret (hex), "
            "or give monarch worker --secret-file PATH (mode 0600)"
        )
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise WorkerConfigError(f"{SECRET_ENV} must be hex text") from None


# -- the worker --------------------------------------------------------------------------


def _spawn_procs_for_owner(
    runtime: Runtime, body: SpawnProcs, payload: Sequence[Buffer], sender: str
) -> None:
    """Start procs as any host agent does, and kill them if their owner goes away."""
    from . import _host

    before = len(_host._children)
    _host.handle_spawn_procs(runtime, body, payload, sender)
    started = _host._children[before:]
    if not started:
        return

    def owner_lost(address: str, exc: BaseException) -> None:
        alive = [child for child in started if child.poll() is None]
        if alive:
            log.warning("controller %s lost (%s): killing its %d procs", address, exc, len(alive))
        for child in alive:
            child.kill()

    runtime.watch_peer(body.events.proc, owner_lost)


class _Worker:
    """A worker runtime on its own thread (the process's runtime while it runs)."""

    def __init__(self, address: str, secret: bytes) -> None:
        from ._future import Future
        from ._netaddr import split_alias
        from ._runtime import Runtime, new_event_loop

        self.advertise, self.bind = split_alias(address)
        self.secret = secret
        self.loop = new_event_loop()
        self.runtime = Runtime(self.loop, secret)
        self.done: Future[None] = Future._new()
        self.thread = threading.Thread(target=self._run, name="monarch-worker", daemon=True)
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    def start(self) -> str:
        """Listen and serve; returns the worker's address once it listens."""
        from . import _runtime

        if _runtime._runtime is not None:
            raise RuntimeError(
                f"this process already runs a Monarch runtime ({_runtime._runtime.address}); "
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
        import asyncio

        from . import _runtime
        from ._future import set_loop_thread

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
            if _runtime._runtime is self.runtime:
                _runtime.install_runtime(None)
                set_loop_thread(None)
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
        from . import _host, _runtime
        from ._future import set_loop_thread
        from ._messages import SpawnProcs
        from ._services import install

        runtime = self.runtime
        advertise = self.advertise if self.advertise != self.bind else None
        await runtime.start(self.bind, advertise)
        _runtime.install_runtime(runtime)  # before any message: handlers may look it up
        set_loop_thread(self.thread)
        install(runtime)
        runtime.control[SpawnProcs] = _spawn_procs_for_owner
        log.info("monarch worker listening at %s", runtime.address)
        self._ready.set()
        try:
            await runtime.stopped.wait()
        finally:
            _host.kill_children()
            await runtime.aclose()


def start_worker_loop_forever(
    *, address: str, ca: CA = None, private_key: PrivateKey = None
) -> Future[None]:
    """Start a worker (host agent) at ``address`` on a background thread of this process.

    Returns once it listens; the Future completes when it stops (a ``StopProc`` from its
    controller). The job secret comes from ``MONARCH_JOB_SECRET``. ``ca`` may be
    ``"trust_all_connections"`` or None; certificates raise NotImplementedError (see the
    module docstring).
    """

    check_security(ca=ca, private_key=private_key, address=address)
    worker = _Worker(address, worker_secret())
    worker.start()
    return worker.done


def _serve_blocking(address: str, secret: bytes, *, announce: bool = False) -> None:
    worker = _Worker(address, secret)
    restore: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        # Before the address is out: whoever learns it may signal us at once.
        for signum in (signal.SIGTERM, signal.SIGINT):
            restore[signum] = signal.signal(signum, lambda signum, frame: worker.stop())
    try:
        real = worker.start()
        if announce:
            print(real, flush=True)
            print(f"monarch worker: serving as host agent at {real}", file=sys.stderr, flush=True)
        worker.done._wait()
    finally:
        for signum, handler in restore.items():
            signal.signal(signum, handler)


def run_worker_loop_until_shutdown(
    *, address: str, ca: CA = None, private_key: PrivateKey = None
) -> None:
    """Run a worker at ``address`` until SIGTERM/SIGINT or its controller stops it; return."""
    check_security(ca=ca, private_key=private_key, address=address)
    _serve_blocking(address, worker_secret())


def run_worker_loop_forever(*, address: str, ca: CA = None, private_key: PrivateKey = None) -> None:
    """Run a worker at ``address``; when it is shut down, this process exits (status 0)."""
    run_worker_loop_until_shutdown(address=address, ca=ca, private_key=private_key)
    raise SystemExit(0)


# -- the command -------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``monarch worker`` subcommand (entry point of ``monarch.commands``)."""
    parser = subparsers.add_parser(
        "worker",
        help="run this machine's host agent, for a controller's attach_to_workers",
        description=(
            "Serve as this machine's host agent until SIGTERM/SIGINT or a stop request. "
            "Prints the address it listens at (the first line of stdout). The job secret "
            f"comes from {SECRET_ENV} (hex) or --secret-file, never from the command line."
        ),
    )
    parser.add_argument(
        "--listen",
        required=True,
        metavar="ADDR",
        help="tcp://HOST:PORT (port 0: any), tcp://*:PORT, or ADVERTISED@BIND",
    )
    parser.add_argument(
        "--secret-file",
        metavar="PATH",
        help="file holding the job secret as hex text; must be mode 0600 or stricter",
    )
    parser.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    from monarch.transport import TransportError

    logging.basicConfig(level=logging.WARNING, format="monarch worker: %(message)s")
    try:
        check_security(ca=None, private_key=None, address=args.listen)
        secret = worker_secret(args.secret_file)
        _serve_blocking(args.listen, secret, announce=True)
    except (WorkerConfigError, NotImplementedError, ValueError) as exc:
        print(f"monarch worker: {exc}", file=sys.stderr)
        return 2
    except (OSError, TransportError) as exc:  # cannot listen there
        print(f"monarch worker: cannot listen at {args.listen}: {exc}", file=sys.stderr)
        return 1
    return 0
