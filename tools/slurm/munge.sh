#!/bin/bash
# munged for tools/slurm's clusters (one machine: every slurmd shares it and its key).
# Idempotent: a munged already running is left alone. Run as root.
set -euo pipefail
mkdir -p /run/munge
chown munge:munge /run/munge
[ -s /etc/munge/munge.key ] || {
  mungekey --create --keyfile /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key
  chmod 600 /etc/munge/munge.key
}
[ -s /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null ||
  runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null
