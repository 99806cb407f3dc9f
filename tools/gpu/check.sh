#!/bin/bash
# On a lent GPU machine (the device tool), from the repo root, with .whl carried (tools/gpu/wheels.sh):
# installs the wheels, then runs each "NAME:SECONDS:PYTEST ARGS" given, its log in $OUT/NAME.log.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 - <<'PY'
import torch, pytest, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(), "pytest", pytest.__version__)
import monarch.actor, monarch.tensor, monarch.rdma
print("monarch imports ok")
PY
PYT="python3 -m pytest -o minversion=1 -p no:cacheprovider --timeout 150"
for spec in "$@"; do
  name=$(echo "$spec" | cut -d: -f1); secs=$(echo "$spec" | cut -d: -f2); args=$(echo "$spec" | cut -d: -f3-)
  echo "=== $name ($secs s): $args"
  timeout $secs $PYT $args > $OUT/$name.log 2>&1
  echo "rc $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/$name.log | tail -25
done
