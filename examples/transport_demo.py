"""A tour of monarch.transport: authenticated multipart frames over unix, tcp and tls.

Run it with ``hatch run demo-transport`` (or ``python examples/transport_demo.py`` where
monarch-transport is installed). It starts an echo listener per transport, talks to it,
shows what a client with the wrong secret gets, and measures a quick round trip. The TLS
part uses a CA that monarch-core makes for a job (``monarch.core.job_identity``, with
``cryptography``); without monarch-core it is skipped, saying so.
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


def tls_contexts() -> dict[str, ssl.SSLContext] | None:
    """Both ends' TLS contexts, from a new CA that monarch-core makes (None without it)."""
    try:
        from monarch.core import job_identity
    except ImportError:
        return None
    identity = job_identity()  # a CA, and a certificate it signed for 127.0.0.1
    return {"server": identity.server_context, "client": identity.client_context}


async def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    print("installed transports:", available_transports())
    secret = secrets.token_bytes(32)
    await tour("unix://@", secret)
    await tour("tcp://127.0.0.1:0", secret)
    tls = tls_contexts()
    if tls is None:
        print("tls: skipped (its certificates come from monarch-core, not installed here)")
    else:
        await tour("tls://127.0.0.1:0", secret, **tls)


if __name__ == "__main__":
    anyio.run(main)
