"""``monarch dashboard``: where a job's dashboard page is, its token in the link (upstream's
command serves its own web app; here the admin server of the job serves the page)."""

from __future__ import annotations

import argparse
import sys
import webbrowser

from ._client import add_server_options, found_server


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dashboard", help="the dashboard page of a job's admin server (its link, or open it)"
    )
    add_server_options(parser)
    parser.add_argument("--open", action="store_true", help="open it in a web browser too")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    client = found_server(args, "dashboard")  # one that answers: never a dead link
    if client is None:
        return 2
    url = f"http://{client.addr}/?token={client.token}"
    print(url, flush=True)
    if args.open and not webbrowser.open(url):
        print("monarch dashboard: no web browser to open it with", file=sys.stderr)
        return 1
    return 0
