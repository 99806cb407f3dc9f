"""``hosts_from_config``: a host mesh of the configured job by name, or, with none
configured, of local workers started for it (above both the job trait and ``ProcessJob``)."""

from __future__ import annotations

import atexit
import os

from monarch.core import HostMesh

from ._process import ProcessJob
from ._trait import DEFAULT_JOB_PATH, current_job_set, load_current_job

LOCAL_HOSTS = 2
"""Hosts of the mesh ``hosts_from_config`` starts when no job is configured (upstream's)."""


def hosts_from_config(name: str) -> HostMesh:
    """The host mesh ``name`` of the current job (``set_current_job``, or the one saved at
    ``DEFAULT_JOB_PATH``). With no job configured, as upstream 0.7.0: ``LOCAL_HOSTS``
    worker processes started on this machine for it and attached to (a ``ProcessJob``;
    unlike upstream's, they end with this process)."""
    if current_job_set() or os.path.exists(DEFAULT_JOB_PATH):
        mesh: HostMesh = getattr(load_current_job(), name)
        return mesh
    job = ProcessJob({"hosts": LOCAL_HOSTS})
    state = job.state(cached_path=None)
    atexit.register(job.kill)
    local: HostMesh = state.hosts
    return local
