"""Drop-in names upstream's users import: top-level config helpers, ``monarch.actor``'s ``Uid``,
``ProcId`` and ``concurrent``, ``Extent``/``Point.from_bytes``, ``HostMesh.region`` and
``stream_logs``, ``monarch.tools.config``'s ``Config``/``NOT_SET``, ``monarch.tools.network``.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0 to show the expectations are upstream's.
"""

from __future__ import annotations

import importlib.util
import pickle
import struct
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import monarch
import monarch.config
from monarch.actor import Extent, Point, ProcId, Uid, this_host

U64_MAX = (1 << 64) - 1


# -- top-level config helpers -------------------------------------------------------------------


def test_top_level_config_helpers_are_monarch_configs() -> None:
    for name in ("configure", "configured", "get_global_config", "get_runtime_config"):
        assert getattr(monarch, name) is getattr(monarch.config, name)
    assert monarch.clear_runtime_config is monarch.config.clear_runtime_config


def test_configured_applies_then_restores_the_runtime_layer() -> None:
    monarch.clear_runtime_config()
    monarch.configure(max_cast_fanout=8)
    before = monarch.get_runtime_config()
    with monarch.configured(max_cast_fanout=4, message_ttl_default=7) as merged:
        assert merged["max_cast_fanout"] == 4
        assert monarch.get_global_config()["message_ttl_default"] == 7
        assert monarch.get_runtime_config()["max_cast_fanout"] == 4
    assert monarch.get_runtime_config() == before
    assert monarch.get_global_config()["max_cast_fanout"] == 8
    monarch.clear_runtime_config()
    assert monarch.get_global_config()["max_cast_fanout"] == 16


# -- monarch.actor.concurrent -------------------------------------------------------------------


def test_actor_concurrent_module() -> None:
    import monarch.actor as actor

    assert actor.concurrent.concurrent_endpoint is actor.concurrent_endpoint
    from monarch.actor.concurrent import concurrent_endpoint

    assert concurrent_endpoint is actor.concurrent_endpoint


# -- Uid and ProcId -----------------------------------------------------------------------------


def test_uid_forms() -> None:
    assert str(Uid.instance_from_value(0)) == "<1>"
    assert str(Uid.instance_from_value(42, "x")) == "x<J>"
    assert [str(Uid.instance_from_value(v)) for v in (57, 58, 3364)] == ["<Z>", "<21>", "<211>"]
    assert str(Uid.instance_from_value(U64_MAX)) == "<JPwcyDCgEup>"
    named = Uid.instance("hello")
    assert named.label == "hello" and named.is_instance and not named.is_singleton
    assert str(named).startswith("hello<")
    assert Uid.anonymous().label is None
    single = Uid.from_string("foo")
    assert (str(single), single.label, single.is_singleton, single.instance_value) == (
        "foo",
        "foo",
        True,
        None,
    )
    assert str(Uid.from_string("foo<111>")) == "foo<1>"  # leading zero digits dropped


def test_uid_equality() -> None:
    assert Uid.instance("x") != Uid.instance("x")  # fresh values
    a, b = Uid.instance_from_value(5, "a"), Uid.instance_from_value(5, "b")
    assert a == b and hash(a) == hash(b)  # instances compare by value
    assert Uid.from_string("foo") == Uid.from_string("foo")
    assert Uid.from_string("foo") != Uid.from_string("bar")
    assert Uid.from_string("foo") != Uid.instance_from_value(5, "foo")
    assert Uid.from_string("foo") != ProcId(Uid.from_string("foo"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'expected "label" or "<", found end of input'),
        ("@@", 'expected "label" or "<", found "@"'),
        ("not a uid!!", "invalid label: label contains invalid character ' '"),
        ("Foo9<J>", "invalid label: label must start with a lowercase letter"),
        ("aB", "invalid label: label must end with a lowercase letter or digit"),
        ("a-", "invalid label: label must end with a lowercase letter or digit"),
        ("a" * 64, "invalid label: label exceeds 63 characters"),
        ("a.b", 'expected end of input, found "."'),
        ("<0>", "invalid base58 uid: 0"),
        ("<l>", "invalid base58 uid: l"),
        ("<JPwcyDCgEuq>", "invalid base58 uid: JPwcyDCgEuq"),  # 2**64
        ("foo<>", 'expected uid text, found ">"'),
        ("x<J", 'expected ">", found end of input'),
    ],
)
def test_uid_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + "invalid uid: invalid uid syntax: " + _re(message)):
        Uid.from_string(text)
    with pytest.raises(ValueError, match=r"^invalid proc id: invalid proc id: invalid uid syntax"):
        ProcId.from_string(text)


def _re(text: str) -> str:
    import re

    return re.escape(text) + "$"


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("", "label must not be empty"),
        ("aBc", "label contains invalid character 'B'"),
        ("-ab", "label must start with a lowercase letter"),
    ],
)
def test_uid_label_errors(label: str, message: str) -> None:
    with pytest.raises(ValueError, match="^invalid uid label: " + _re(message)):
        Uid.instance(label)


def test_uid_value_and_type_errors() -> None:
    with pytest.raises(OverflowError):
        Uid.instance_from_value(-1)
    with pytest.raises(OverflowError):
        Uid.instance_from_value(U64_MAX + 1)
    with pytest.raises(TypeError):
        Uid.from_string(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ProcId("x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Uid()


def test_proc_id() -> None:
    uid = Uid.instance("hello")
    proc = ProcId(uid)
    assert proc.uid == uid and proc.label == "hello" and str(proc) == str(uid)
    assert ProcId.from_string(str(proc)) == proc
    assert ProcId.from_string("foo").label == "foo"
    assert pickle.loads(pickle.dumps(proc)) == proc
    assert pickle.loads(pickle.dumps(uid)) == uid


_labels = st.from_regex(r"[a-z]([a-z0-9_-]{0,20}[a-z0-9])?", fullmatch=True)


@given(st.integers(0, U64_MAX), st.none() | _labels)
def test_uid_text_round_trip(value: int, label: str | None) -> None:
    uid = Uid.instance_from_value(value, label)
    back = Uid.from_string(str(uid))
    assert back == uid and back.instance_value == value and back.label == label
    assert ProcId.from_string(str(uid)) == ProcId(uid)


# -- Extent.from_bytes, Point.from_bytes --------------------------------------------------------


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def extent_bytes(labels: Sequence[str], sizes: Sequence[int]) -> bytes:
    """Upstream's form (bincode): u64 counts and sizes, labels as u64 length + UTF-8."""
    out = _u64(len(labels))
    for label in labels:
        raw = label.encode()
        out += _u64(len(raw)) + raw
    return out + _u64(len(sizes)) + b"".join(_u64(size) for size in sizes)


@st.composite
def extents(draw: Any) -> tuple[list[str], list[int]]:
    labels = draw(st.lists(st.text(min_size=1, max_size=8), max_size=4, unique=True))
    sizes = draw(st.lists(st.integers(1, 6), min_size=len(labels), max_size=len(labels)))
    return labels, sizes


@given(extents())
def test_extent_from_bytes_round_trip(extent: tuple[list[str], list[int]]) -> None:
    labels, sizes = extent
    built = Extent.from_bytes(extent_bytes(labels, sizes))
    assert built == Extent(labels, sizes)
    assert built.labels == labels and built.sizes == sizes
    assert pickle.loads(pickle.dumps(built)) == built


@given(extents(), st.data())
def test_point_from_bytes_round_trip(extent: tuple[list[str], list[int]], data: Any) -> None:
    labels, sizes = extent
    whole = Extent(labels, sizes)
    rank = data.draw(st.integers(0, whole.nelements - 1))
    point = Point.from_bytes(_u64(rank) + extent_bytes(labels, sizes))
    assert point == Point(rank, whole)
    assert point.rank == rank and point.extent == whole
    assert pickle.loads(pickle.dumps(point)) == point


def test_from_bytes_errors() -> None:
    good = extent_bytes(["a", "b"], [2, 3])
    assert Extent.from_bytes(good + b"x") == Extent(["a", "b"], [2, 3])  # the rest is ignored
    for bad in (b"", b"xyz", good[:-1]):
        with pytest.raises(ValueError, match="UnexpectedEnd"):
            Extent.from_bytes(bad)
        with pytest.raises(ValueError, match="UnexpectedEnd"):
            Point.from_bytes(bad)
    with pytest.raises(ValueError, match="Utf8"):
        Extent.from_bytes(_u64(1) + _u64(1) + b"\xff" + _u64(1) + _u64(1))  # label not UTF-8
    with pytest.raises(TypeError):
        Extent.from_bytes("str")  # type: ignore[arg-type]


# -- HostMesh.region, HostMesh.stream_logs ------------------------------------------------------


def test_host_mesh_region_and_stream_logs() -> None:
    host = this_host()
    assert host.stream_logs is False
    region = host.region
    assert region.labels == [] and region.slice().sizes == []
    assert region == host.region


# -- monarch.tools ------------------------------------------------------------------------------


def test_tools_config() -> None:
    from monarch.tools.config import NOT_SET, Config, Workspace

    assert NOT_SET == "__NOT_SET__"
    config = Config(appdef="app")
    assert (config.scheduler, config.scheduler_args, config.dryrun) == (NOT_SET, {}, False)
    assert config.workspace == Workspace.null()
    assert config == Config(appdef="app")
    with pytest.warns(FutureWarning, match="workspace=None"):
        assert Config(appdef="app", workspace=None).workspace == Workspace.null()  # type: ignore[arg-type]
    with pytest.warns(FutureWarning, match="workspace='/tmp/foo'"):
        moved = Config(appdef="app", workspace="/tmp/foo")  # type: ignore[arg-type]
    assert moved.workspace == Workspace(dirs={"/tmp/foo": ""})


def test_tools_config_default_appdef_needs_torchx() -> None:
    from monarch.tools.config import Config

    if importlib.util.find_spec("torchx") is None:
        with pytest.raises(ModuleNotFoundError, match="torchx"):
            Config()
    else:
        assert Config().appdef.name == "__NOT_SET__"


def test_tools_network() -> None:
    from monarch.tools.network import AddrType, get_ipaddr, get_sockaddr

    assert [member.name for member in AddrType] == ["Default", "IPv4", "IPv6"]
    assert get_ipaddr("127.0.0.1", 0, AddrType.IPv4) == "127.0.0.1"
    assert get_sockaddr("127.0.0.1", 80) == "127.0.0.1:80"
    with pytest.raises(RuntimeError, match=r"Unable to resolve `no-such-host\.invalid`"):
        get_ipaddr("no-such-host.invalid", 1)


@pytest.mark.ours_only  # upstream builds such extents, or panics
def test_from_bytes_refuses_malformed_extents() -> None:
    with pytest.raises(ValueError, match="duplicate dimension name"):
        Extent.from_bytes(extent_bytes(["a", "a"], [1, 2]))
    with pytest.raises(ValueError, match="dimension mismatch"):
        Extent.from_bytes(extent_bytes(["a"], [1, 2]))
    with pytest.raises(ValueError, match="does not contain rank 9"):
        Point.from_bytes(_u64(9) + extent_bytes(["a"], [3]))
