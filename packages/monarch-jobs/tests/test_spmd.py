"""monarch.spmd: torchrun's environment from a proc's point (a property over every mesh
shape), set in real procs, and a real torch.distributed (gloo) script run twice on the same
procs of a ProcessJob's two hosts."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jobkit import Script

from monarch.actor import Actor, endpoint
from monarch.core import ProcMesh
from monarch.core.testing import alive
from monarch.job import ProcessJob
from monarch.job.spmd import TorchRun, parse_torchrun, serve
from monarch.spmd import SPMDActor, setup_torch_elastic_env
from monarch.spmd._env import elastic_env

TRAIN = Path(__file__).with_name("spmd_train.py")
TIMEOUT = 120

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed (pkg-jobs)"
)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_every_proc_gets_a_distinct_rank_consistent_with_its_machine(sizes: list[int]) -> None:
    dims = {f"d{i}": size for i, size in enumerate(sizes)}
    world = math.prod(sizes)
    ranks = []
    for coords in itertools.product(*(range(size) for size in sizes)):
        env = elastic_env(dict(zip(dims, coords, strict=True)), dims, "10.0.0.1", 29500)
        rank, local = int(env["RANK"]), int(env["LOCAL_RANK"])
        ranks.append(rank)
        assert env["WORLD_SIZE"] == str(world) and env["LOCAL_WORLD_SIZE"] == str(sizes[-1])
        assert local == coords[-1]
        assert int(env["GROUP_RANK"]) * sizes[-1] + local == rank
        assert int(env["GROUP_WORLD_SIZE"]) * sizes[-1] == world
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert ranks == list(range(world))  # row-major, each once


def test_bad_points_are_refused() -> None:
    with pytest.raises(ValueError, match="does not match"):
        elastic_env({"gpus": 0}, {"hosts": 1, "gpus": 1}, "h", 1)
    with pytest.raises(ValueError, match="outside"):
        elastic_env({"gpus": 2}, {"gpus": 2}, "h", 1)
    with pytest.raises(ValueError, match="port number"):
        elastic_env({"gpus": 0}, {"gpus": 2}, "h", 0)


class Env(Actor):
    @endpoint
    def env(self) -> dict[str, str]:
        import os

        return {k: v for k, v in os.environ.items() if k in ("RANK", "LOCAL_RANK", "MASTER_ADDR")}


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    # The procs import this module (Env's, by reference), and it imports jobkit.
    job = ProcessJob({"hosts": 2}, env={"PYTHONPATH": str(Path(__file__).parent)})
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 2})
        yield procs
        procs.stop().get(timeout=TIMEOUT)
    finally:
        job.kill()


def test_setup_torch_elastic_env_sets_each_proc_s_rank(procs: ProcMesh) -> None:
    setup_torch_elastic_env(procs, use_ipaddr=True)
    seen = procs.spawn("env", Env).env.call().get(timeout=TIMEOUT)
    values = sorted(seen.values(), key=lambda env: int(env["RANK"]))
    assert [(v["RANK"], v["LOCAL_RANK"]) for v in values] == [
        ("0", "0"),
        ("1", "1"),
        ("2", "0"),
        ("3", "1"),
    ]
    assert len({v["MASTER_ADDR"] for v in values}) == 1


@needs_torch
def test_a_gloo_script_runs_twice_on_the_same_procs(procs: ProcMesh, tmp_path: Path) -> None:
    actors = procs.spawn("spmd", SPMDActor)
    first = actors.slice(hosts=0, gpus=0)
    for run in ("first", "second"):  # again, without new procs: a fresh rendezvous port
        addr, port = first.get_host_port.call_one(True).get(timeout=TIMEOUT)
        done = actors.main.call(addr, port, [str(TRAIN), str(tmp_path), run]).get(TIMEOUT)
        assert list(done.values()) == [True] * 4
    for run in ("first", "second"):
        results = [json.loads((tmp_path / f"{run}-rank{r}.jsonl").read_text()) for r in range(4)]
        assert [r["sum"] for r in results] == [6.0] * 4  # 0 + 1 + 2 + 3, over gloo
        assert [r["env"]["LOCAL_RANK"] for r in results] == ["0", "1", "0", "1"]
        assert {r["name"] for r in results} == {"__main__"}


def test_main_refuses_no_script(procs: ProcMesh) -> None:
    actors = procs.spawn("spmd_bad", SPMDActor)
    with pytest.raises(Exception, match="script_args must name a script"):
        actors.main.call("127.0.0.1", 1, []).get(timeout=TIMEOUT)


# -- serve(["torchrun", ...]): an SPMDJob ------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["torchrun", "--nnodes=2", "--nproc-per-node=4", "train.py", "--lr", "0.1"],
            TorchRun(2, 4, ("train.py", "--lr", "0.1")),
        ),
        (
            ["torchrun", "--nproc_per_node", "2", "--rdzv-backend", "c10d", "-m", "pkg.t", "x"],
            TorchRun(1, 2, ("-m", "pkg.t", "x")),
        ),
        (
            ["python", "-m", "torch.distributed.run", "--standalone", "--nnodes=1:3", "t.py"],
            TorchRun(3, 1, ("t.py",)),
        ),
    ],
)
def test_torchrun_command_lines_are_read(argv: list[str], expected: TorchRun) -> None:
    assert parse_torchrun(argv) == expected


words = st.from_regex(r"[a-z0-9_./=]{1,8}", fullmatch=True)


@given(
    st.integers(1, 64),
    st.integers(1, 16),
    st.booleans(),
    words.filter(lambda w: not w.startswith("-")),
    st.lists(st.one_of(words, st.just("--lr"), st.just("-m"))),
    st.sampled_from(["--nnodes={}", "--nnodes=1:{}"]),
    st.sampled_from(["--nproc-per-node={}", "--nproc_per_node={}"]),
)
def test_what_torchrun_is_told_is_read_back(
    nnodes: int,
    per_node: int,
    module: bool,
    script: str,
    args: list[str],
    nnodes_flag: str,
    per_node_flag: str,
) -> None:
    head = ["-m", script] if module else [script]
    argv = ["torchrun", nnodes_flag.format(nnodes), per_node_flag.format(per_node), *head, *args]
    assert parse_torchrun(argv) == TorchRun(nnodes, per_node, (*head, *args))


def test_bad_torchrun_command_lines_and_schedulers_are_refused() -> None:
    with pytest.raises(ValueError, match="not a torchrun command line"):
        parse_torchrun(["python", "train.py"])
    with pytest.raises(ValueError, match="--no-python"):
        parse_torchrun(["torchrun", "--no-python", "train.sh"])
    with pytest.raises(ValueError, match="--nproc-per-node must be a positive number"):
        parse_torchrun(["torchrun", "--nproc-per-node=gpu", "train.py"])
    with pytest.raises(ValueError, match="cannot read"):
        parse_torchrun(["torchrun", "--nnodes=2"])
    with pytest.raises(ValueError, match=r"mast_conda.*local, local_cwd, slurm, ssh, kube"):
        serve(["torchrun", "train.py"])
    with pytest.raises(ValueError, match="names 1 hosts for --nnodes=2"):
        serve(["torchrun", "--nnodes=2", "t.py"], scheduler="ssh", scheduler_cfg={"hosts": ["a"]})
    with pytest.raises(TypeError, match="list of strings"):
        serve("torchrun train.py")


@needs_torch
def test_serve_runs_the_script_again_on_the_same_hosts_and_job_load_brings_it_back(
    tmp_path: Path,
) -> None:
    script = Script(tmp_path)
    out = str(tmp_path)
    first, _ = script("spmd", str(TRAIN), out)  # serve(...), run_spmd() twice, saved
    assert first == {"runs": 2}
    again, said = script("spmd-again")  # another process: job_load(), run_spmd()
    assert again == {"runs": 1} and "Job is running, returning current state" in said
    runs = [
        [json.loads(line) for line in (tmp_path / f"t-rank{r}.jsonl").read_text().splitlines()]
        for r in range(4)
    ]
    assert [len(lines) for lines in runs] == [3] * 4
    assert {line["sum"] for lines in runs for line in lines} == {6.0}
    workers = {line["worker"] for lines in runs for line in lines}
    assert len(workers) == 2  # the same two hosts every run: no new provisioning
    script("kill")
    assert not any(map(alive, workers))


LOCAL_CWD = """
import sys
from monarch.job.spmd import serve

if sys.argv[1] == "list":  # the 0.3 release notes' snippet, a relative script path
    job = serve(["torchrun", "--nproc-per-node=2", "--standalone", "train.py", ".", "l"],
                scheduler="local_cwd")
else:  # upstream's DDP SPMD example: a torchx AppDef
    from torchx import specs

    role = specs.Role(
        name="trainer", image="", entrypoint="workspace/entrypoint.sh",
        args=["torchrun", "--nnodes=1", "--nproc-per-node=2", "train.py", ".", "a"],
        num_replicas=2,
    )
    job = serve(specs.AppDef(name="ddp", roles=[role]), scheduler="local_cwd")
try:
    job.run_spmd()
finally:
    job.kill()
"""


@needs_torch
@pytest.mark.parametrize("kind", ["list", "appdef"])
def test_local_cwd_runs_the_script_in_the_current_directory(kind: str, tmp_path: Path) -> None:
    if kind == "appdef" and importlib.util.find_spec("torchx") is None:
        pytest.skip("torchx is not installed (monarch-jobs[torchx])")
    (tmp_path / "train.py").write_text(TRAIN.read_text())
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_CWD, kind],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tag = kind[0]
    hosts = 1 if kind == "list" else 2
    lines = [json.loads((tmp_path / f"{tag}-rank{r}.jsonl").read_text()) for r in range(2 * hosts)]
    assert {line["sum"] for line in lines} == {float(sum(range(2 * hosts)))}
    assert len({line["worker"] for line in lines}) == hosts
