"""Who may ask: the token an admin server prints at start, kept in a 0600 file.

The admin server shows every actor and stack of a job, so each request carries the
server's token (``Authorization: Bearer TOKEN`` or ``?token=TOKEN``), or the job's secret
in hex. The token is also written to ``~/.monarch/admin/<port>.token`` (mode 0600, in a
0700 folder) so that ``monarch top`` run by the same user finds it.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path
from typing import Final

TOKEN_ENV: Final = "MONARCH_ADMIN_TOKEN"
"""Where ``monarch top`` looks for the token first."""


def new_token() -> str:
    """192 random bits in hex: a urlsafe token starts with ``-`` one time in 64, and
    ``--token -x...`` then reads as an option to argparse."""
    return secrets.token_hex(24)


def token_folder() -> Path:
    return Path.home() / ".monarch" / "admin"


def token_file(port: int) -> Path:
    """Where the server listening on ``port`` keeps its token."""
    return token_folder() / f"{port}.token"


def write_token(port: int, token: str) -> Path:
    """Write the token where only this user can read it; returns the file."""
    folder = token_folder()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = token_file(port)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        os.fchmod(file.fileno(), 0o600)  # an older file of another mode
        file.write(token + "\n")
    return path


def remove_token(port: int, token: str) -> None:
    """Remove the token file, if it is still this server's."""
    path = token_file(port)
    try:
        if path.read_text().strip() == token:
            path.unlink()
    except OSError:
        pass


def read_token(port: int) -> str | None:
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    try:
        return token_file(port).read_text().strip() or None
    except OSError:
        return None


def token_matches(given: str, accepted: tuple[str, ...]) -> bool:
    """Whether ``given`` is one of the ``accepted`` tokens (in constant time)."""
    found = False
    for token in accepted:
        found |= hmac.compare_digest(given.encode(), token.encode())
    return found
