#!/bin/bash
# A real one-node Slurm cluster on this machine (no systemd), for monarch-jobs' tests:
# munged, slurmctld and slurmd started by hand with slurm.conf (NodeName=localhost, CPUs=2,
# partition debug). Idempotent: daemons already running are left alone. Run as root.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
install -m 644 "$HERE/slurm.conf" /etc/slurm/slurm.conf
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
bash "$HERE/munge.sh"
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
running /run/slurmctld.pid || slurmctld
running /run/slurmd.pid || slurmd -N localhost
for _ in $(seq 1 120); do
  sinfo -h -N -o '%t' 2>/dev/null | grep -Eq '^(idle|mix|alloc)' && exit 0
  sleep 0.5
done
echo "slurm did not become ready" >&2
sinfo -N -l >&2 || true
exit 1
