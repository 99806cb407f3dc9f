#!/usr/bin/env bash
# Debian packages the test suite uses beyond Python, installed when missing and we are root
# (CI and fresh machines); it says what and why before installing. Otherwise, or with
# MONARCH_SKIP_SYSTEM_TESTS=1 (nothing installed, no daemon started), the tests that need
# them skip and say why. `--list` prints the table below and exits.
set -euo pipefail

# package: what needs it
why=(
  "iproute2: network-namespace hosts (two-host, Slurm and SSH tests)"
  "iptables: dropped packets between namespace hosts (monarch-core's fault tests)"
  "openssh-server: an sshd per namespace host (monarch-jobs' SSHJob)"
  "openssh-client: ssh for SSHJob"
  "slurmctld: a real Slurm cluster (monarch-jobs' SlurmJob), started for the suite, stopped after"
  "slurmd: its nodes"
  "slurm-client: sbatch, squeue, scancel"
  "munge: Slurm's authentication daemon (munged), started for the suite, stopped after"
  "qemu-system-x86: a VM with the soft-RoCE driver (monarch-rdma's verbs tests)"
  "linux-image-amd64: that VM's kernel (rdma_rxe)"
  "busybox-static: that VM's init and tools"
  "kmod: loading rdma_rxe in that VM"
  "cpio: building that VM's initramfs"
  "rdma-core: libibverbs and the rxe provider"
  "ibverbs-utils: ibv_devices, for the VM's checks"
  "python3-pyverbs: pyverbs, for monarch-rdma's verbs transport"
  "tmux: a terminal for monarch top's tests (monarch-admin)"
  "chromium: the dashboard's browser test (monarch-admin)"
  "chromium-driver: selenium's driver for it"
)

if [ "${1:-}" = --list ]; then
  printf '%s\n' "${why[@]}"
  exit 0
fi
if [ "${MONARCH_SKIP_SYSTEM_TESTS:-}" = 1 ]; then
  echo "system-packages: MONARCH_SKIP_SYSTEM_TESTS=1: nothing installed; the tests that need" \
    "these packages (or start system daemons) skip" >&2
  exit 0
fi
missing=()
for line in "${why[@]}"; do
  pkg=${line%%:*}
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$line")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "system-packages: missing ${missing[*]%%:*} (not root or no apt-get); tests needing them skip" >&2
  exit 0
fi
{
  echo "system-packages: installing ${#missing[@]} Debian packages some tests need (apt-get, as root):"
  printf '  %s\n' "${missing[@]}"
  echo "  (MONARCH_SKIP_SYSTEM_TESTS=1 installs none and skips those tests instead)"
} >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]%%:*}" >/dev/null
