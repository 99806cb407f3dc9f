"""Local workers forked from one fresh Python: a ``ProcessJob``'s hosts for one start.

Every local worker needs a fresh Python that has imported ``monarch.core``: for itself,
and above all for the zygote its procs are forked from (``fork_procs``), which must not be
a fork of the user's script (its ``__main__``, ``atexit`` handlers, threads or a CUDA
context would be in every proc). A worker forked from the script had to start its zygote
as a program; a worker started as a program pays that start itself (then forks its
zygote); either way one start (~0.1 s of CPU here) per worker, all at once on a small
machine, before the first proc can answer. So ``ProcessJob`` starts one Python, ``python
-m monarch.job._fork`` (the forker), which imports what a worker, its zygote and its procs
run, then forks every worker: each leaves into a session of its own, takes its log as
stdout and stderr, and runs as ``monarch worker`` does, forking its zygote first, before
any thread (ready before the worker listens). The forker prints each worker's pid as it
forks it, then exits. The forker is itself a fork of the script's zygote where there is
one (``monarch.core.fork_program``: it started as the script imported monarch.actor, and
has imported the core meanwhile), so no Python starts between ``state()`` and the
workers' forks; a new Python where the zygote cannot fork it.

Where fork is not available (not Linux) or ``MONARCH_JOBS_FORK_WORKERS`` is ``0``, workers
are started as programs (``python -m monarch.core.worker``).
"""

from __future__ import annotations

import argparse
import gc
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Final

if TYPE_CHECKING:
    from monarch.core import ForkedProc

SWITCH: Final = "MONARCH_JOBS_FORK_WORKERS"
"""``0`` starts ProcessJob workers as programs even where they could be forked."""
FORKER: Final = (sys.executable, "-m", "monarch.job._fork")


def can_fork() -> bool:
    """Whether a job's workers may be forked by a forker (see the module docstring)."""
    return sys.platform.startswith("linux") and os.environ.get(SWITCH, "1") != "0"


class Forker:
    """The forker of a job's workers, as the client sees it: started at once, asked for
    the workers' pids later (meanwhile the client starts its own runtime). It is a fork of
    this script's zygote (``monarch.core.fork_program``: started as the script imported
    monarch.actor, it has imported the core already), else a new Python."""

    def __init__(
        self,
        workers: Sequence[tuple[str, str]],
        env: Mapping[str, str],
        log: str,
        zygote: bool = True,
    ) -> None:
        """``workers``: each worker's address and log (which exists already); ``env``: their
        environment (with the job secret); ``log``: the forker's own output; ``zygote``
        False: a new Python, even where the script's zygote could fork it."""
        self.count = len(workers)
        self.log = log
        self.pids: list[int] = []
        self._partial = b""
        self._args = [arg for address, path in workers for arg in ("--worker", address, path)]
        self._env = {**env, "PYTHONPATH": _python_path(env)}
        self.process: subprocess.Popen[bytes] | ForkedProc | None = None
        self._answered = threading.Event()
        self._out = self._start(zygote)

    def _start(self, zygote: bool) -> IO[bytes]:
        """Start the forker; the reading end of its stdout (its pids)."""
        read, write = os.pipe()
        err = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if zygote:
                from monarch.core import fork_program  # the client's; not in the forker

                fork_program((*FORKER[2:], *self._args), self._env, (write, err), self._forked)
            else:
                self.process = subprocess.Popen(
                    [*FORKER, *self._args],
                    env=self._env,
                    stdin=subprocess.DEVNULL,
                    stdout=write,
                    stderr=err,
                    start_new_session=True,  # a Ctrl-C of the script does not stop it halfway
                )
                self._answered.set()
        finally:
            os.close(write)
            os.close(err)
        return os.fdopen(read, "rb", buffering=0)

    def _forked(self, child: ForkedProc | None, why: str) -> None:
        """The zygote's answer (on its reader thread): the forker, or None (then ``_ready``
        starts it as a new Python)."""
        self.process = child
        self._answered.set()

    def _ready(self, deadline: float) -> bool:
        """Whether the forker runs (started as a new Python if the zygote could not fork
        it), by ``deadline``."""
        if not self._answered.wait(max(0.0, deadline - time.monotonic())):
            return False
        if self.process is None:
            self._out.close()
            self._out = self._start(zygote=False)
        return True

    def wait_pids(self, timeout: float) -> list[int]:
        """Every worker's pid once all are forked; JobError if the forker fails first."""
        deadline = time.monotonic() + timeout
        if self._ready(deadline):
            self._read(deadline)
        code = None
        if self.process is not None and len(self.pids) == self.count:
            code = self.process.poll()
        if len(self.pids) < self.count or code not in (None, 0):
            from ._trait import JobError  # not in the forker: it imports what workers run

            self.abandon()
            with open(self.log, "rb") as err:
                said = err.read()[-2000:].decode(errors="replace").strip()
            raise JobError(
                f"the process forking the job's workers forked {len(self.pids)} of "
                f"{self.count} and exited with {self.process and self.process.returncode}: "
                f"{said or 'no output'}"
            )
        return self.pids

    def abandon(self) -> list[int]:
        """The pids of the workers forked so far, once the forker is gone (it is given a
        few seconds to end by itself, then killed): the client is giving up on them."""
        if self._ready(time.monotonic() + ABANDON_WAIT) and self.process is not None:
            self._read(time.monotonic() + ABANDON_WAIT)
            if self.process.poll() is None:
                self.process.kill()
            self._read(time.monotonic() + ABANDON_WAIT)  # what it said before it was killed
            self.process.wait()
        self._out.close()
        return self.pids

    def _read(self, deadline: float) -> None:
        """Read pids until all are known, the forker's output ends, or ``deadline``."""
        out = self._out
        while len(self.pids) < self.count and not out.closed:
            left = deadline - time.monotonic()
            if left <= 0 or not _readable(out.fileno(), left):
                return
            data = os.read(out.fileno(), 4096)
            if not data:
                self._wait()
                return
            *lines, self._partial = (self._partial + data).split(b"\n")
            self.pids.extend(int(line) for line in lines if line.strip().isdigit())
        if len(self.pids) == self.count:
            self._wait()  # it exits right after its last fork
            out.close()

    def _wait(self) -> None:
        if self.process is not None:
            self.process.wait()


ABANDON_WAIT: Final = 5.0
"""Seconds a forker the client gives up on has to end by itself (its forks are quick)."""


def _python_path(env: Mapping[str, str]) -> str:
    """The forker's path: the client's (a worker forked from the client had it: its procs
    import the user's modules as the client does), after the job's own ``PYTHONPATH``."""
    own = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys([*own, *(p for p in sys.path if p)]))


# -- the forker ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Fork every worker asked for, then end; in each worker, serve as it (returns its
    exit status there)."""
    parser = argparse.ArgumentParser(prog="python -m monarch.job._fork")
    parser.add_argument(
        "--worker", nargs=2, action="append", required=True, metavar=("ADDRESS", "LOG")
    )
    args = parser.parse_args(argv)
    # Importing makes ~50,000 objects and next to no garbage: no collection meanwhile (~8 ms
    # of passes over them), and all of them out of the collector's sight in the forks.
    gc.disable()
    from monarch.core import import_proc_start
    from monarch.core.worker import main as worker_main

    import_proc_start()  # once here, for every worker, zygote and proc forked after
    gc.freeze()
    gc.enable()
    for address, log in args.worker:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_worker_process(log)
            return worker_main(["--listen", address])
        print(pid, flush=True)
    os._exit(0)  # at once: the client waits for this exit (no interpreter teardown)


def _become_worker_process(log: str) -> None:
    """In a forked worker: a session of its own, its log as stdout and stderr, nothing
    else of the forker's open."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_APPEND)  # made by the client
    os.dup2(null, 0)
    os.dup2(out, 1)  # the pipe to the client: closed here
    os.dup2(out, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))


if __name__ == "__main__":
    sys.exit(main())


def _readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has input (or its end) within ``timeout`` s: ``poll``, which takes any
    descriptor (``select`` refuses one numbered 1024 or more, as a client of many procs has)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))
