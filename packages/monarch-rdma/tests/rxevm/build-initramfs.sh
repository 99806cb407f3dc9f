#!/bin/bash
# Build into $1 a tiny initramfs that loads rdma_rxe + 9p modules of Debian's kernel, mounts this
# machine's root fs (ro, 9p) and runs /tmp/share/guest-test.sh chrooted into it (from
# ../shared/infra/rxevm, parameterised by output folder). Needs: qemu-system-x86
# linux-image-amd64 busybox-static kmod rdma-core ibverbs-utils python3-pyverbs.
set -euo pipefail
OUT=${1:?output folder}
K=$(ls /lib/modules | grep -E 'amd64$' | sort -V | tail -1)
rm -rf "$OUT/initramfs" && mkdir -p "$OUT"/initramfs/{bin,sbin,mods,proc,sys,dev,newroot}
cd "$OUT"
cp /bin/busybox initramfs/bin/busybox
: > initramfs/modules.txt
for f in $(modprobe -S "$K" -a --show-depends crc32_generic rdma_rxe ib_uverbs rdma_ucm virtio_pci 9pnet_virtio 9p veth \
           | awk '$1=="insmod"{print $2}' | awk '!s[$0]++'); do
  cp "$f" initramfs/mods/; basename "$f" >> initramfs/modules.txt
done
cat > initramfs/sbin/modprobe-chroot <<'EOS'
#!/bin/busybox sh
exec /bin/busybox chroot /newroot /sbin/modprobe "$@"
EOS
cat > initramfs/init <<'EOS'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modules.txt); do insmod /mods/$m || echo "insmod $m FAILED"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro hostroot /newroot || echo "mount hostroot FAILED"
mount -t proc proc /newroot/proc; mount -t sysfs sys /newroot/sys; mount -t devtmpfs dev /newroot/dev
mount -t tmpfs tmp /newroot/tmp; mount -t tmpfs run /newroot/run
mkdir -p /newroot/tmp/share /newroot/dev/shm
mount -t tmpfs shm /newroot/dev/shm
mount -t 9p -o trans=virtio,version=9p2000.L share /newroot/tmp/share || echo "mount share FAILED"
echo /sbin/modprobe-chroot > /proc/sys/kernel/modprobe
echo "GUEST: starting test script"
chroot /newroot /bin/bash /tmp/share/guest-test.sh > /newroot/tmp/share/guest.log 2>&1
echo "GUEST: test script rc=$?"
sync; poweroff -f
EOS
chmod +x initramfs/init initramfs/sbin/modprobe-chroot
(cd initramfs && find . | cpio -o -H newc 2>/dev/null | gzip -1 > ../initramfs.cpio.gz)
echo "$K" > kernel.txt
echo "initramfs for $K: $(wc -l < initramfs/modules.txt) modules"
