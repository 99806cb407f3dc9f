"""``monarch dashboard``: where a job's dashboard page is, its token in the link (upstream's
command serves its own web app; here the admin server of the job serves the page)."""

from __future__ import annotations

import argparse
import sys
import webbrowser

from ._client import find_server


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dashboard", help="the dashboard page of a job's admin server (its link, or open it)"
    )
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
    parser.add_argument("--open", action="store_true", help="open it in a web browser too")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    addr, token = find_server(args.addr, args.token)
    if not token:
        print(
            f"monarch dashboard: no token for {addr}: pass --token, set MONARCH_ADMIN_TOKEN, "
            "or run as the user whose job started the admin server",
            file=sys.stderr,
        )
        return 2
    url = f"http://{addr}/?token={token}"
    print(url, flush=True)
    if args.open and not webbrowser.open(url):
        print("monarch dashboard: no web browser to open it with", file=sys.stderr)
        return 1
    return 0
