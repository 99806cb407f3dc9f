#!/bin/bash
# tcp29's A/B: main (base, `git archive main` unpacked at /tmp/tcp29-base, on PYTHONPATH)
# and this branch (ours), alternating N times; one JSON line per run of
# benchmarks/rdma_cost_bench.py (the TCP plane's MiB/s and CPU per GiB, tagged/untagged).
cd "$(dirname "$0")/../.."
PY=$(python3 -m hatch env find default)/bin/python
BPP=$(ls -d /tmp/tcp29-base/packages/*/src | tr '\n' ':')
for i in $(seq 1 "${1:-6}"); do
  echo "{\"side\": \"base\", \"i\": $i, \"run\": $(PYTHONPATH=$BPP timeout 300 $PY benchmarks/rdma_cost_bench.py 2>/dev/null | tail -1)}"
  echo "{\"side\": \"ours\", \"i\": $i, \"run\": $(timeout 300 $PY benchmarks/rdma_cost_bench.py 2>/dev/null | tail -1)}"
done
