#!/bin/bash
# Test hosts in network namespaces (as shared/infra/netns), apart from anyone else's:
#   hosts.sh up PREFIX N    namespaces PREFIXh1..PREFIXhN at 10.0.0.1..N/24 (eth0), on a
#                           bridge in namespace PREFIXsw; prints their names, one a line
#   hosts.sh down PREFIX    kills every process left in the PREFIX namespaces, deletes them
# The root namespace never routes 10.0.0.0/24 (a guard route, added once): a client started
# outside the namespaces by mistake fails at once instead of leaving the machine. Run as root.
set -euo pipefail
case "${1:-}" in
up)
  PREFIX=$2 N=$3
  ip route show type unreachable | grep -q '^unreachable 10.0.0.0/24' ||
    ip route add unreachable 10.0.0.0/24
  ip netns add "${PREFIX}sw"
  ip -n "${PREFIX}sw" link add br0 type bridge
  ip -n "${PREFIX}sw" link set br0 up
  for i in $(seq 1 "$N"); do
    host="${PREFIX}h$i" veth="v$PREFIX$i" port="p$PREFIX$i"
    ip netns add "$host"
    ip link add "$veth" type veth peer name "$port"
    ip link set "$veth" netns "$host"
    ip link set "$port" netns "${PREFIX}sw"
    ip -n "${PREFIX}sw" link set "$port" master br0
    ip -n "${PREFIX}sw" link set "$port" up
    ip -n "$host" link set "$veth" name eth0
    ip -n "$host" addr add "10.0.0.$i/24" dev eth0
    ip -n "$host" link set eth0 up
    ip -n "$host" link set lo up
    echo "$host"
  done
  ;;
down)
  PREFIX=$2
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${PREFIX}(sw|h[0-9]+)$" || true); do
    for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  ;;
*)
  echo "usage: hosts.sh up PREFIX N | down PREFIX" >&2
  exit 2
  ;;
esac
