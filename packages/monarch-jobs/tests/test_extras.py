"""monarch-telemetry and monarch-admin are extras of monarch-jobs: a job that enables one
without it installed is told which extra to install."""

from __future__ import annotations

import sys

import pytest


def test_without_the_extras_a_job_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """With monarch-telemetry and monarch-admin absent (their import fails as when they are
    not installed), enabling them names the extra instead of a bare ModuleNotFoundError."""
    from monarch.job import LocalJob

    monkeypatch.setitem(sys.modules, "monarch.telemetry", None)
    monkeypatch.setitem(sys.modules, "monarch.admin", None)
    job = LocalJob()
    with pytest.raises(ImportError, match=r"pip install .*monarch-jobs\[telemetry\]"):
        job.enable_telemetry()
    with pytest.raises(ImportError, match=r"pip install .*monarch-jobs\[admin\]"):
        job.enable_admin()
    import monarch.job

    monkeypatch.delitem(vars(monarch.job), "TelemetryConfig", raising=False)
    with pytest.raises(ImportError, match=r"monarch.job.TelemetryConfig needs monarch.telemetry"):
        monarch.job.TelemetryConfig
