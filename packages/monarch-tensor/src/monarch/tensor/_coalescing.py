"""``coalescing()``: the commands of a block go to each worker as one message at its end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ._client import coalesced


@contextmanager
def coalescing() -> Iterator[None]:
    """Inside, recorded commands are held (beyond the usual batch size, and past the end of
    an ``activate()``) and sent at the end, one message per mesh: a step's many small ops
    cost one message. A fetch inside still sends what its value needs. Nested: the
    outermost sends."""
    coalesced.depth += 1
    try:
        yield
    finally:
        coalesced.depth -= 1
        if not coalesced.depth:
            held, coalesced.held = coalesced.held, {}
            for client in held:
                client.flush()
