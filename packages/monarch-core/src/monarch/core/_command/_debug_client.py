"""``monarch debug``: the terminal end of the debugger (see ``_debugger``).

The client's debugger console listens on ``MONARCH_DEBUG_SERVER_HOST``:``MONARCH_DEBUG_SERVER_PORT``
(upstream's names and defaults, ``localhost``:27000) and speaks lines, as upstream's does
(whose ``monarch debug`` is ``nc``). Unlike upstream's, it asks first for a token: a pdb
prompt runs any code in the job, so only who can read the token file the client wrote
(``~/.monarch/debug/<port>.token``, mode 0600), or was given the token, gets one.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import sys
from pathlib import Path
from typing import Final

HOST_ENV: Final = "MONARCH_DEBUG_SERVER_HOST"
PORT_ENV: Final = "MONARCH_DEBUG_SERVER_PORT"
PROTOCOL_ENV: Final = "MONARCH_DEBUG_SERVER_PROTOCOL"
TOKEN_ENV: Final = "MONARCH_DEBUG_TOKEN"


def server_host() -> str:
    return os.environ.get(HOST_ENV, "localhost")


def server_port() -> int:
    return int(os.environ.get(PORT_ENV, "27000"))


def token_file(port: int) -> Path:
    """Where the client that listens on ``port`` keeps the console's token."""
    return Path.home() / ".monarch" / "debug" / f"{port}.token"


def read_token(port: int) -> str:
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    try:
        return token_file(port).read_text().strip()
    except OSError as exc:
        raise SystemExit(
            f"monarch debug: no token for port {port} ({exc.strerror}: {exc.filename}); "
            f"is a job with a breakpoint running here? Elsewhere, set {TOKEN_ENV}."
        ) from None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("debug", help="attach to the debugger of a running job")
    parser.add_argument("--host", default=None, help=f"the client's host (${HOST_ENV})")
    parser.add_argument("--port", type=int, default=None, help=f"its port (${PORT_ENV})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Relay lines between this terminal and the console until either side ends."""
    host = args.host or server_host()
    port = args.port or server_port()
    token = read_token(port)
    try:
        sock = socket.create_connection((host, port), timeout=10)
    except OSError as exc:
        print(f"monarch debug: cannot reach {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    sock.sendall(f"{token}\n".encode())
    return relay(sock)


def relay(sock: socket.socket) -> int:
    """Copy the console's output to stdout and stdin's lines to the console, until the
    console closes (``quit``) or stdin ends."""
    sock.setblocking(False)
    stdin = sys.stdin.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        selector.register(stdin, selectors.EVENT_READ)
        try:
            while True:
                for key, _ in selector.select():
                    if key.fileobj is sock:
                        data = sock.recv(65536)
                        if not data:
                            return 0
                        sys.stdout.write(data.decode(errors="replace"))
                        sys.stdout.flush()
                    else:
                        line = os.read(stdin, 65536)
                        if not line:
                            sock.shutdown(socket.SHUT_WR)
                            selector.unregister(stdin)
                            continue
                        sock.setblocking(True)
                        sock.sendall(line)
                        sock.setblocking(False)
        except KeyboardInterrupt:
            return 130
        except OSError as exc:
            print(f"\nmonarch debug: {exc.strerror or exc}", file=sys.stderr)
            return 1
        finally:
            sock.close()
