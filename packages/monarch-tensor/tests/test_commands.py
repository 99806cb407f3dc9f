"""The engine's commands: a tagged union of msgspec Structs that survives the wire whole, says
what each command reads and writes, and a worker refuses anything else, saying what it got."""

from __future__ import annotations

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import ProcMesh
from monarch.core import dumps, loads
from monarch.tensor import fetch_shard
from monarch.tensor._client import client_for
from monarch.tensor._commands import (
    KINDS,
    Borrowed,
    Call,
    Command,
    Delete,
    Lend,
    Op,
    Pickled,
    Recv,
    Reduce,
    Ref,
    Send,
    Shaped,
    UseStream,
    Wait,
    _Base,
    decode,
)
from monarch.tensor._errors import CommandError

WAIT_S = 60.0

ids = st.integers(0, 2**40)
id_tuples = st.lists(ids, max_size=4).map(tuple)
keys = st.text(max_size=12)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), keys
)
refs = ids.map(Ref)
leaves = st.one_of(scalars, refs)
args = st.lists(st.one_of(leaves, st.lists(leaves, max_size=3).map(tuple)), max_size=4).map(tuple)
kwargs = st.dictionaries(st.text(min_size=1, max_size=6), leaves, max_size=3)
pickled = st.builds(Pickled, keys, st.lists(st.binary(max_size=16), min_size=1, max_size=2))
shapes = st.lists(st.tuples(id_tuples, st.sampled_from(["float32", "int64"])), max_size=3)
funcs = st.one_of(
    st.sampled_from([torch.add, torch.neg, torch.Tensor.add_, torch.matmul]),
    pickled,
    st.builds(Shaped, pickled, shapes),
)
stores = st.tuples(st.sampled_from(["127.0.0.1", "10.0.0.2"]), st.integers(1, 65535))
plans = st.dictionaries(
    st.integers(0, 7), st.lists(st.dictionaries(st.sampled_from(["gpus", "hosts"]), ids))
)

plain: st.SearchStrategy[Command] = st.one_of(
    st.builds(Borrowed, ids, ids),
    st.builds(
        Reduce,
        ids,
        ids,
        id_tuples,
        st.sampled_from(["sum", "avg", "max", "min", "stack"]),
        st.booleans(),
        stores,
    ),
    st.builds(Recv, ids, keys),
    st.builds(Lend, ids, keys),
    st.builds(Delete, id_tuples),
    st.builds(UseStream, ids),
    st.builds(Wait, ids),
)
"""The commands made of msgspec's own types only (``Op``, ``Call`` and ``Send`` carry
functions, user values and an actor mesh, which travel in the core's pickle)."""

Plain = Borrowed | Reduce | Recv | Lend | Delete | UseStream | Wait

commands: st.SearchStrategy[Command] = st.one_of(
    plain,
    st.builds(Op, funcs, args, kwargs, st.booleans(), id_tuples),
    st.builds(Call, pickled, args, kwargs, st.booleans(), ids),
)


@settings(max_examples=200, deadline=None)
@given(batch=st.lists(commands, max_size=8))
def test_a_batch_survives_the_wire_whole(batch: list[Command]) -> None:
    """The core's pickle (how a batch travels) then the worker's ``decode`` give back the
    very commands, each of its kind."""
    back = decode(loads(dumps(batch)))
    assert back == batch
    assert [type(c) for c in back] == [type(c) for c in batch]


@settings(max_examples=200, deadline=None)
@given(command=plain)
def test_the_union_is_tagged(command: Command) -> None:
    """Each command encodes as its kind's name then its fields, and msgspec decodes the
    union back to that kind by the name."""
    encoded = msgspec.msgpack.encode(command)
    assert msgspec.msgpack.decode(encoded)[0] == type(command).__name__
    assert msgspec.msgpack.decode(encoded, type=Plain) == command


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(source=ids, key=keys, plan=plans)
def test_a_send_carries_its_destination_mesh(
    procs: ProcMesh, source: int, key: str, plan: dict[int, list[dict[str, int]]]
) -> None:
    inbox = client_for(procs).inbox()
    back = decode(loads(dumps([Send(source, key, plan, inbox)])))[0]
    assert isinstance(back, Send)
    assert (back.source, back.key, back.plan) == (source, key, plan)
    assert back.inbox._name == inbox._name


@given(out=id_tuples, a=ids, b=ids, scalar=scalars)
def test_each_command_says_what_it_reads_and_writes(
    out: tuple[int, ...], a: int, b: int, scalar: object
) -> None:
    op = Op(torch.add, (Ref(a), [scalar, Ref(b)]), {"alpha": scalar}, True, out)
    assert (op.reads(), op.writes()) == ((a, b), out)
    call = Call(Pickled("f", [b""]), (), {"x": Ref(b)}, False, a)
    assert (call.reads(), call.writes()) == ((b,), (a,))
    assert (Borrowed(a, b).reads(), Borrowed(a, b).writes()) == ((b,), (a,))
    reduce = Reduce(a, b, (0,), "sum", False, ("h", 1))
    assert (reduce.reads(), reduce.writes()) == ((b,), (a,))
    assert (Recv(a, "k").reads(), Recv(a, "k").writes()) == ((), (a,))
    assert (Lend(a, "k").reads(), Lend(a, "k").writes()) == ((a,), ())
    for routing in (Delete(out), UseStream(a), Wait(a)):
        assert (routing.reads(), routing.writes()) == ((), ())


def test_every_kind_is_in_the_union() -> None:
    assert {kind.__name__ for kind in KINDS} == {
        "Op",
        "Call",
        "Borrowed",
        "Reduce",
        "Send",
        "Recv",
        "Lend",
        "Delete",
        "UseStream",
        "Wait",
    }


@pytest.mark.parametrize(
    ("batch", "says"),
    [
        ((Delete((1,)),), "a list of commands, not tuple"),
        ([(0, (1,), torch.add, (), {}, True)], "item 0 of a tensor-engine batch is a tuple"),
        ([Wait(0), {"Op": 1}], "item 1 of a tensor-engine batch is a dict"),
        ([Ref(3)], "item 0 of a tensor-engine batch is a Ref"),
        ([Lend(1, "k"), _Base()], "item 1 of a tensor-engine batch is a _Base"),
    ],
)
def test_anything_else_is_refused_saying_what_it_is(batch: object, says: str) -> None:
    with pytest.raises(CommandError, match=says):
        decode(batch)


def test_a_worker_refuses_a_malformed_batch_and_goes_on(procs: ProcMesh) -> None:
    """A batch of old-style tuples reaches a real worker: the call fails with the worker's
    ``CommandError`` message, and the worker still runs the next batches."""
    client = client_for(procs)
    with pytest.raises(Exception, match="not one of the commands") as raised:
        client.workers().run.call([(0, (1,), torch.add, (), {}, True)]).get(timeout=WAIT_S)
    assert "CommandError" in str(raised.value)
    with procs.activate():
        t = torch.ones(2) + 1
    assert fetch_shard(t, gpus=1).get(timeout=WAIT_S).tolist() == [2.0, 2.0]
