#!/bin/bash
# A real one-node Slurm cluster on this machine (no systemd), for monarch-jobs' tests:
# munged, slurmctld and slurmd started by hand with slurm.conf (NodeName=localhost, CPUs=2,
# partition debug). Idempotent: daemons already running are left alone. Each one it starts
# is appended ("NAME PID") to $MONARCH_TEST_DAEMONS when set, for the test session to stop
# when it ends (tools/suite_daemons.py). Run as root.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
install -m 644 "$HERE/slurm.conf" /etc/slurm/slurm.conf
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
bash "$HERE/munge.sh"
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
started=()
record() {
  local daemon
  for daemon in "${started[@]}"; do
    [ -z "${MONARCH_TEST_DAEMONS:-}" ] || [ ! -s "/run/$daemon.pid" ] ||
      echo "$daemon $(cat "/run/$daemon.pid")" >>"$MONARCH_TEST_DAEMONS"
  done
}
trap record EXIT
running /run/slurmctld.pid || { slurmctld && started+=(slurmctld); }
running /run/slurmd.pid || { slurmd -N localhost && started+=(slurmd); }
for _ in $(seq 1 120); do
  sinfo -h -N -o '%t' 2>/dev/null | grep -Eq '^(idle|mix|alloc)' && exit 0
  sleep 0.5
done
echo "slurm did not become ready" >&2
sinfo -N -l >&2 || true
exit 1
