"""What a spawner hands its procs through their environment: the ``MONARCH_*`` names, the
job's secret, the root client's address and where a proc listens."""

from __future__ import annotations

import os
import secrets
from typing import Final

from monarch.core._config import current_config
from monarch.transport import MIN_SECRET_SIZE

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
