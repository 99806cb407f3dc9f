"""Python log records in actors: upstream's ``[actor=<name>]`` prefix and ``Actor.logger``
(probed against upstream 0.7.0: a record written by a handler starts with the prefix; one
written by Python's last resort, with no handler configured, does not)."""

from __future__ import annotations

import io
import logging

from monarch.actor import Actor, endpoint, this_host, this_proc
from monarch.config import configured


class Logs(Actor):
    @endpoint
    def log(self) -> list[str]:
        """What a handler added in the actor's code writes of three records."""
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        handler.setFormatter(logging.Formatter("%(name)s:%(levelname)s:%(message)s"))
        user = logging.getLogger("user")
        user.addHandler(handler)
        other = logging.StreamHandler(io.StringIO())  # a second handler: one prefix still
        user.addHandler(other)
        try:
            user.warning("hello %s", 1)
            user.warning("")
            self.logger.addHandler(handler)
            self.logger.debug("via self.logger")
        finally:
            user.removeHandler(handler)
            user.removeHandler(other)
            self.logger.removeHandler(handler)
        return out.getvalue().splitlines()

    @endpoint
    def logger_of(self) -> tuple[str, int]:
        return self.logger.name, self.logger.level


def test_records_in_an_actor_start_with_its_name_and_its_logger_is_upstreams() -> None:
    name = f"<root>.<{Logs.__module__}.Logs logs{{'gpus': 0/2}}>"
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("logs", Logs)
    lines = mesh.slice(gpus=0).log.call_one().get(timeout=60)
    assert lines == [
        f"user:WARNING:[actor={name}] hello 1",
        "user:WARNING:",
        f"Logs:DEBUG:[actor={name}] via self.logger",
    ]
    assert mesh.slice(gpus=1).logger_of.call_one().get(timeout=60) == ("Logs", logging.DEBUG)
    procs.stop().get(timeout=60)


def test_the_prefix_can_be_turned_off() -> None:
    with configured(prefix_python_logs_with_actor=False):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        lines = procs.spawn("plain", Logs).log.call_one().get(timeout=60)
    assert lines == ["user:WARNING:hello 1", "user:WARNING:", "Logs:DEBUG:via self.logger"]
    procs.stop().get(timeout=60)


def test_records_outside_actors_are_left_alone() -> None:
    this_proc().spawn("here", Logs)  # the filter is in this process too, now
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    client = logging.getLogger("client-side")
    client.addHandler(handler)
    try:
        client.warning("from the client")
    finally:
        client.removeHandler(handler)
    assert out.getvalue() == "from the client\n"
