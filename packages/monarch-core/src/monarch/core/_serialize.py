"""Pickling of user values: cloudpickle, protocol 5, out-of-band buffers as separate parts.

Values travel as ``[pickle, buffer, buffer, ...]`` so a tensor's or a bytearray's memory
is a frame part of its own, written from where it lies and never joined into the
pickle. cloudpickle sends classes and functions of ``__main__`` by value, which is what
lets a user's script define actors that its worker processes can run.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import cloudpickle

from monarch.transport import Buffer

OUT_OF_BAND_MIN = 4096
"""Buffers smaller than this are cheaper inside the pickle than as a part of their own."""


def dumps(obj: object) -> list[Buffer]:
    """Pickle ``obj``; the first part is the pickle, the rest its out-of-band buffers."""
    buffers: list[pickle.PickleBuffer] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < OUT_OF_BAND_MIN:
            return True  # serialize in band
        buffers.append(buf)
        return False

    data = cloudpickle.dumps(obj, protocol=5, buffer_callback=keep)
    if not buffers:
        return [data]
    return [data, *(b.raw() for b in buffers)]


def loads(parts: Sequence[Buffer]) -> Any:
    """Inverse of :func:`dumps`."""
    return pickle.loads(parts[0], buffers=parts[1:])
