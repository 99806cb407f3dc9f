"""The admin server as ``monarch top`` reaches it: HTTP GETs with the token, JSON back."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any, Final
from urllib.parse import quote

from ._auth import read_token
from ._discovery import choose, context_job, live_servers
from ._stacks import PYSPY_TIMEOUT

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


class NoServer(Exception):
    """No admin server to talk to (the message says why and what to do)."""


def find_server(addr: str | None, token: str | None) -> tuple[str, str]:
    """The server to talk to, and its token: ``addr`` if given, else the one serving the
    job of this folder's active ``monarch context``, else this user's newest one here
    (``_discovery``; a choice that needs saying is said on stderr). A token not given is
    read from ``MONARCH_ADMIN_TOKEN`` or the server's file. ``NoServer`` if none."""
    if addr is None:
        job = context_job()
        record, why = choose(live_servers(), job)
        if record is None:
            raise NoServer(
                "no admin server is running here for this user (start_admin(), "
                "job.enable_admin() or TelemetryConfig(include_dashboard=True) in the job's "
                "client starts one); --addr HOST:PORT --token TOKEN reaches one elsewhere"
            )
        if why:
            print(f"monarch: {why}", file=sys.stderr)
        addr = record.addr
    found = token or read_token(port_of(addr))
    if not found:
        raise NoServer(
            f"no token for {addr}: pass --token, set MONARCH_ADMIN_TOKEN, "
            "or run as the user whose job started the admin server"
        )
    return addr, found


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--addr`` and ``--token``: how a command finds the admin server (``found_server``)."""
    parser.add_argument(
        "--addr",
        default=None,
        help="the admin server's HOST:PORT (default: the one of this folder's active "
        "monarch context's job, else this user's newest one here)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="its token (default: $MONARCH_ADMIN_TOKEN, or the file it wrote)",
    )


def found_server(args: argparse.Namespace, command: str) -> AdminClient | None:
    """A client of the server the options of ``add_server_options`` name, once it answered;
    None (and a sentence on stderr) where there is none, or it does not answer."""
    try:
        addr, token = find_server(args.addr, args.token)
        client = AdminClient(addr, token)
        client.get("/v1/root")
    except (NoServer, AdminError, ValueError) as exc:
        print(f"monarch {command}: {exc}", file=sys.stderr)
        return None
    return client
