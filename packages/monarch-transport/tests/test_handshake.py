"""The handshake state machine, sans I/O: agreement, authentication, keys, tampering."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.transport import AuthenticationError, HandshakeError, ProtocolVersionError
from monarch.transport.wire import (
    FEATURE_POLY1305,
    MAGIC,
    ClientHello,
    Handshake,
    HandshakeMessage,
    Proof,
    Reject,
    ServerHello,
    decode_handshake,
    encode,
)

SECRET = b"the job secret, 128 bits or more"
OTHER = b"another secret, 128 bits or more"
Tamper = Callable[[int, bytes], bytes]


def run(client: Handshake, server: Handshake, tamper: Tamper | None = None) -> list[bytes]:
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


def messages(data: bytes) -> list[HandshakeMessage]:
    """The handshake messages in ``data`` (MAGIC skipped)."""
    if data.startswith(MAGIC):
        data = data[len(MAGIC) :]
    out = []
    while data:
        size = int.from_bytes(data[:2], "big")
        out.append(decode_handshake(data[2 : 2 + size]))
        data = data[2 + size :]
    return out


def framed(message: object) -> bytes:
    body = encode(message)  # type: ignore[arg-type]
    return len(body).to_bytes(2, "big") + body


def test_both_sides_agree_prove_the_secret_and_derive_mirrored_keys() -> None:
    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    transcript = run(client, server)
    assert client.complete and server.complete
    assert client.version == server.version == 2
    assert transcript[0].startswith(MAGIC)
    kinds = [type(m) for data in transcript for m in messages(data)]
    assert kinds == [ClientHello, ServerHello, Proof, Proof]  # the client proves first
    assert SECRET not in b"".join(transcript)
    assert client.frame_keys is not None and server.frame_keys is not None
    assert client.frame_keys.send == server.frame_keys.receive
    assert client.frame_keys.receive == server.frame_keys.send
    assert client.frame_keys.send != client.frame_keys.receive
    assert client.frame_keys.send.hex() not in repr(client.frame_keys)


def test_every_connection_gets_fresh_keys() -> None:
    first = (Handshake("client", SECRET), Handshake("server", SECRET))
    second = (Handshake("client", SECRET), Handshake("server", SECRET))
    run(*first)
    run(*second)
    assert first[0].frame_keys != second[0].frame_keys


def test_highest_common_version_wins() -> None:
    client = Handshake("client", SECRET, min_version=2, max_version=4)
    server = Handshake("server", SECRET, min_version=3, max_version=6)
    run(client, server)
    assert client.version == server.version == 4


def test_no_common_version_is_refused_on_both_sides() -> None:
    client = Handshake("client", SECRET, min_version=4, max_version=5)
    server = Handshake("server", SECRET, min_version=2, max_version=3)
    with pytest.raises(ProtocolVersionError, match="no common protocol version"):
        run(client, server)
    # The server's Reject tells the client why.
    with pytest.raises(ProtocolVersionError, match=r"client speaks 4\.\.5, server 2\.\.3"):
        client.receive_data(server.data_to_send())


def test_protocol_1_is_no_longer_spoken() -> None:
    """Version 1 frames had no MAC: a peer that speaks only it is refused."""
    with pytest.raises(ValueError, match="oldest spoken is 2"):
        Handshake("client", SECRET, min_version=1, max_version=1)
    server = Handshake("server", SECRET)
    with pytest.raises(ProtocolVersionError, match=r"client speaks 1\.\.1"):
        server.receive_data(MAGIC + framed(ClientHello(1, 1, bytes(32))))


def test_a_client_with_the_wrong_secret_is_refused_and_learns_nothing() -> None:
    client, server = Handshake("client", OTHER), Handshake("server", SECRET)
    with pytest.raises(AuthenticationError, match="client failed to prove"):
        run(client, server)
    with pytest.raises(AuthenticationError, match="authentication failed"):
        client.receive_data(server.data_to_send())
    assert not server.complete and server.frame_keys is None


def test_what_the_listener_says_before_the_client_proves_does_not_depend_on_the_secret() -> None:
    """No offline oracle: an unauthenticated client gets a version and a nonce, nothing
    computed from the secret (same nonce, other secret: the very same bytes)."""
    hello = MAGIC + framed(ClientHello(2, 2, bytes(32)))
    replies = []
    for secret in (SECRET, OTHER):
        server = Handshake("server", secret, nonce=b"n" * 32)
        server.receive_data(hello)
        replies.append(server.data_to_send())
    assert replies[0] == replies[1]
    assert [type(m) for m in messages(replies[0])] == [ServerHello]


def test_an_impostor_server_is_refused_by_the_client() -> None:
    client, server = Handshake("client", SECRET), Handshake("server", OTHER)
    with pytest.raises(AuthenticationError, match="client failed to prove"):
        run(client, server)
    assert not client.complete


def test_a_server_proof_under_another_secret_is_refused() -> None:
    """An impostor listener that skips verification and answers with a proof of its own
    making fails at the client, which then sends nothing more."""
    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    forged = Handshake("server", OTHER)

    def tamper(i: int, data: bytes) -> bytes:
        if i == 3:  # the server's proof, replaced by one under another secret
            forged._transcript = bytearray(client._transcript)
            return framed(Proof(forged._mac(b"monarch-transport server proof\x00")))
        return data

    with pytest.raises(AuthenticationError, match="secret mismatch"):
        run(client, server, tamper)
    assert not client.complete and client.data_to_send() == b""


def test_a_proof_is_good_for_one_connection_only() -> None:
    """A relay replaying a client's hello and proof to another server session fails:
    the proof covers that server's fresh nonce."""
    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    transcript = run(client, server)
    replayed = Handshake("server", SECRET)
    replayed.receive_data(transcript[0])
    replayed.data_to_send()
    with pytest.raises(AuthenticationError, match="client failed to prove"):
        replayed.receive_data(transcript[2])


def test_a_tls_binding_goes_into_the_proofs_and_frames_need_no_keys() -> None:
    binding = b"f" * 48
    client = Handshake("client", SECRET, channel_binding=binding)
    server = Handshake("server", SECRET, channel_binding=binding)
    run(client, server)
    assert client.complete and server.complete
    assert client.frame_keys is None and server.frame_keys is None


def test_a_relay_terminating_tls_fails_the_proofs() -> None:
    """Each side sees its own TLS session's binding: a relay in between makes two."""
    client = Handshake("client", SECRET, channel_binding=b"a" * 48)
    server = Handshake("server", SECRET, channel_binding=b"b" * 48)
    with pytest.raises(AuthenticationError, match="client failed to prove"):
        run(client, server)


@pytest.mark.parametrize(
    ("client_has", "server_has", "agreed"),
    [(FEATURE_POLY1305, FEATURE_POLY1305, FEATURE_POLY1305), (FEATURE_POLY1305, 0, 0), (0, 1, 0)],
)
def test_optional_features_are_those_both_sides_have(
    client_has: int, server_has: int, agreed: int
) -> None:
    client = Handshake("client", SECRET, features=client_has)
    server = Handshake("server", SECRET, features=server_has)
    run(client, server)
    assert client.features == server.features == agreed
    assert client.frame_keys is not None and client.frame_keys.features == agreed


def _features_set_to(value: int) -> Tamper:
    def tamper(i: int, data: bytes) -> bytes:
        if i != 3:  # the server's proof: its MAC covers what came before, not this field
            return data
        (proof,) = messages(data)
        assert isinstance(proof, Proof)
        return framed(Proof(proof.mac, value))

    return tamper


def test_a_relay_cannot_add_a_feature_the_client_did_not_offer() -> None:
    client = Handshake("client", SECRET, features=0)
    server = Handshake("server", SECRET, features=FEATURE_POLY1305)
    with pytest.raises(HandshakeError, match="not offered"):
        run(client, server, _features_set_to(FEATURE_POLY1305))


def test_a_relay_removing_a_feature_fails_the_servers_proof() -> None:
    client = Handshake("client", SECRET, features=FEATURE_POLY1305)
    server = Handshake("server", SECRET, features=FEATURE_POLY1305)
    with pytest.raises(AuthenticationError):
        run(client, server, _features_set_to(0))
    assert not client.complete  # the server's proof covers the features it agreed


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


@pytest.mark.parametrize("secret", [b"", b"00", b"\x00", b"x" * 15])
def test_secrets_under_128_bits_are_refused(secret: bytes) -> None:
    with pytest.raises(ValueError, match=r"at least 16 bytes \(128 bits\)"):
        Handshake("client", secret)


def test_a_secret_must_be_bytes() -> None:
    with pytest.raises(TypeError):
        Handshake("client", "text" * 8)  # type: ignore[arg-type]
    assert Handshake("client", bytes(16)).wants_more  # 16 bytes will do


def test_a_reject_is_sent_for_a_malformed_message() -> None:
    server = Handshake("server", SECRET)
    with pytest.raises(HandshakeError, match="malformed"):
        server.receive_data(MAGIC + b"\x00\x02\xc1\xc1")
    assert [type(m) for m in messages(server.data_to_send())] == [Reject]


def test_bytes_after_the_handshake_are_kept_for_the_frame_stream() -> None:
    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    assert server.complete
    client.receive_data(server.data_to_send() + b"first frame bytes")
    assert client.complete and client.leftover == b"first frame bytes"


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_mutated_transcript_is_rejected(data: st.DataObject) -> None:
    """Flip any byte of any handshake message: the two sides never both complete."""
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
    assert client.frame_keys is not None and server.frame_keys is not None
    assert client.frame_keys.send == server.frame_keys.receive
