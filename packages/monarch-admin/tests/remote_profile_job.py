"""A client in one network namespace whose proc runs under ``monarch worker`` in another
(run by test_profile.py): its admin server serves ``monarch profile`` in the client's
namespace; prints ``{"url", "addr", "token"}`` and ends when its stdin closes."""

from __future__ import annotations

import json
import sys

from monarch.actor import Actor, attach_to_workers, endpoint
from monarch.admin import start_admin


class Far(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def main() -> None:
    hosts = attach_to_workers(workers=[sys.argv[1]], ca="trust_all_connections")
    far = hosts.spawn_procs(per_host={"gpus": 1}, name="far").spawn("far", Far)
    far.ping.call().get(timeout=60)
    server = start_admin("127.0.0.1:0", quiet=True)
    print(json.dumps({"url": server.url, "addr": server.addr, "token": server.token}), flush=True)
    sys.stdin.read()
    server.close()


if __name__ == "__main__":
    main()
