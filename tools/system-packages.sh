#!/usr/bin/env bash
# Debian packages the test suite uses beyond Python: installed when missing and we are root
# (CI and fresh machines); otherwise the tests that need them skip and say why.
set -euo pipefail
# openssh-*: tools/ssh (SSHJob); slurm*, munge: tools/slurm; qemu ... python3-pyverbs: monarch-rdma's soft-RoCE VM
# (packages/monarch-rdma/tests/rxevm); tmux, chromium*: monarch-admin's monarch top and dashboard tests
needed=(iproute2 iptables openssh-server openssh-client slurmctld slurmd slurm-client munge qemu-system-x86 linux-image-amd64
  busybox-static kmod cpio rdma-core ibverbs-utils python3-pyverbs tmux chromium chromium-driver)
missing=()
for pkg in "${needed[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "system-packages: missing ${missing[*]} (not root or no apt-get); tests needing them skip" >&2
  exit 0
fi
echo "system-packages: installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
