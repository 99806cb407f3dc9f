#!/bin/bash
cd /work/wt/rdma29
PY=$(python3 -m hatch env find default)/bin/python
BPP=$(ls -d /tmp/rdma29-base/packages/*/src | tr '\n' ':')
N=$1
for i in $(seq 1 $N); do
  echo "{\"side\": \"base\", \"i\": $i, \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"tcp\": $(PYTHONPATH=$BPP timeout 200 $PY /tmp/rdma29_tcpcpu.py 16 20 2>/dev/null | tail -1), \"memory\": $(PYTHONPATH=$BPP timeout 200 $PY /tmp/rdma29_w3.py 2>/dev/null | tail -1)}"
  echo "{\"side\": \"ours\", \"i\": $i, \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"tcp\": $(timeout 200 $PY /tmp/rdma29_tcpcpu.py 16 20 2>/dev/null | tail -1), \"memory\": $(timeout 200 $PY /tmp/rdma29_w3.py 2>/dev/null | tail -1)}"
done
