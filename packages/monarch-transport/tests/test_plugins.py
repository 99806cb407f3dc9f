"""The one plug-in loader (``PluginGroup``): real distributions on ``sys.path`` (dist-info
directories as pip writes them), a ``pip install`` hint for a missing plug-in, and a
conflict naming both distributions when two register one name."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from monarch.transport import MissingPlugin, PluginConflict, PluginGroup
from monarch.transport.testing import install_entry_points

GROUP = "monarch.test_plugins"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_plugin_loads_and_a_missing_one_names_the_wheel(site: Path) -> None:
    install_entry_points(site, "monarch-one", GROUP, {"dumps": "json:dumps"})
    group = PluginGroup(GROUP, {"fancy": "monarch-fancy[extra]"})
    assert group.load("dumps") is json.dumps
    assert group.names() == {"dumps": "monarch-one"}
    with pytest.raises(MissingPlugin, match=r"needs the monarch-fancy\[extra\] wheel: pip install"):
        group.load("fancy")
    with pytest.raises(ImportError, match=r"thing\(\) needs the monarch-fancy\[extra\] wheel"):
        group.load("fancy", needed_by="thing()")
    with pytest.raises(LookupError, match=r"'other' of monarch.test_plugins .*installed: dumps"):
        group.load("other")


def test_two_distributions_registering_one_name_are_named(
    site: Path, caplog: pytest.LogCaptureFixture
) -> None:
    install_entry_points(site, "monarch-one", GROUP, {"dup": "json:dumps", "solo": "json:loads"})
    install_entry_points(site, "monarch-two", GROUP, {"dup": "json:loads"})
    group = PluginGroup(GROUP)
    with caplog.at_level(logging.WARNING, logger="monarch.plugins"):
        entries = group.entries()
    assert set(entries) == {"dup", "solo"}
    [warning] = {r.getMessage() for r in caplog.records if "dup" in r.getMessage()}
    assert "monarch-one" in warning and "monarch-two" in warning
    with pytest.raises(
        PluginConflict, match=r"registered by monarch-(one|two) and monarch-(one|two)"
    ):
        group.load("dup")
    assert group.load("solo") is json.loads
