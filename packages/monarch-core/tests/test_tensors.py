"""torch tensors in messages: one out-of-band buffer each, a copy taken at send, any dtype and
dense layout kept, and tensors received that are the receiver's own (writable, unshared)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from monarch.actor import Actor, ProcMesh, endpoint, this_host  # noqa: E402
from monarch.config import configured  # noqa: E402
from monarch.core._bulk._lending import LEND_MIN  # noqa: E402
from monarch.core._payload._serialize import OUT_OF_BAND_MIN, dumps, loads  # noqa: E402

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.int8,
    torch.uint8,
    torch.int64,
    torch.bool,
]


def _sample(dtype: Any, shape: tuple[int, ...], seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 100, shape, generator=gen).to(dtype)


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    """Tensors of any listed dtype: contiguous, permuted (dense), sliced (not dense)."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=4)))
    tensor = _sample(dtype, shape, draw(st.integers(0, 2**16)))
    layout = draw(st.sampled_from(["contiguous", "permuted", "sliced"]))
    if layout == "permuted" and tensor.dim() >= 2:
        tensor = tensor.permute(*reversed(range(tensor.dim())))
    elif layout == "sliced" and tensor.dim() >= 1:
        tensor = tensor[..., ::2]
    return tensor


@settings(max_examples=150, deadline=None)
@given(tensors())
def test_round_trip_keeps_values_dtype_and_shape(tensor: Any) -> None:
    back = loads(dumps(tensor))
    assert type(back) is torch.Tensor
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back, tensor)


@settings(max_examples=50, deadline=None)
@given(tensors())
def test_a_dense_layout_keeps_its_strides(tensor: Any) -> None:
    back = loads(dumps(tensor))
    dense = tensor.is_contiguous() or tensor.permute(*reversed(range(tensor.dim()))).is_contiguous()
    if dense and tensor.numel() > 1:
        assert back.stride() == tensor.stride()
    else:
        assert back.is_contiguous()


def test_received_tensors_are_copies_the_receiver_owns() -> None:
    sent = torch.arange(OUT_OF_BAND_MIN, dtype=torch.float32)  # out of band
    parts = dumps(sent)
    assert len(parts) == 2
    sent.add_(1)  # after the send: the message holds the values at send time
    back = loads(parts)
    assert back[0].item() == 0.0
    back.add_(10)  # writable, and shared with neither the sender nor another receiver
    assert sent[0].item() == 1.0
    assert loads(parts)[0].item() == 0.0


def test_small_tensors_travel_inside_the_pickle() -> None:
    parts = dumps({"w": torch.ones(3), "b": torch.zeros(2, dtype=torch.int64)})
    assert len(parts) == 1
    back = loads(parts)
    assert torch.equal(back["w"], torch.ones(3)) and back["b"].dtype == torch.int64


def test_grad_parameters_conjugates_and_views_round_trip() -> None:
    leaf = torch.randn(5, requires_grad=True)
    param = torch.nn.Parameter(torch.randn(2, 3))
    conj = torch.randn(4, dtype=torch.complex64).conj()
    assert conj.is_conj()
    base = torch.arange(20.0)
    values = loads(dumps([leaf, param, conj, base[5:9], base]))
    assert values[0].requires_grad and values[0].is_leaf
    assert type(values[1]) is torch.nn.Parameter and torch.equal(values[1], param)
    assert not values[2].is_conj() and torch.equal(values[2], conj.resolve_conj())
    assert torch.equal(values[3], base[5:9]) and values[3].storage_offset() == 0


def test_other_tensors_keep_torchs_own_pickling() -> None:
    sparse = torch.eye(3).to_sparse()
    assert torch.equal(loads(dumps(sparse)).to_dense(), torch.eye(3))
    tagged = torch.ones(2)
    tagged.note = "kept"
    assert loads(dumps(tagged)).note == "kept"


class Tensors(Actor):
    @endpoint
    def total(self, tensor: Any) -> float:
        return float(tensor.double().sum())

    @endpoint
    def bump(self, tensor: Any) -> Any:
        tensor.add_(1)  # the receiver's own: writable
        return tensor

    @endpoint
    def describe(self, tensor: Any) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
        return str(tensor.dtype), tuple(tensor.shape), tuple(tensor.stride())


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    # A proc imports this module (and torch with it) on its loop to unpickle Tensors: under
    # load that takes seconds, which a network peer's heartbeat deadline would call a death
    # (the runtime of this test process may be on tcp after other files of its worker).
    with configured(heartbeat_timeout="120s"):
        mesh = this_host().spawn_procs(per_host={"gpus": 1})
        yield mesh
        mesh.stop().get(timeout=30)


@pytest.mark.parametrize("size", [16, OUT_OF_BAND_MIN, 4 * LEND_MIN])
def test_tensors_cross_processes_in_calls_and_results(procs: ProcMesh, size: int) -> None:
    actor = procs.spawn(f"tensors_{size}", Tensors)
    tensor = torch.arange(size // 4, dtype=torch.float32)
    expected = float(tensor.double().sum())
    pending = actor.total.call_one(tensor)
    tensor.add_(1)  # the call took a copy when it was made
    assert pending.get(timeout=30) == expected
    back = actor.bump.call_one(tensor).get(timeout=30)
    assert torch.equal(back, tensor + 1)
    assert tensor[0].item() == 1.0


def test_dtypes_and_layouts_cross_processes(procs: ProcMesh) -> None:
    actor = procs.spawn("tensors_layouts", Tensors)
    channels_last = torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last)
    assert actor.describe.call_one(channels_last).get(timeout=30) == (
        "torch.float32",
        (2, 3, 64, 64),
        tuple(channels_last.stride()),
    )
    half = torch.randn(1024, 512).to(torch.bfloat16)
    assert actor.bump.call_one(half).get(timeout=30).dtype == torch.bfloat16


def test_the_core_never_imports_torch() -> None:
    code = (
        "import sys, monarch.actor, monarch.core\n"
        "from monarch.core._payload._serialize import dumps, loads\n"
        "loads(dumps([b'x' * 10000, {'a': 1}]))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
