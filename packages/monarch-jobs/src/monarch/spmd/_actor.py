"""``SPMDActor``: one per proc, it gives the proc torchrun's environment and runs a script.

So that a torchrun-style training script (``torch.distributed.init_process_group()`` with
``env://``) runs unchanged on a Monarch mesh: rank 0 names a rendezvous address
(``get_host_port``), every proc sets RANK/WORLD_SIZE/MASTER_ADDR/... from its point
(``setup_env``), then runs the script as ``__main__`` (``main``).
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
from collections.abc import Sequence

from monarch.actor import Actor, current_rank, endpoint
from monarch.core import current_runtime, ip_host

from ._env import elastic_env


class SPMDActor(Actor):
    """Upstream's ``monarch.spmd.SPMDActor``: spawn it on a proc mesh, one per proc."""

    @endpoint
    def get_host_port(self, use_ipaddr: bool | None = None) -> tuple[str, int]:
        """An address of this proc's machine and a free port on it, for MASTER_ADDR and
        MASTER_PORT. ``use_ipaddr``: an IP address rather than the host name (needed where
        the name does not resolve to this machine elsewhere, e.g. network namespaces)."""
        host = _ip_address() if use_ipaddr else socket.getfqdn()
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host if use_ipaddr else "", 0))
            port = int(probe.getsockname()[1])
        return host, port

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set torchrun's variables in this proc's environment (see ``_env``)."""
        point = current_rank()
        sizes = {dim: point.size(dim) for dim in point}
        os.environ.update(elastic_env(point, sizes, master_addr, master_port))

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: Sequence[str]) -> bool:
        """``setup_env``, then run ``script_args`` (``["train.py", ...]`` or
        ``["-m", "pkg.train", ...]``) as ``__main__`` with them as ``sys.argv``. True when
        it ran to its end or exited with status 0; an exception is the endpoint's error."""
        args = list(script_args)
        if not args or (args[0] == "-m" and len(args) < 2):
            raise ValueError(f"script_args must name a script or -m module, not {args!r}")
        point = current_rank()
        sizes = {dim: point.size(dim) for dim in point}
        os.environ.update(elastic_env(point, sizes, master_addr, master_port))
        saved_argv = sys.argv
        try:
            if args[0] == "-m":
                sys.argv = [args[1], *args[2:]]
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = args
                runpy.run_path(args[0], run_name="__main__")
        except SystemExit as exc:
            return exc.code in (0, None)
        finally:
            sys.argv = saved_argv
        return True


def _ip_address() -> str:
    """This proc's IP address as its peers reach it (its runtime's, over TCP), else the
    host name's."""
    host = ip_host(current_runtime().address)
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
