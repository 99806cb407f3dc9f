"""Jobs: host meshes that a script declares and a later run re-attaches to.

Upstream's ``monarch.job``: ``JobTrait`` and its ``JobState``, ``LocalJob``,
``ProcessJob``, ``SlurmJob``, ``SSHJob``, saving and loading a job (``job_load``,
``job_loads``), the current job (``set_current_job``, ``load_current_job``,
``hosts_from_config``), and running a command on a mesh's hosts (``exec_command``).
"""

from ._exec import exec_command
from ._process import LocalJob, ProcessJob
from ._slurm import SlurmJob
from ._ssh import SSHJob
from ._state import JobState
from ._trait import (
    DEFAULT_JOB_PATH,
    JobError,
    JobTrait,
    hosts_from_config,
    job_load,
    job_loads,
    load_current_job,
    set_current_job,
)

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobError",
    "JobState",
    "JobTrait",
    "LocalJob",
    "ProcessJob",
    "SSHJob",
    "SlurmJob",
    "exec_command",
    "hosts_from_config",
    "job_load",
    "job_loads",
    "load_current_job",
    "set_current_job",
]
