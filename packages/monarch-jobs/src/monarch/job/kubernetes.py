"""``KubernetesJob`` (upstream's ``monarch.job.kubernetes``): host meshes of pods. Needs the
``kubernetes`` client (monarch-jobs' ``kubernetes`` extra: ``pip install -e
"packages/monarch-jobs[kubernetes]"`` from a checkout); see ``_kubernetes``."""

from ._kubernetes import ImageSpec, KubeConfig, KubernetesJob

__all__ = ["ImageSpec", "KubeConfig", "KubernetesJob"]
