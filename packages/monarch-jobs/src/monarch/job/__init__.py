"""Jobs: host meshes that a script declares and a later run re-attaches to.

Upstream's ``monarch.job``: ``JobTrait`` and its ``JobState``, ``LocalJob``,
``ProcessJob``, ``SlurmJob``, ``SSHJob``, saving and loading a job (``job_load``,
``job_loads``), the current job (``set_current_job``, ``load_current_job``,
``hosts_from_config``), running a command on a mesh's hosts (``exec_command``), job kinds
by name (``job_backend``: the ``monarch.job_backends`` entry points), and the
job's telemetry tables (``job.enable_telemetry(TelemetryConfig(...))``, then
``state.query_engine_client.query(sql)``; monarch-telemetry's), and its admin server
(``job.enable_admin(MeshAdminConfig())``, then ``state.admin_url``; monarch-admin's).

The names are imported on first use: a worker (``monarch worker``, whose command loads
this package's subcommands) and the ``monarch`` command itself then import only what they
run, not the whole of Monarch's client side.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._extras import optional

if TYPE_CHECKING:
    from monarch.admin import MeshAdminConfig
    from monarch.telemetry import TelemetryConfig

    from ._backends import job_backend
    from ._configured import hosts_from_config
    from ._exec import exec_command
    from ._port_forward import PortForwarder
    from ._process import LocalJob, ProcessJob
    from ._shell import shell
    from ._slurm import SlurmJob
    from ._ssh import SSHJob
    from ._state import JobState
    from ._trait import (
        DEFAULT_JOB_PATH,
        JobError,
        JobTrait,
        attached_job_file,
        job_load,
        job_loads,
        load_current_job,
        set_current_job,
    )

_WHERE = {
    "DEFAULT_JOB_PATH": "_trait",
    "JobError": "_trait",
    "JobState": "_state",
    "JobTrait": "_trait",
    "LocalJob": "_process",
    "MeshAdminConfig": "monarch.admin",
    "PortForwarder": "_port_forward",
    "ProcessJob": "_process",
    "SSHJob": "_ssh",
    "SlurmJob": "_slurm",
    "TelemetryConfig": "monarch.telemetry",
    "attached_job_file": "_trait",
    "exec_command": "_exec",
    "hosts_from_config": "_configured",
    "job_backend": "_backends",
    "job_load": "_trait",
    "job_loads": "_trait",
    "load_current_job": "_trait",
    "set_current_job": "_trait",
    "shell": "_shell",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module.startswith("monarch."):
        value = getattr(optional(module, f"monarch.job.{name}"), name)
    else:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "DEFAULT_JOB_PATH",
    "JobError",
    "JobState",
    "JobTrait",
    "LocalJob",
    "MeshAdminConfig",
    "PortForwarder",
    "ProcessJob",
    "SSHJob",
    "SlurmJob",
    "TelemetryConfig",
    "attached_job_file",
    "exec_command",
    "hosts_from_config",
    "job_backend",
    "job_load",
    "job_loads",
    "load_current_job",
    "set_current_job",
    "shell",
]
