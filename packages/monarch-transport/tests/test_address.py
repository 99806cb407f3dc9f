"""Address URLs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.transport import Address, AddressError


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("unix:///tmp/a.sock", Address("unix", "/tmp/a.sock")),
        ("unix://@name", Address("unix", "@name")),
        ("unix://@", Address("unix", "@")),
        ("tcp://127.0.0.1:0", Address("tcp", "127.0.0.1", 0)),
        ("tcp://localhost:22222", Address("tcp", "localhost", 22222)),
        ("tls://[::1]:443", Address("tls", "::1", 443)),
    ],
)
def test_parse(url: str, expected: Address) -> None:
    assert Address.parse(url) == expected
    assert str(expected) == url


@pytest.mark.parametrize(
    "url",
    [
        "",
        "tcp:/x:1",
        "tcp://host",
        "tcp://:1",
        "tcp://h:99999",
        "tcp://h:-1",
        "tcp://::1:5",
        "tcp://[::1]5",
        "unix://",
        "unix://a\x00b",
        "TCP://h:1",
    ],
)
def test_bad_urls_raise_address_error(url: str) -> None:
    with pytest.raises(AddressError):
        Address.parse(url)
    assert issubclass(AddressError, ValueError)


def test_non_string_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        Address.parse(1234)  # type: ignore[arg-type]


hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9.\-]{0,20}", fullmatch=True),
    st.ip_addresses().map(str),
)


@given(scheme=st.sampled_from(["tcp", "tls"]), host=hosts, port=st.integers(0, 65535))
def test_network_addresses_round_trip(scheme: str, host: str, port: int) -> None:
    address = Address(scheme, host, port)
    assert Address.parse(str(address)) == address


@given(path=st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=50))
def test_unix_addresses_round_trip(path: str) -> None:
    address = Address("unix", path)
    assert Address.parse(str(address)) == address
