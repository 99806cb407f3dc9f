"""A tour of monarch.transport: authenticated multipart frames over unix, tcp and tls.

Run it with ``hatch run demo``. It starts an echo listener per transport, talks to it,
shows what a client with the wrong secret gets, and measures a quick round trip.
"""

from __future__ import annotations

import logging
import secrets
import ssl
import time

import anyio

from monarch.transport import (
    AuthenticationError,
    Connection,
    ConnectionAttribute,
    available_transports,
    open_connection,
    open_listener,
)


async def echo(conn: Connection) -> None:
    async for frame in conn:
        await conn.send(frame)


async def tour(url: str, secret: bytes, **tls: ssl.SSLContext) -> None:
    server_options = {"ssl_context": tls["server"]} if tls else {}
    client_options = {"ssl_context": tls["client"]} if tls else {}
    async with (
        await open_listener(url, secret=secret, **server_options) as listener,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(listener.serve, echo)
        async with await open_connection(listener.address, secret=secret, **client_options) as conn:
            version = conn.extra(ConnectionAttribute.protocol_version)
            await conn.send([b"header", b"payload part", bytearray(1 << 20)])
            parts = await conn.receive()
            sizes = [len(p) for p in parts]
            rounds = 2000
            start = time.perf_counter()
            for _ in range(rounds):
                await conn.send([b"ping"])
                await conn.receive()
            rtt_us = (time.perf_counter() - start) / rounds * 1e6
            print(
                f"  {listener.address!s:28} protocol v{version}, echoed parts of {sizes} bytes,"
                f" round trip {rtt_us:.0f} us"
            )
        try:
            guess = secrets.token_bytes(32)  # 16 bytes at least: shorter ones are refused
            await open_connection(listener.address, secret=guess, **client_options)
        except AuthenticationError as exc:
            print(f"  {'':28} wrong secret -> {type(exc).__name__}: {exc}")
        tg.cancel_scope.cancel()


def tls_contexts() -> dict[str, ssl.SSLContext]:
    import trustme

    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return {"server": server, "client": client}


async def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    print("installed transports:", available_transports())
    secret = secrets.token_bytes(32)
    await tour("unix://@", secret)
    await tour("tcp://127.0.0.1:0", secret)
    await tour("tls://127.0.0.1:0", secret, **tls_contexts())


if __name__ == "__main__":
    anyio.run(main)
