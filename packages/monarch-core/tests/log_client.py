"""Clients for test_logs.py, each run as its own process (the test reads its stdout and
stderr, where forwarded lines are printed).

    python log_client.py stream            3 procs print; lines streamed, one by one
    python log_client.py aggregate         64 procs print alike; one aggregated block
    python log_client.py crash             a proc prints, then dies by SIGSEGV
    python log_client.py off               forwarding off at spawn: the warning
    python log_client.py remote ADDR       procs on a worker at ADDR (TCP)
    python log_client.py capture           file capture (forwarding off), then a proc that
                                           fails at its start: its stderr's tail
"""

from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import logging
import os
import sys

import monarch.actor
from monarch.actor import Actor, current_rank, endpoint, this_host
from monarch.config import configure
from monarch.core._host._attach import attach_to_workers
from monarch.core._mesh._launch import BootstrapCommand


class Talker(Actor):
    @endpoint
    def talk(self, text: str) -> int:
        rank = current_rank().rank
        print(f"{text} from rank {rank}", flush=True)
        print(f"complaint of rank {rank}", file=sys.stderr, flush=True)
        return rank

    @endpoint
    def same(self) -> None:
        print("every rank says this", flush=True)

    @endpoint
    def root_level(self) -> int:
        return logging.getLogger().level

    @endpoint
    def crash(self) -> None:
        print("last words", flush=True)
        faulthandler.enable()
        ctypes.string_at(0)  # SIGSEGV: faulthandler writes the traceback to stderr


def marker(text: str) -> None:
    print(f"CLIENT: {text}", flush=True)


async def stream() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    await procs.logging_option(stream_to_client=True, level=logging.DEBUG)
    talker = procs.spawn("talker", Talker)
    await talker.talk.call("hello")
    marker(f"root level {set((await talker.root_level.call()).values())}")
    await procs.stop()
    marker("stopped")


async def aggregate() -> None:
    configure(procs_per_process=16)  # 64 procs in 4 processes: cheap on 2 cores
    procs = this_host().spawn_procs(per_host={"gpus": 64})
    await procs.logging_option(stream_to_client=True, aggregate_window_sec=1)
    talker = procs.spawn("talker", Talker)
    await talker.same.call()
    await talker.talk.call("hello")
    await procs.stop()  # the open window is printed at the stop, not lost
    marker("stopped")


async def crash() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    await procs.logging_option(stream_to_client=True)
    talker = procs.spawn("talker", Talker)
    try:
        await talker.crash.call_one()
    except Exception as exc:  # noqa: BLE001 - the test reads what it was
        marker(f"crash raised {type(exc).__name__}")
    await procs.stop()
    marker("stopped")


async def off() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        await procs.logging_option(stream_to_client=False, aggregate_window_sec=1)
    except RuntimeError as exc:
        marker(f"RuntimeError {exc}")
    try:
        await procs.logging_option(stream_to_client=True, level="x")  # type: ignore[arg-type]
    except TypeError as exc:
        marker(f"TypeError {exc}")
    await procs.logging_option(stream_to_client=True)  # warns: forwarding was off
    await procs.stop()
    marker("stopped")


async def remote(address: str) -> None:
    hosts = attach_to_workers(workers=[address])
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    await procs.logging_option(stream_to_client=True)
    talker = procs.spawn("talker", Talker)
    await talker.talk.call("far")
    await procs.stop()
    marker("stopped")


FAILING_START = """
import sys
for i in range(10):
    print(f"boot line {i}", file=sys.stderr)
print(file=sys.stderr)
sys.exit(1)
"""


async def capture() -> None:
    configure(enable_file_capture=True)  # alone, as upstream's outside Meta: no files
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    await procs.spawn("talker", Talker).talk.call("unforced")
    await procs.stop()
    configure(force_file_log=True)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    await procs.spawn("talker", Talker).talk.call("captured")
    await procs.stop()
    command = BootstrapCommand(sys.executable, None, ["-c", FAILING_START], {})
    for lines in (0, 3):
        configure(tail_log_lines=lines)
        failing = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=command)
        try:
            await failing.initialized
        except RuntimeError as exc:
            marker(f"tail {lines}: {exc!r}")


if __name__ == "__main__":
    monarch.actor.unhandled_fault_hook = lambda failure: marker(f"fault {failure.mesh_name}")
    scenario = sys.argv[1]
    if scenario not in ("off", "capture"):
        configure(enable_log_forwarding=True)
    os.environ.pop("PYTHONFAULTHANDLER", None)
    main = {"stream": stream, "aggregate": aggregate, "crash": crash, "off": off}
    main["capture"] = capture
    if scenario == "remote":
        asyncio.run(remote(sys.argv[2]))
    else:
        asyncio.run(main[scenario]())
