"""The controller runs torch's meta kernels without importing ``torch._dynamo`` (``_metakernels``),
and gives torch's own wrappers back once something imports it. Each check runs in a fresh
interpreter: this session's may have imported dynamo already."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

TIMEOUT = 240

FIRST_OP = """
import json, sys
import torch
from monarch.actor import this_host
from monarch.tensor import fetch_shard

procs = this_host().spawn_procs(per_host={"gpus": 1})
with procs.activate():
    x = torch.arange(6.0).reshape(2, 3)
    y = (x * 2 + 1).t().sigmoid()
shard = fetch_shard(y).get(timeout=120)
local = (torch.arange(6.0).reshape(2, 3) * 2 + 1).t().sigmoid()
print(json.dumps({
    "equal": torch.equal(shard, local),
    "meta": [list(y.shape), list(y.stride()), str(y.dtype)],
    "local": [list(local.shape), list(local.stride()), str(local.dtype)],
    "dynamo": "torch._dynamo" in sys.modules,
}))
procs.stop().get(timeout=60)
"""

GIVE_BACK = """
import json, sys
import torch
from monarch.tensor import _metakernels

_metakernels.spare_dynamo()
spared = list(_metakernels._spared)
before = all(vars(fn).get("__dynamo_disable") is fn for fn in spared)
import torch._dynamo
after = [vars(fn).get("__dynamo_disable") for fn in spared]
x = torch.empty(4, 3, device="meta")
y = x + 1  # torch's own wrapper: builds and caches dynamo's disabled function
print(json.dumps({
    "spared": len(spared),
    "before": before,
    "given_back": all(value is None for value in after),
    "hook_left": any(type(f).__name__ == "_GiveBack" for f in sys.meta_path),
    "shape": list(y.shape),
}))
"""


def run(script: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_first_elementwise_ops_import_no_dynamo_and_keep_their_values() -> None:
    result = run(FIRST_OP)
    assert result["equal"] is True
    assert result["meta"] == result["local"]
    assert result["dynamo"] is False


def test_importing_dynamo_gives_torch_its_wrappers_back() -> None:
    result = run(GIVE_BACK)
    assert isinstance(result["spared"], int) and result["spared"] > 50
    assert result["before"] is True
    assert result["given_back"] is True
    assert result["hook_left"] is False
    assert result["shape"] == [4, 3]
