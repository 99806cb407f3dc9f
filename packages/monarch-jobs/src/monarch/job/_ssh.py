"""``SSHJob``: host meshes of machines reached over ssh, one ``monarch worker`` on each.

The client logs in to every host with the system's ``ssh`` (so ``~/.ssh/config``, agents,
jump hosts and keys work as they do for the user) and runs a short POSIX shell script that
starts ``monarch worker`` in a session of its own, so that it outlives the login and a
later run of the script re-attaches to it. The job secret travels on ssh's stdin (read by
the shell's ``read`` builtin into the worker's environment): it is on no command line, so
``ps`` on neither machine shows it. The worker listens on the address the client reached
the host at (``$SSH_CONNECTION``), so a name that only the client's ssh config knows
still works. A worker is known by its pid and its start time (pids are reused), which is
how a later run checks that it still runs and how ``kill()`` finds it.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from monarch.core import SECRET_ENV, job_secret

from ._state import JobState, attached_state
from ._trait import JobError, JobTrait, no_batch_mode

START_TIMEOUT: Final = 60.0
"""Seconds for a login and its worker to listen."""
KILL_GRACE: Final = 10.0
"""Seconds a worker's process group has to end after SIGTERM before SIGKILL."""

_START: Final = f"""set -eu
umask 077
IFS= read -r {SECRET_ENV}
export {SECRET_ENV}
python=$1 port=$2 folder=$3 name=$4 tries=$5
mkdir -p "$folder"
host=$(printf '%s' "${{SSH_CONNECTION:-}}" | cut -d' ' -f3)
case $host in
  "") host=$(hostname) ;;
  *:*) host="[$host]" ;;
esac
out="$folder/$name.out"
: >"$out"
setsid "$python" -m monarch.core.worker --listen "tcp://$host:$port" \\
  </dev/null >"$out" 2>"$folder/$name.log" &
pid=$!
unset {SECRET_ENV}
# (the shell may reap a worker that failed at once before these read /proc: no noise then)
start=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f20)
while ! IFS= read -r address <"$out"; do
  if ! kill -0 "$pid" 2>/dev/null ||
     [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)" = Z ]
  then
    echo "the worker exited before it listened:" >&2
    tail -c 2000 "$folder/$name.log" >&2
    exit 3
  fi
  tries=$((tries - 1))
  if [ "$tries" -le 0 ]; then
    echo "the worker did not listen in time:" >&2
    tail -c 2000 "$folder/$name.log" >&2
    exit 4
  fi
  sleep 0.02
done
echo "$pid $start $address"
"""
"""Run by ``sh -c`` on the host, the secret its first line of stdin: start a worker, print
``PID STARTTIME ADDRESS``."""

_ALIVE: Final = """alive() {
  stat=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [ "$(echo "$stat" | cut -d' ' -f1)" != Z ] && [ "$(echo "$stat" | cut -d' ' -f20)" = "$2" ]
}
"""
"""``alive PID STARTTIME``: that very process still runs (not a zombie, not a reused pid)."""

_CHECK: Final = (
    _ALIVE
    + """for worker in "$@"; do
  if alive ${worker%:*} ${worker#*:}; then echo up; else echo down; fi
done
"""
)

_KILL: Final = (
    _ALIVE
    + """grace=$1; shift
for worker in "$@"; do
  if alive ${worker%:*} ${worker#*:}; then kill -TERM "-${worker%:*}" 2>/dev/null || true; fi
done
tries=$((grace * 50))
for worker in "$@"; do
  while alive ${worker%:*} ${worker#*:} && [ "$tries" -gt 0 ]; do
    tries=$((tries - 1)); sleep 0.02
  done
  if alive ${worker%:*} ${worker#*:}; then kill -KILL "-${worker%:*}" 2>/dev/null || true; fi
done
"""
)


@dataclass(frozen=True)
class _Worker:
    """One worker: the ssh destination it runs on, its address, pid and start time."""

    host: str
    address: str
    pid: int
    start: str

    @property
    def key(self) -> str:
        return f"{self.pid}:{self.start}"


class SSHJob(JobTrait):
    """``hosts``: ssh destinations (``"node1"``, ``"user@10.0.0.2"``, a ``~/.ssh/config``
    alias), one worker each, as one mesh named ``hosts``; or a mapping of mesh name to
    destinations. ``python_exe`` runs ``monarch worker`` there (monarch-core installed);
    ``ssh_args`` go to every ssh call (``-i KEY``, ``-p PORT``, ``-o ...``);
    ``monarch_port`` is where workers listen (0: any free port, needed when a host holds
    several workers); ``log_dir`` is the folder on each host for their output."""

    def __init__(
        self,
        hosts: Sequence[str] | Mapping[str, Sequence[str]],
        python_exe: str = "python3",
        ssh_args: Sequence[str] = (),
        monarch_port: int = 22222,
        log_dir: str | None = None,
    ) -> None:
        super().__init__()
        self._meshes = _checked_hosts(hosts)
        if isinstance(ssh_args, str):
            raise TypeError("ssh_args is a sequence of arguments, not one string")
        if type(monarch_port) is not int or not 0 <= monarch_port < 65536:
            raise ValueError(f"monarch_port must be a port number (0: any), not {monarch_port!r}")
        self._python = python_exe
        self._ssh = ["ssh", "-o", "BatchMode=yes", *ssh_args]
        self._port = monarch_port
        self._id = secrets.token_hex(6)
        self._folder = log_dir or f"/tmp/monarch-ssh-{self._id}"
        self._secret = b""
        self._workers: dict[str, list[_Worker]] = {}

    @property
    def log_dir(self) -> str:
        """The folder, on every host, of its worker's output (``<mesh>-<rank>.log``)."""
        return self._folder

    def _spec(self) -> object:
        return self._meshes, self._python, self._ssh, self._port

    def _create(self, client_script: str | None) -> None:
        no_batch_mode(self, client_script)
        self._secret = job_secret()
        tries = str(int(START_TIMEOUT / 0.02))
        launches: list[tuple[str, str, subprocess.Popen[str]]] = []
        self._workers = {name: [] for name in self._meshes}
        try:
            for name, hosts in self._meshes.items():
                for rank, host in enumerate(hosts):
                    args = [self._python, str(self._port), self._folder, f"{name}-{rank}", tries]
                    launches.append((name, host, self._ssh_popen(host, "worker", args)))
            failures = []
            for name, host, popen in launches:
                out, err = _communicate(popen, self._secret.hex() + "\n", START_TIMEOUT + 30, host)
                fields = out.split()
                if popen.returncode != 0 or len(fields) != 3:
                    failures.append(f"{host}: {_failure(popen.returncode, err or out)}")
                    continue
                pid, start, address = fields
                self._workers[name].append(_Worker(host, address, int(pid), start))
            if failures:
                raise JobError("cannot start workers over ssh: " + "; ".join(failures))
        except BaseException:
            for _, _, popen in launches:
                if popen.poll() is None:
                    popen.kill()
                    popen.wait()
            self._kill()
            raise

    def _state(self) -> JobState:
        addresses = {name: [w.address for w in ws] for name, ws in self._workers.items()}
        return attached_state(self._secret, addresses)

    def _is_running(self) -> bool:
        workers = [w for ws in self._workers.values() for w in ws]
        if not workers:
            return False
        answers = self._on_each_host(workers, "check", [])
        return all(answer.split().count("up") == count for answer, count in answers)

    def _kill(self) -> None:
        workers = [w for ws in self._workers.values() for w in ws]
        if workers:
            self._on_each_host(workers, "kill", [str(int(KILL_GRACE))])

    # -- ssh -------------------------------------------------------------------------------

    def _ssh_popen(self, host: str, script: str, args: Sequence[str]) -> subprocess.Popen[str]:
        """``ssh HOST sh -c SCRIPT ARGS``; the caller writes the worker's secret to its stdin
        (so it is on no command line)."""
        body = {"worker": _START, "check": _CHECK, "kill": _KILL}[script]
        remote = shlex.join(["sh", "-c", body, f"monarch-{script}", *args])
        return subprocess.Popen(
            [*self._ssh, host, remote],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def _on_each_host(
        self, workers: Sequence[_Worker], script: str, args: Sequence[str]
    ) -> list[tuple[str, int]]:
        """Run ``script`` once per host (all at once) on its workers; each host's output and
        its number of workers. A host that ssh cannot reach raises JobError."""
        by_host: dict[str, list[_Worker]] = {}
        for worker in workers:
            by_host.setdefault(worker.host, []).append(worker)
        popens = [
            (host, len(ws), self._ssh_popen(host, script, [*args, *(w.key for w in ws)]))
            for host, ws in by_host.items()
        ]
        answers, failures = [], []
        for host, count, popen in popens:
            out, err = _communicate(popen, "", KILL_GRACE + 60, host)
            if popen.returncode != 0:
                failures.append(f"{host}: {_failure(popen.returncode, err)}")
            answers.append((out, count))
        if failures:
            raise JobError(f"ssh {script} failed: " + "; ".join(failures))
        return answers


def _communicate(
    popen: subprocess.Popen[str], stdin: str, timeout: float, host: str
) -> tuple[str, str]:
    """``popen``'s output; JobError (and the ssh killed) if it takes over ``timeout`` s."""
    try:
        return popen.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
        raise JobError(f"ssh {host}: no answer within {timeout:g}s") from None


def _failure(returncode: int | None, text: str) -> str:
    what = "ssh could not log in" if returncode == 255 else f"exit {returncode}"
    return f"{what}: {text.strip()[-2000:]}"


def _checked_hosts(hosts: Sequence[str] | Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """``{mesh name: [destination, ...]}``; a plain sequence is the mesh ``hosts``."""
    if isinstance(hosts, str):
        raise TypeError("hosts is a sequence of ssh destinations (or a mapping), not one string")
    meshes = dict(hosts) if isinstance(hosts, Mapping) else {"hosts": hosts}
    checked: dict[str, list[str]] = {}
    for name, destinations in meshes.items():
        if not _is_identifier(name):
            raise ValueError(f"a mesh name must be an identifier, not {name!r}")
        if isinstance(destinations, str):
            raise TypeError(f"mesh {name!r}: a sequence of ssh destinations, not one string")
        listed = list(destinations)
        if not listed:
            raise ValueError(f"mesh {name!r} has no hosts")
        for host in listed:
            if not _is_destination(host):
                raise ValueError(f"mesh {name!r}: {host!r} is not an ssh destination")
        checked[name] = listed
    return checked


def _is_identifier(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier()


def _is_destination(host: object) -> bool:
    """Something ssh takes as a destination, never as an option (``-oProxyCommand=...``)."""
    return isinstance(host, str) and bool(host) and host[0] != "-" and host == host.strip()
