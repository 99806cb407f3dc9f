"""The ``monarch`` command."""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from monarch.core._command import _cli


def test_console_script_prints_version() -> None:
    script = Path(sysconfig.get_path("scripts")) / "monarch"
    done = subprocess.run([str(script), "version"], capture_output=True, text=True, check=True)
    assert done.stdout == f"monarch {version('monarch-core')}\n"


def test_module_runs_and_requires_a_subcommand() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "monarch.core._command._cli"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "COMMAND" in done.stderr


class _FakeEntryPoint:
    def __init__(self, name: str, register: Any) -> None:
        self.name = name
        self._register = register

    def load(self) -> Any:
        return self._register


def test_plugins_add_subcommands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []

    def hello(args: argparse.Namespace) -> int:
        calls.append(args.who)
        return 3

    def register(subparsers: Any) -> None:
        parser = subparsers.add_parser("hello", help="greet")
        parser.add_argument("who")
        parser.set_defaults(func=hello)

    def broken(subparsers: Any) -> None:
        raise RuntimeError("plug-in bug")

    plugins = [_FakeEntryPoint("hello", register), _FakeEntryPoint("broken", broken)]
    monkeypatch.setattr(_cli, "_plugins", lambda: plugins)

    assert _cli.main(["hello", "world"]) == 3
    assert calls == ["world"]
    assert "skipping subcommand plug-in 'broken'" in capsys.readouterr().err
    assert _cli.main(["version"]) == 0
    assert capsys.readouterr().out.startswith("monarch ")
