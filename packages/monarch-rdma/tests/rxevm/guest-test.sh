#!/bin/bash
# Runs inside the VM (chrooted onto the host's root fs, read-only). Makes rxe0 on a veth pair,
# then runs monarch-rdma's own API over it: rdma_guest.py with the interpreter named in
# /tmp/share/python (the test's own), pyverbs from Debian's python3-pyverbs.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
set -x
uname -r
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 10.9.0.1/24 dev veth0
ip link set veth0 up; ip link set veth1 up
rdma link add rxe0 type rxe netdev veth0
ibv_devices
cd /tmp/share
export HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/tmp/share/monarch-src:/tmp/share/pyverbs-path
timeout 700 "$(cat /tmp/share/python)" rdma_guest.py; echo "rdma_guest rc=$?"
# the ibverbs transport: actor calls whose large parts move by RDMA READ (same boot). Emulated
# (TCG), a first proc's lazy `import torch` holds the GIL ~10 s in dlopen (0.5 s on the host),
# past the default 5 s heartbeat: this job, which tests no fault, waits longer.
MONARCH_HEARTBEAT_TIMEOUT=60 timeout 700 "$(cat /tmp/share/python)" rdma_transport_job.py rdma
echo "transport_job rc=$?"
timeout 400 "$(cat /tmp/share/python)" transport_faults.py; echo "transport_faults rc=$?"
echo "DONE"
