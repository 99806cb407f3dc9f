"""``monarch gateway``: where a client outside the workers' network attaches.

A gateway runs where both the client and the workers can reach it (a login node); the
client calls ``attach("gateway://HOST:PORT")`` with the address it prints, and then
reaches its workers and procs through it, and they reach the client (see
``monarch.transport``'s gateway: bytes are spliced, the handshake is end to end).
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys

import anyio

from monarch.core._errors import WorkerConfigError
from monarch.core._runtime._netaddr import advertised, bind_url
from monarch.transport import Address, TransportError, open_gateway

from ._bootstrap import whole_lines
from ._environ import SECRET_ENV
from ._worker import add_secret_file_option, worker_secret


async def serve_gateway(listen: str, secret: bytes, *, announce: bool = False) -> None:
    """Serve a gateway at ``listen`` until SIGTERM/SIGINT; ``announce``: print its address
    (the first line of stdout)."""
    bound = Address.parse(bind_url(listen))
    gateway = await open_gateway(bound, secret=secret)
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            tg.start_soon(gateway.serve)
            if announce:
                real = gateway.address
                shown = advertised(Address("tcp", real.host, real.port))  # a wildcard: ours
                where = Address("gateway", shown.host, shown.port)
                print(where, flush=True)
                print(f"monarch gateway: serving at {where}", file=sys.stderr, flush=True)
            async for _ in signals:
                break
        await gateway.aclose()
        tg.cancel_scope.cancel()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``monarch gateway`` subcommand (entry point of ``monarch.commands``)."""
    parser = subparsers.add_parser(
        "gateway",
        help="relay for a client outside the workers' network: attach('gateway://...')",
        description=(
            "Serve as a gateway until SIGTERM/SIGINT: a client that cannot reach the workers "
            "(nor they it) calls attach() with the address printed on the first line of "
            f"stdout. The job secret comes from {SECRET_ENV} (hex) or --secret-file; only "
            "its holders are served."
        ),
    )
    parser.add_argument(
        "--listen",
        default="tcp://0.0.0.0:0",
        metavar="ADDR",
        help="tcp://HOST:PORT (port 0: any; a wildcard host is printed as this machine's)",
    )
    add_secret_file_option(parser)
    parser.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    whole_lines()
    logging.basicConfig(level=logging.WARNING, format="monarch gateway: %(message)s")
    try:
        secret = worker_secret(args.secret_file)
        anyio.run(functools.partial(serve_gateway, args.listen, secret, announce=True))
    except (WorkerConfigError, ValueError) as exc:
        print(f"monarch gateway: {exc}", file=sys.stderr)
        return 2
    except (OSError, TransportError) as exc:
        print(f"monarch gateway: cannot listen at {args.listen}: {exc}", file=sys.stderr)
        return 1
    return 0
