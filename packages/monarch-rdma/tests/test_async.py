"""The futures of buffer operations awaited from async code, on asyncio and on trio."""

from __future__ import annotations

import pytest

from monarch.rdma import RDMAAction, RDMABuffer, RDMABufferDropped

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning"),
]


async def test_operations_are_awaitable() -> None:
    data = bytearray(b"payload!" * 1000)
    buf = RDMABuffer(data)
    out = bytearray(len(data))
    await buf.read_into(out)
    assert out == data
    await buf.write_from(b"PAYLOAD!")
    assert data[:8] == b"PAYLOAD!"
    old = bytearray(8)
    await RDMAAction().fetch_add(buf, old, 1).submit()
    assert old == b"PAYLOAD!"
    await buf.drop()
    with pytest.raises(RDMABufferDropped):
        await buf.read_into(out)
