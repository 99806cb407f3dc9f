#!/bin/bash
# usage: rdma29_ab.sh TAG N ARGS... ; alternates base (main) and ours
cd /work/wt/rdma29
PY=$(python3 -m hatch env find default)/bin/python
TAG=$1; N=$2; shift 2
BASEPP=$(ls -d /tmp/rdma29-base/packages/*/src | tr '\n' ':')
for i in $(seq 1 $N); do
  PYTHONPATH=$BASEPP $PY benchmarks/rdma_bench.py "$@" --out /tmp/rdma29_ab_${TAG}_base_$i.json > /tmp/rdma29_ab_${TAG}_base_$i.log 2>&1
  $PY benchmarks/rdma_bench.py "$@" --out /tmp/rdma29_ab_${TAG}_ours_$i.json > /tmp/rdma29_ab_${TAG}_ours_$i.log 2>&1
done
echo done
