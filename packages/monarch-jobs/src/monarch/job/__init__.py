"""Jobs: ``LocalJob``, ``ProcessJob``, ``SlurmJob``, ``KubernetesJob``, ``SSHJob``.

Upstream's ``monarch.job``. Not written yet.
"""

__all__: list[str] = []
