#!/bin/bash
# A real multi-node Slurm cluster in network-namespace hosts (as shared/infra/slurm and
# shared/infra/netns): start-netns.sh FOLDER CONTROLLER NODE...
# CONTROLLER and each NODE are network namespaces whose eth0 has an IPv4 address (the
# tests' make_hosts). slurmctld runs in CONTROLLER, one slurmd per NODE (its node name is
# the namespace's); config (FOLDER/slurm.conf: partition debug, 2 CPUs a node), state,
# pid and log files all live in FOLDER, so that the cluster is apart from any other on
# this machine (the one-node one of start.sh included). Clients use it with
# SLURM_CONF=FOLDER/slurm.conf from inside a namespace (the controller's is the login
# node). Returns once every node is idle. Ending it: kill the namespaces' processes.
# Run as root.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FOLDER=$(realpath "$1") CONTROLLER=$2
shift 2
address() { ip -n "$1" -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1; }
mkdir -p "$FOLDER/state"
bash "$HERE/munge.sh"
nodes=()
{
  # The controller must be named as this machine is (slurmctld checks its host name);
  # its address is its namespace's.
  echo "ClusterName=netns"
  echo "SlurmctldHost=$(hostname -s)($(address "$CONTROLLER"))"
  grep -Ev '^(#|ClusterName|SlurmctldHost|StateSaveLocation|Slurm.*(PidFile|LogFile|SpoolDir)|NodeName|PartitionName)=' \
    "$HERE/slurm.conf"
  echo "StateSaveLocation=$FOLDER/state"
  echo "SlurmctldPidFile=$FOLDER/slurmctld.pid"
  echo "SlurmctldLogFile=$FOLDER/slurmctld.log"
  echo "SlurmdSpoolDir=$FOLDER/spool-%n"
  echo "SlurmdPidFile=$FOLDER/slurmd-%n.pid"
  echo "SlurmdLogFile=$FOLDER/slurmd-%n.log"
  for node in "$@"; do
    echo "NodeName=$node NodeAddr=$(address "$node") CPUs=2 State=UNKNOWN"
    nodes+=("$node")
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP"
} >"$FOLDER/slurm.conf"
export SLURM_CONF="$FOLDER/slurm.conf"
# nsenter, not ip netns exec: slurmd wants the machine's /sys (ip netns exec remounts it).
nsenter --net="/run/netns/$CONTROLLER" slurmctld -f "$SLURM_CONF"
for node in "$@"; do
  nsenter --net="/run/netns/$node" slurmd -f "$SLURM_CONF" -N "$node"
done
for _ in $(seq 1 120); do
  idle=$(ip netns exec "$CONTROLLER" sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle' || true)
  [ "$idle" = "$#" ] && exit 0
  sleep 0.5
done
echo "the netns Slurm cluster did not become ready" >&2
ip netns exec "$CONTROLLER" sinfo -N -l >&2 || true
tail -n 20 "$FOLDER/slurmctld.log" >&2 || true
exit 1
