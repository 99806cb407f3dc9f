"""A job keeps spawning and answering while its listener is flooded with connections that
never authenticate (an attacker without the secret), and closes each of them by its
deadline. Real processes and sockets; CI's size (300 connections): ``bench:flood`` runs
1,000 and 10,000."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from monarch.actor import Actor, endpoint, this_host
from monarch.core import current_runtime
from monarch.core.testing import wait_until

FLOOD = 300


class Echo(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _connect(address: str) -> socket.socket:
    scheme, _, rest = address.partition("://")
    if scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect("\0" + rest[1:] if rest.startswith("@") else rest)
    else:
        host, _, port = rest.rpartition(":")
        sock = socket.create_connection((host, int(port)))
    sock.setblocking(False)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.fixture
def flood() -> Iterator[list[socket.socket]]:
    """``FLOOD`` silent connections to the client's own listener, open before the job's
    procs dial it."""
    socks = [_connect(current_runtime().address) for _ in range(FLOOD)]
    yield socks
    for sock in socks:
        sock.close()


def test_a_job_spawns_and_answers_while_its_client_is_flooded(
    flood: list[socket.socket],
) -> None:
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        pids = procs.spawn("echo", Echo).pid.call().get(timeout=120)
        assert len(set(pids.values())) == 2
        # ... and the flood is cut: each silent connection by the hello deadline (3 s).
        wait_until(
            lambda: all(_closed_by_peer(sock) for sock in flood),
            60,
            "every flood connection closed by the client's listener",
        )
    finally:
        procs.stop().get(timeout=60)
