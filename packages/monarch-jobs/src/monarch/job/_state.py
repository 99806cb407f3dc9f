"""``JobState``: a job's host meshes by name, as attributes (``state.trainers``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from monarch.actor import attach_to_workers
from monarch.core import HostMesh, use_job_secret

if TYPE_CHECKING:
    from monarch.telemetry import QueryEngineClient


class JobState:
    """One ``HostMesh`` attribute per mesh the job asked for."""

    def __init__(self, hosts: Mapping[str, HostMesh]) -> None:
        self._hosts = dict(hosts)
        self.query_engine_client: QueryEngineClient | None = None
        """SQL over the job's telemetry tables, when ``job.enable_telemetry()`` was called."""
        self.admin_url: str | None = None
        """The admin server's ``http://HOST:PORT``, when ``job.enable_admin()`` was called."""
        self.dashboard_url: str | None = None
        """The dashboard page (with its token), when ``TelemetryConfig(include_dashboard=True)``
        was enabled: the admin server's page, with the telemetry tables' SQL box."""

    def __getattr__(self, name: str) -> HostMesh:
        hosts: dict[str, HostMesh] = self.__dict__.get("_hosts", {})
        if name in hosts:
            return hosts[name]
        raise AttributeError(
            f"this job has no mesh {name!r} (its meshes: {', '.join(sorted(hosts)) or 'none'})"
        )

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self._hosts]

    def __repr__(self) -> str:
        return f"JobState({', '.join(sorted(self._hosts))})"


def attached_state(secret: bytes, addresses: Mapping[str, Sequence[str]]) -> JobState:
    """The state of a job whose meshes are workers at ``addresses`` (by mesh name), this
    process attached to them with the job's ``secret`` (what worker-based jobs share)."""
    use_job_secret(secret)
    return JobState(
        {name: attach_to_workers(workers=list(ws), name=name) for name, ws in addresses.items()}
    )
