"""The controller of test_hosts.py, run on its own "host" (a network namespace).

    python rdma_hosts_controller.py WORKER_ADDRESS

Attaches to a ``monarch worker`` on another host, spawns an owner there and moves a buffer
both ways through the TCP plane (``read_peer_buffers=False``: the namespaces share a
kernel, so the shared-memory plane would serve them otherwise); prints one JSON line.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings

from monarch.actor import Actor, attach_to_workers, endpoint
from monarch.config import configure
from monarch.rdma import RDMABuffer
from monarch.rdma._transfer import plane

SIZE = 6 * 1024 * 1024 + 7


class Owner(Actor):
    """Defined in ``__main__``: travels to the worker's proc by value."""

    def __init__(self) -> None:
        warnings.simplefilter("ignore")
        self.data = bytearray(bytes(range(256)) * (SIZE // 256 + 1))[:SIZE]
        self.buf = RDMABuffer(self.data)

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buf

    @endpoint
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def main(address: str) -> None:
    warnings.simplefilter("ignore")
    # Namespaces share this machine's kernel: the owner's memory could be read directly
    # (the shared-memory plane). Taken away, the bytes cross the namespaces' network.
    configure(read_peer_buffers=False)
    hosts = attach_to_workers(workers=[address], ca="trust_all_connections")
    owner = hosts.spawn_procs(per_host={"procs": 1}).spawn("owner", Owner)
    buf = owner.handle.call_one().get(timeout=60)
    out = bytearray(SIZE)
    buf.read_into(out).get(timeout=60)
    written = bytes(reversed(out))
    buf.write_from(written).get(timeout=60)
    print(
        json.dumps(
            {
                "plane": plane(buf._handle),
                "owner_host": (buf._handle.reach("tcp") or ("",))[0],
                "read": out == bytes(range(256)) * (SIZE // 256) + bytes(range(SIZE % 256)),
                "written": owner.digest.call_one().get(timeout=60)
                == hashlib.sha256(written).hexdigest(),
            }
        ),
        flush=True,
    )
    hosts.shutdown().get(timeout=60)


if __name__ == "__main__":
    main(sys.argv[1])
