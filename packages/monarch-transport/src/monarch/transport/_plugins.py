"""Plug-ins by entry-point group: the one loader every Monarch wheel uses.

Every group (``monarch.transports``, ``monarch.commands``, ``monarch.job_backends``,
``monarch.tensor_engine``, ``monarch.actor``, ``monarch.instrumentation``,
``monarch.bulk_planes``) is read the same
way: once, lazily (importing ``importlib.metadata`` and reading every installed
distribution's metadata costs a process ~20 ms), with a clear error naming the wheel to
install when a named plug-in is missing, and a conflict when two distributions register
the same name (which one wins would depend on the order of ``sys.path``). It lives in the
bottom wheel so that the transport registry, below the core, uses it too; the core
publishes it in ``monarch.core.lowlevel``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

log = logging.getLogger("monarch.plugins")


class MissingPlugin(ImportError, LookupError):
    """No installed distribution registers the plug-in asked for (the message says which
    wheel to ``pip install``)."""


class PluginConflict(LookupError):
    """Two installed distributions register the same plug-in name in one group."""


def _dist(entry: EntryPoint) -> str:
    return entry.dist.name if entry.dist is not None else "?"


class PluginGroup:
    """The entry points of one group, read on first use.

    ``providers`` names, for plug-ins other wheels provide, the requirement to install
    (``{"ibverbs": "monarch-rdma"}``), for the error when one is missing; ``hint`` says how
    to install one (the core gives the command that works from a checkout).
    """

    def __init__(
        self,
        group: str,
        providers: Mapping[str, str] | None = None,
        hint: Callable[[str], str] | None = None,
    ) -> None:
        self.group = group
        self.providers = dict(providers or {})
        self.hint: Callable[[str], str] = hint or _pip_install
        self._lock = threading.Lock()
        self._entries: dict[str, EntryPoint] | None = None
        self._conflicts: dict[str, list[str]] = {}

    def entries(self) -> dict[str, EntryPoint]:
        """Every plug-in of the group by name (a duplicated name: logged, kept once)."""
        found = self._entries
        if found is not None:
            return found
        with self._lock:
            if self._entries is None:
                from importlib.metadata import entry_points  # slow: only when needed

                entries: dict[str, EntryPoint] = {}
                for entry in entry_points(group=self.group):
                    first = entries.get(entry.name)
                    if first is None:
                        entries[entry.name] = entry
                    elif _dist(first) != _dist(entry) or first.value != entry.value:
                        dists = self._conflicts.setdefault(entry.name, [_dist(first)])
                        dists.append(_dist(entry))
                        log.warning(
                            "plug-in %r of %s is registered by %s: %s is used",
                            entry.name,
                            self.group,
                            " and ".join(dists),
                            dists[0],
                        )
                self._entries = entries
            return self._entries

    def names(self) -> dict[str, str]:
        """Installed plug-in names, each with the distribution that provides it."""
        return {name: _dist(entry) for name, entry in sorted(self.entries().items())}

    def entry(self, name: str, needed_by: str = "") -> EntryPoint:
        """The entry point ``name``: ``MissingPlugin`` with a ``pip install`` hint if
        none, ``PluginConflict`` naming both distributions if two register it."""
        found = self.entries().get(name)
        if found is None:
            raise MissingPlugin(self.missing_message(name, needed_by), name=name)
        dists = self._conflicts.get(name)
        if dists:
            raise PluginConflict(
                f"plug-in {name!r} of {self.group} is registered by {' and '.join(dists)}: "
                f"uninstall all but one (pip uninstall {dists[-1]})"
            )
        return found

    def load(self, name: str, needed_by: str = "") -> Any:
        """The object the plug-in ``name`` points at (see ``entry`` for the errors)."""
        return self.entry(name, needed_by).load()

    def missing_message(self, name: str, needed_by: str = "") -> str:
        """Why ``name`` cannot be loaded, with the wheel to install when it is known."""
        what = needed_by or f"plug-in {name!r} of {self.group}"
        provider = self.providers.get(name)
        installed = ", ".join(self.entries()) or "none"
        if provider is not None:
            return f"{what} needs the {provider} wheel: {self.hint(provider)}"
        return f"{what} is not installed (installed: {installed})"


def _pip_install(wheel: str) -> str:
    return f"pip install {wheel}"


def plugin_group(
    group: str,
    providers: Mapping[str, str] | None = None,
    hint: Callable[[str], str] | None = None,
) -> PluginGroup:
    """The one ``PluginGroup`` of ``group`` in this process (providers are added, a hint
    given replaces the one it had)."""
    with _groups_lock:
        found = _groups.get(group)
        if found is None:
            found = _groups[group] = PluginGroup(group, providers, hint)
        else:
            found.providers.update(providers or {})
            if hint is not None:
                found.hint = hint
        return found


def load_plugin(group: str, name: str, provider: str | None = None, needed_by: str = "") -> Any:
    """Load plug-in ``name`` of entry-point ``group``; ``provider``: the wheel to name in
    the ``MissingPlugin`` error (``pip install provider``)."""
    return plugin_group(group, {name: provider} if provider else None).load(name, needed_by)


_groups: dict[str, PluginGroup] = {}
_groups_lock = threading.Lock()
