#!/bin/bash
# munged for tools/slurm's clusters (one machine: every slurmd shares it and its key).
# Idempotent: a munged already running is left alone; one it starts is appended ("munged PID")
# to $MONARCH_TEST_DAEMONS when set (see tools/suite_daemons.py). Run as root.
set -euo pipefail
mkdir -p /run/munge
chown munge:munge /run/munge
[ -s /etc/munge/munge.key ] || {
  mungekey --create --keyfile /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key
  chmod 600 /etc/munge/munge.key
}
if ! { [ -s /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; }; then
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 100); do [ -s /run/munge/munged.pid ] && break; sleep 0.05; done
  [ -z "${MONARCH_TEST_DAEMONS:-}" ] || echo "munged $(cat /run/munge/munged.pid)" >>"$MONARCH_TEST_DAEMONS"
fi
munge -n | unmunge >/dev/null
