"""Messages to remote procs sent through their host agents: one per host, not one per proc.

A spawner whose procs on another host are watched by their host agent (``Runtime.vouched``,
see ``_host._watching``) already talks to that agent; sending each of those procs a spawn or
a stop itself would open a connection to every one of them (and have each dial back with
its answer): a job's controller would hold O(procs) connections (issue 34). Instead it
sends the agent one ``Relay``, which the agent passes on over the connections it has with
its procs, gathering a spawn's answers into one message up.
"""

from __future__ import annotations

from collections.abc import Iterable

from monarch.core._runtime import Runtime


def by_agent(runtime: Runtime, procs: Iterable[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``procs`` split into those to message directly and, by host agent, those whose agent
    (still in the job) watches them for us and so passes messages on to them."""
    direct: list[str] = []
    relayed: dict[str, list[str]] = {}
    vouched, failed = runtime.vouched, runtime.failed_peers
    for proc in procs:
        agent = vouched.get(proc)
        if agent is None or agent in failed:
            direct.append(proc)
        else:
            relayed.setdefault(agent, []).append(proc)
    return direct, relayed
