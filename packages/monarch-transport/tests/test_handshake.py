"""The handshake state machine, sans I/O: agreement, authentication, tampering."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.transport import AuthenticationError, HandshakeError, ProtocolVersionError
from monarch.transport.wire import MAGIC, Handshake

SECRET = b"the job secret"


def run(client: Handshake, server: Handshake, tamper=None) -> list[bytes]:  # type: ignore[no-untyped-def]
    """Shuttle bytes until both sides finish or fail; ``tamper(i, data)`` edits message i."""
    transcript: list[bytes] = []
    sides = [(client, server), (server, client)]
    turn = 0
    while client.wants_more or server.wants_more:
        sender, receiver = sides[turn % 2]
        data = sender.data_to_send()
        turn += 1
        if not data:
            if turn > 10:
                break
            continue
        if tamper is not None:
            data = tamper(len(transcript), data)
        transcript.append(data)
        receiver.receive_data(data)
    return transcript


def test_both_sides_agree_and_prove_the_secret() -> None:
    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    transcript = run(client, server)
    assert client.complete and server.complete
    assert client.version == server.version == 1
    assert transcript[0].startswith(MAGIC)
    assert len(transcript) == 4
    assert SECRET not in b"".join(transcript)


def test_highest_common_version_wins() -> None:
    client = Handshake("client", SECRET, min_version=1, max_version=3)
    server = Handshake("server", SECRET, min_version=2, max_version=5)
    run(client, server)
    assert client.version == server.version == 3


def test_no_common_version_is_refused_on_both_sides() -> None:
    client = Handshake("client", SECRET, min_version=3, max_version=4)
    server = Handshake("server", SECRET, min_version=1, max_version=2)
    with pytest.raises(ProtocolVersionError, match="no common protocol version"):
        run(client, server)
    # The server's Reject tells the client why.
    with pytest.raises(ProtocolVersionError, match=r"client speaks 3\.\.4, server 1\.\.2"):
        client.receive_data(server.data_to_send())


def test_wrong_secret_fails_at_the_client_before_it_proves_anything() -> None:
    client, server = Handshake("client", b"wrong"), Handshake("server", SECRET)
    with pytest.raises(AuthenticationError, match="secret mismatch"):
        run(client, server)
    with pytest.raises(AuthenticationError, match="authentication failed"):
        server.receive_data(client.data_to_send())
    assert not server.complete


def test_impostor_client_is_refused_by_the_server() -> None:
    """A client that skips verification and replays a proof of its own making fails."""
    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    forged = Handshake("client", b"not the secret")

    def tamper(i: int, data: bytes) -> bytes:
        if i == 2:  # replace the client's proof with one made under another secret
            forged._transcript = client._transcript[:]  # same transcript, other key
            from monarch.transport.wire import Proof, encode

            body = encode(Proof(forged._mac(b"monarch-transport client proof\x00")))
            return len(body).to_bytes(2, "big") + body
        return data

    with pytest.raises(AuthenticationError, match="client failed to prove"):
        run(client, server, tamper)


def test_garbage_instead_of_magic() -> None:
    server = Handshake("server", SECRET)
    with pytest.raises(HandshakeError, match="bad magic"):
        server.receive_data(b"GET / HTTP/1.1\r\n")
    # Failure is sticky: nothing more is processed.
    with pytest.raises(HandshakeError):
        server.receive_data(MAGIC)


def test_oversized_handshake_message() -> None:
    server = Handshake("server", SECRET)
    with pytest.raises(HandshakeError, match="too large"):
        server.receive_data(MAGIC + b"\xff\xff")


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        Handshake("client", b"")
    with pytest.raises(TypeError):
        Handshake("client", "text")  # type: ignore[arg-type]


def test_bytes_after_the_handshake_are_kept_for_the_frame_stream() -> None:
    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    client.receive_data(b"")
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send() + b"first frame bytes")
    assert client.complete and client.leftover == b"first frame bytes"


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_mutated_transcript_is_rejected(data: st.DataObject) -> None:
    """Flip any byte of any handshake message: neither side completes successfully."""
    # Learn the honest transcript's shape first.
    honest = run(Handshake("client", SECRET), Handshake("server", SECRET))
    index = data.draw(st.integers(0, len(honest) - 1), label="message")
    position = data.draw(st.integers(0, len(honest[index]) - 1), label="byte")
    flip = data.draw(st.integers(1, 255), label="xor")

    def tamper(i: int, message: bytes) -> bytes:
        if i != index:
            return message
        mutated = bytearray(message)
        mutated[position] ^= flip
        return bytes(mutated)

    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    try:
        run(client, server, tamper)
    except HandshakeError:
        pass
    assert not (client.complete and server.complete)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_handshake_survives_arbitrary_chunking(data: st.DataObject) -> None:
    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    sides = [(client, server), (server, client)]
    for turn in range(4):
        sender, receiver = sides[turn % 2]
        payload = sender.data_to_send()
        while payload:
            n = data.draw(st.integers(1, len(payload)))
            receiver.receive_data(payload[:n])
            payload = payload[n:]
    assert client.complete and server.complete and client.version == server.version
