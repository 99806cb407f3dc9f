#!/bin/bash
# Boot Debian's kernel (it has rdma_rxe) under QEMU with the initramfs built in $1; the guest
# chroots into this machine's root fs (read-only 9p) and runs $2/guest-test.sh (the share
# folder, writable). No NIC (-nic none): nothing leaves the VM. -cpu max: the guest runs this
# machine's own binaries (numpy's OpenBLAS among them), which may use any instruction it has.
set -euo pipefail
OUT=${1:?folder of build-initramfs.sh}
SHARE=${2:?share folder}
K=$(cat "$OUT/kernel.txt")
ACCEL=${ACCEL:-tcg}
exec timeout "${VM_TIMEOUT:-560}" qemu-system-x86_64 -accel "$ACCEL" -cpu max -m 2048 -smp 2 -nographic -no-reboot -nic none \
 -kernel "/boot/vmlinuz-$K" -initrd "$OUT/initramfs.cpio.gz" -append "console=ttyS0 panic=-1 loglevel=4" \
 -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
 -virtfs local,path="$SHARE",mount_tag=share,security_model=none
