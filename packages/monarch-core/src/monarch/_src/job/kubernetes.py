"""Upstream's ``monarch._src.job.kubernetes``: ``_WORKER_BOOTSTRAP_SCRIPT``, the Python a
worker pod runs (``python -u -c SCRIPT``), which upstream's Kubernetes examples extend with
their own first lines. monarch-jobs' ``KubernetesJob`` (``monarch.job.kubernetes``) runs
``monarch worker`` with the same address; this is that worker for a pod template of one's own.

It listens on every interface at ``MONARCH_PORT`` (default 26600, as upstream's), known by
``MONARCH_POD_IP`` where the pod template sets it (``KubernetesJob``'s, from the downward
API), else by the pod's host name (upstream's). The job secret comes from the environment
(``MONARCH_JOB_SECRET``, a Secret's key in ``KubernetesJob``'s pods). Upstream passes
``ca="trust_all_connections"``; here a ``tcp://`` worker is authenticated by the secret and
TLS is asked for with ``tls://`` addresses (see the root README).
"""

import textwrap
from typing import Final

_WORKER_BOOTSTRAP_SCRIPT: Final = textwrap.dedent(
    """\
    import os
    import socket
    from monarch.actor import run_worker_loop_forever
    port = os.environ.get("MONARCH_PORT", "26600")
    host = os.environ.get("MONARCH_POD_IP") or socket.getfqdn()
    run_worker_loop_forever(address=f"tcp://{host}:{port}@tcp://0.0.0.0:{port}")
    """
)
