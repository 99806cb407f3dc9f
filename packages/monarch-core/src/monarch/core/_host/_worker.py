"""``monarch worker``: the host agent of a machine that a controller elsewhere attaches to.

A worker is a runtime listening at a network address with the control handlers of a host
agent (``_services``): a controller that knows its address and the job secret joins it
with ``attach_to_workers`` and starts procs on it with ``HostMesh.spawn_procs``. It serves
until SIGTERM/SIGINT or a ``StopProc`` message, then kills the procs it started. It also
kills the procs of a controller it loses (connection closed, or silent past
``heartbeat_timeout``), so no proc outlives its job.

Security: every connection is authenticated by the job secret (HMAC challenge-response,
then a MAC on every run of frames, see ``monarch.transport``): at least 16 bytes (128
bits) of random data, as hex, read from ``MONARCH_JOB_SECRET`` or, for the command, from a
file only its owner can read (``--secret-file``); never from a command line. Over
``tls://`` connections are also encrypted, and machines prove themselves with certificates
(upstream's ``ca``/``private_key``, ``--ca``/``--private-key``; see ``_tls``).

Addresses: ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (port 0 picks one; the real address
is printed),
``tcp://*:PORT`` or ``tcp://0.0.0.0:PORT`` (every interface, known by one of this
machine's addresses), and upstream's ``tcp://ADVERTISED:PORT@tcp://BIND:PORT``.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from monarch.core._config import current_config
from monarch.core._errors import WorkerConfigError
from monarch.core._mesh._future import Future
from monarch.core._runtime._netaddr import scheme_of, split_alias
from monarch.core._runtime._tls import CA, TRUST_ALL, PrivateKey, identity_from, use_identity
from monarch.transport import TransportError

from ._bootstrap import WorkerRuntime, whole_lines
from ._environ import SECRET_ENV, decode_secret
from ._zygote import fork_zygote
from ._zygote_proc import serve_forked

log = logging.getLogger("monarch.core")


# -- security ------------------------------------------------------------------------------


def secure(*, ca: CA, private_key: PrivateKey, addresses: Sequence[str] = ()) -> None:
    """Honour upstream's ``ca=``/``private_key=`` for ``addresses`` (see ``_tls``).

    ``tls://`` addresses need ``ca=``: a CA certificate (then ``private_key=`` too), or
    ``"trust_all_connections"``. With ``tcp://`` addresses certificates have no use: a
    CA certificate there is refused rather than silently ignored.
    """
    tls = any(scheme_of(url) == "tls" for address in addresses for url in split_alias(address))
    if not tls:
        if private_key is not None or ca not in (None, TRUST_ALL):
            raise ValueError(
                "ca= and private_key= are for tls:// addresses; over tcp:// every connection "
                f"is authenticated with the job secret ({SECRET_ENV}) alone"
            )
        return
    if ca is None:
        raise ValueError(
            f"tls:// addresses need ca=: the CA certificate (PEM bytes or a path) that "
            f"signed the peers' certificates, with private_key=, or ca={TRUST_ALL!r}"
        )
    identity = identity_from(ca, private_key)
    assert identity is not None
    use_identity(identity)


_OPEN_FAILURES: Final = {
    errno.ENOENT: "does not exist",
    errno.EACCES: "cannot be read: you have no permission to read it",
    errno.EPERM: "cannot be read: you have no permission to read it",
    errno.ELOOP: "is a symbolic link: give the path of the file itself",
    errno.EISDIR: "is a directory, not a file",
    errno.ENOTDIR: "is not a file: a part of its path is not a directory",
}


def _open_failure(exc: OSError) -> str:
    """Why a secret file cannot be opened, as the end of a sentence."""
    known = _OPEN_FAILURES.get(exc.errno or 0)
    return known if known is not None else f"cannot be opened ({exc.strerror or exc})"


def read_secret_file(path: str | os.PathLike[str]) -> bytes:
    """The job secret (hex text) from a file that only its owner may read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise WorkerConfigError(f"secret file {os.fspath(path)!r} {_open_failure(exc)}") from None
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode) or not stat.S_ISREG(info.st_mode):
        os.close(fd)
        what = "a directory, not a file" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise WorkerConfigError(f"secret file {os.fspath(path)!r} is {what}")
    with os.fdopen(fd, "rb") as f:
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
    value = os.environ.pop(SECRET_ENV, "")  # not inherited by what the worker starts
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
    controller). The job secret comes from ``MONARCH_JOB_SECRET``. A ``tls://`` address
    needs ``ca=`` (a CA certificate with ``private_key=``, or ``"trust_all_connections"``;
    see ``_tls``).
    """

    secure(ca=ca, private_key=private_key, addresses=[address])
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
    secure(ca=ca, private_key=private_key, addresses=[address])
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
        help="tcp://HOST:PORT or tls://HOST:PORT (port 0: any), tcp://*:PORT, or ADVERTISED@BIND",
    )
    parser.add_argument(
        "--ca",
        metavar="PATH",
        help=f"for tls://: the CA certificate (PEM) peers must be signed by, or {TRUST_ALL}",
    )
    parser.add_argument(
        "--private-key",
        metavar="PATH",
        help="for tls://: PEM holding this machine's private key and its certificate",
    )
    add_secret_file_option(parser)
    parser.set_defaults(func=_command)


def worker_main(argv: Sequence[str] | None = None) -> int:
    """``monarch worker ARGS`` (``sys.argv[1:]`` when none given) without the ``monarch``
    command's plug-in discovery, which reads every installed distribution's entry points and
    imports every ``monarch.commands`` plug-in: about a tenth of a worker's start that a
    launcher (``python -m monarch.core.worker``) has no use for."""
    parser = argparse.ArgumentParser(prog="monarch")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["worker", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


def add_secret_file_option(parser: argparse.ArgumentParser) -> None:
    """``--secret-file``, where a command reads the job secret from (see ``worker_secret``)."""
    parser.add_argument(
        "--secret-file",
        metavar="PATH",
        help="file holding the job secret as hex text; must be mode 0600 or stricter",
    )


def _command(args: argparse.Namespace) -> int:
    if current_config().fork_procs:
        zygote = fork_zygote()  # first: no thread yet, nothing of the worker's set up
        if zygote is not None:  # the child: the zygote, then a proc (see _zygote)
            serve_forked(zygote)
            return 0
    whole_lines()
    logging.basicConfig(level=logging.WARNING, format="monarch worker: %(message)s")
    try:
        ca: CA = None if args.ca is None else TRUST_ALL if args.ca == TRUST_ALL else Path(args.ca)
        key = None if args.private_key is None else Path(args.private_key)
        secure(ca=ca, private_key=key, addresses=[args.listen])
        secret = worker_secret(args.secret_file)
        _serve_blocking(args.listen, secret, announce=True)
    except (WorkerConfigError, NotImplementedError, ValueError) as exc:
        print(f"monarch worker: {exc}", file=sys.stderr)
        return 2
    except (OSError, TransportError) as exc:  # cannot listen there
        print(f"monarch worker: cannot listen at {args.listen}: {exc}", file=sys.stderr)
        return 1
    return 0
