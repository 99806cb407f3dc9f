#!/bin/bash
# A real sshd for monarch-jobs' SSHJob tests: start.sh ADDRESS PIDFILE [NETNS]
# listens at ADDRESS (e.g. 10.0.0.2:22) inside network namespace NETNS (else here), with
# sshd_config beside this script. Makes the host key and the client key on first use:
# /etc/ssh/monarch-test/id_ci is the private key a client logs in as root with.
# Returns once sshd has written its pid file (it has bound ADDRESS then). Run as root.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ADDRESS=$1 PIDFILE=$2 NETNS=${3:-}
KEYS=/etc/ssh/monarch-test
mkdir -p "$KEYS" /run/sshd
chmod 700 "$KEYS"
[ -s "$KEYS/hostkey" ] || ssh-keygen -q -t ed25519 -N '' -f "$KEYS/hostkey"
[ -s "$KEYS/id_ci" ] || ssh-keygen -q -t ed25519 -N '' -C monarch-ci -f "$KEYS/id_ci"
rm -f "$PIDFILE"
run=()
[ -z "$NETNS" ] || run=(ip netns exec "$NETNS")
"${run[@]}" /usr/sbin/sshd -f "$HERE/sshd_config" -o "ListenAddress=$ADDRESS" -o "PidFile=$PIDFILE"
for _ in $(seq 1 100); do
  [ -s "$PIDFILE" ] && exit 0
  sleep 0.05
done
echo "sshd at $ADDRESS did not write $PIDFILE" >&2
exit 1
