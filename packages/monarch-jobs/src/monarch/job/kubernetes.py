"""``KubernetesJob`` (upstream's ``monarch.job.kubernetes``): host meshes of pods. Needs the
``kubernetes`` client (``pip install "monarch-jobs[kubernetes]"``); see ``_kubernetes``."""

from ._kubernetes import ImageSpec, KubeConfig, KubernetesJob

__all__ = ["ImageSpec", "KubeConfig", "KubernetesJob"]
