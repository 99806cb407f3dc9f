"""The admin server as ``monarch top`` reaches it: HTTP GETs with the token, JSON back."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import urllib.error
import urllib.request
from typing import Any, Final
from urllib.parse import quote

from ._auth import read_token, token_folder
from ._stacks import PYSPY_TIMEOUT

DEFAULT_ADDR: Final = "127.0.0.1:1729"
STACKS_MARGIN: Final = 20.0
"""Seconds a stacks request may take beyond py-spy's: the server's wait on the proc."""


class AdminError(Exception):
    """The server could not be reached, or refused or failed the request."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class AdminClient:
    def __init__(self, addr: str, token: str, timeout: float = 10.0) -> None:
        self.addr = addr
        self.token = token
        self.timeout = timeout

    def get(self, path: str, timeout: float | None = None) -> Any:
        request = urllib.request.Request(
            f"http://{self.addr}{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                message = exc.reason
            raise AdminError(str(message), exc.code) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(f"cannot reach the admin server at {self.addr}: {reason}") from None

    def snapshot(self) -> Any:
        return self.get("/v1/snapshot")

    def stacks(self, ref: str) -> Any:
        """A proc's stacks: the server may try py-spy (up to ``PYSPY_TIMEOUT``) before the
        proc's own dump (up to its timeout), so this waits longer than a snapshot: a proc
        that answers neither is then said so (504), not taken for the server gone."""
        timeout = max(self.timeout, PYSPY_TIMEOUT + STACKS_MARGIN)
        return self.get("/v1/stacks/" + quote(ref, safe=""), timeout=timeout)


def port_of(addr: str) -> int:
    _, _, port = addr.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"--addr must be HOST:PORT, not {addr!r}")
    return int(port)


def find_server(addr: str | None, token: str | None) -> tuple[str, str | None]:
    """The server to show, and its token: ``addr`` if given, else the newest server of
    this user that still listens on this machine (its token file says which), else the
    default address. A token not given is read from ``MONARCH_ADMIN_TOKEN`` or the file."""
    if addr is None:
        addr = DEFAULT_ADDR
        try:
            files = sorted(token_folder().glob("*.token"), key=lambda p: p.stat().st_mtime)
        except OSError:
            files = []
        for path in reversed(files):
            if path.stem.isdigit() and _listens(int(path.stem)):
                addr = f"127.0.0.1:{path.stem}"
                break
    return addr, token or read_token(port_of(addr))


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--addr`` and ``--token``: how a command finds the admin server (``found_server``)."""
    parser.add_argument(
        "--addr",
        default=None,
        help="the admin server's HOST:PORT (default: this user's newest one here, "
        "else 127.0.0.1:1729)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="its token (default: $MONARCH_ADMIN_TOKEN, or the file it wrote)",
    )


def found_server(args: argparse.Namespace, command: str) -> tuple[str, str] | None:
    """The server the options of ``add_server_options`` name, with its token; None (and a
    sentence on stderr) where no token can be had."""
    addr, token = find_server(args.addr, args.token)
    if not token:
        print(
            f"monarch {command}: no token for {addr}: pass --token, set MONARCH_ADMIN_TOKEN, "
            "or run as the user whose job started the admin server",
            file=sys.stderr,
        )
        return None
    return addr, token


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
