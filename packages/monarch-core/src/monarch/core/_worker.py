"""``monarch worker``: the host agent of a machine that a controller elsewhere attaches to.

A worker is a runtime listening at a network address with the control handlers of a host
agent (``_services``): a controller that knows its address and the job secret joins it
with ``attach_to_workers`` and starts procs on it with ``HostMesh.spawn_procs``. It serves
until SIGTERM/SIGINT or a ``StopProc`` message, then kills the procs it started. It also
kills the procs of a controller it loses (connection closed, or silent past
``heartbeat_timeout``), so no proc outlives its job.

Security: every connection is authenticated by the job secret (HMAC challenge-response,
then a MAC on every frame, see ``monarch.transport``): at least 16 bytes (128 bits) of
random data, as hex, read from ``MONARCH_JOB_SECRET`` or, for the command, from a file
only its owner can read (``--secret-file``); never from a command line. TLS
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
from pathlib import Path
from typing import Any, Final, Literal

from monarch.transport import Address, TransportError

from ._bootstrap import SECRET_ENV, WorkerRuntime, decode_secret
from ._errors import WorkerConfigError
from ._future import Future
from ._netaddr import split_alias

log = logging.getLogger("monarch.core")

TRUST_ALL: Final = "trust_all_connections"
PrivateKey = bytes | Path | None
CA = bytes | Path | Literal["trust_all_connections"] | None


# -- security ------------------------------------------------------------------------------


def check_security(*, ca: object, private_key: object, address: str | None = None) -> None:
    """Refuse what we cannot honour: TLS certificates, ``tls://`` addresses."""
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
    if not text:
        raise WorkerConfigError(f"secret file {os.fspath(path)!r} is empty")
    try:
        source = f"secret file {os.fspath(path)!r}"
        return decode_secret(text.decode("ascii", errors="replace"), source)
    except ValueError as exc:
        raise WorkerConfigError(str(exc)) from None


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
        return decode_secret(value, SECRET_ENV)
    except ValueError as exc:
        raise WorkerConfigError(str(exc)) from None


# -- the worker --------------------------------------------------------------------------


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
    worker = WorkerRuntime(address, worker_secret())
    worker.start()
    return worker.done


def _serve_blocking(address: str, secret: bytes, *, announce: bool = False) -> None:
    worker = WorkerRuntime(address, secret)
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
