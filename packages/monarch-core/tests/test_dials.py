"""How many connections a spawned proc and its controller open: one each way, a
handshake each (most of what a proc spends after its fork), never a second to a peer
already reached."""

from __future__ import annotations

from monarch.actor import Actor, endpoint, this_host
from monarch.core._runtime import current_runtime, running_runtime


class Dials(Actor):
    @endpoint
    def ping(self) -> None:
        """The first answer: what makes the proc dial its controller."""

    @endpoint
    def dialed(self) -> tuple[str, dict[str, int]]:
        runtime = running_runtime()
        assert runtime is not None
        return runtime.address, dict(runtime.dialed)


def test_a_spawned_proc_dials_its_controller_once_and_is_dialed_once() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 4})
    try:
        actors = procs.spawn("dials", Dials)
        actors.ping.call().get(timeout=60)
        actors.ping.call().get(timeout=60)  # a second round opens nothing more
        found = list(actors.dialed.call().get(timeout=60).values())
    finally:
        procs.stop().get(timeout=60)
    client = current_runtime()
    assert len({address for address, _ in found}) == 4
    for address, dialed in found:
        assert dialed == {client.address: 1}, (address, dialed)
        assert client.dialed[address] == 1, (address, client.dialed)
