#!/usr/bin/env bash
# The NVMe lab: boots a throwaway QEMU guest (software emulation, KVM is not usable here) whose NVMe
# disks carry EBS-style serials, runs ebs-node-agent with the ebs backend inside and drives
# stage -> publish -> write (and a metrics scrape whose EBS statistics read, an NVMe admin ioctl,
# QEMU's controller refuses) -> unpublish -> unstage -> restage, a wrong-serial refusal, a missing
# volume and a hot-plugged one through `ebs-node-agent client`; then, with a second agent on the
# loop backend, grows a mounted ext4 online while a writer appends (the guest's root has
# CAP_SYS_RESOURCE, which the host running the suite may lack). Prints the guest's LAB lines and
# exits 0 only when every step passed (3: a prerequisite is missing).
#
# Usage: tests/nvme-lab/run.sh [AGENT_BINARY]   (default: target/debug/ebs-node-agent)
# Env:   LAB_TIMEOUT   seconds the guest may run (default 180)
#        LAB_MULTIPATH Y: native NVMe multipath layout (QEMU sets the multipath bit), N: plain
#        LAB_CACHE     where the fetched kernel is kept (default target/nvme-lab)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
agent=${1:-$repo/target/debug/ebs-node-agent}
cache=${LAB_CACHE:-$repo/target/nvme-lab}
timeout_s=${LAB_TIMEOUT:-180}
multipath=${LAB_MULTIPATH:-Y}
busybox=/bin/busybox
lab=nvme-lab
. "$here/lib.sh"
check_prerequisites

# The guest kernel: the current Debian cloud image (NVMe and ext4 built in), fetched once.
kernel=$(ls "$cache"/kernel/boot/vmlinuz-* 2>/dev/null | head -1 || true)
if [[ -z $kernel || ! -f $cache/kernel/loop.ko ]]; then
  cloud_kernel_package
  dl=$(mktemp -d /tmp/ebs-nvme-kernel.XXXXXX)
  chmod 755 "$dl"
  (cd "$dl" && apt-get download -q "$pkg" >/dev/null) || { rm -rf "$dl"; missing "apt-get download $pkg failed"; }
  rm -rf "$cache/kernel.tmp" && mkdir -p "$cache/kernel.tmp"
  dpkg -x "$dl"/*.deb "$cache/kernel.tmp"
  # Modules are not needed (~100 MB), except loop, which the online-grow scenario uses.
  cp "$cache"/kernel.tmp/lib/modules/*/kernel/drivers/block/loop.ko "$cache/kernel.tmp/loop.ko" ||
    { rm -rf "$dl"; missing "no loop.ko in $pkg"; }
  rm -rf "$dl" "$cache/kernel.tmp/lib" "$cache/kernel.tmp/usr"
  rm -rf "$cache/kernel" && mv "$cache/kernel.tmp" "$cache/kernel"
  kernel=$(ls "$cache"/kernel/boot/vmlinuz-* | head -1)
fi
config=${kernel/vmlinuz-/config-}
grep -q '^CONFIG_BLK_DEV_NVME=y' "$config" || missing "$kernel does not have NVMe built in"

# The initramfs: busybox, the agent and the ext4 tools with their shared libraries.
new_tree ebs-nvme-lab
cp "$cache/kernel/loop.ko" "$root/lib/loop.ko"
install -m 755 "$here/init.sh" "$root/init"
install_agent "$agent"
install_tools mke2fs e2fsck resize2fs
cat >"$root/lab.env" <<ENV
MODEL='QEMU NVMe Ctrl'
V1=vol-0123456789abcdef0
V2=vol-0fedcba9876543210
V3=vol-0aaaaaaaaaaaaaaaa
ENV
pack_initrd

# Three EBS-style volumes; each guest needs its own images (QEMU locks them).
# The first sits in an NVMe subsystem, which makes QEMU set the multi-controller bit: with
# nvme_core.multipath=Y the kernel shows it the native-multipath way (head nvme0n1 under the
# subsystem, hidden path nvme0c0n1), the others the plain way EBS shows volumes.
drives=(-device nvme-subsys,id=subsys0,nqn=nqn.2026-11.io.ebs-node-agent:lab)
for serial in vol0123456789abcdef0 vol0fedcba9876543210 vol0aaaaaaaaaaaaaaaa; do
  truncate -s 64M "$work/$serial.img"
  drives+=(-drive "file=$work/$serial.img,if=none,id=$serial,format=raw,cache=unsafe")
  if [[ $serial == vol0123456789abcdef0 ]]; then
    drives+=(-device "nvme,id=c-$serial,serial=$serial,subsys=subsys0"
             -device "nvme-ns,bus=c-$serial,drive=$serial,nsid=1")
  else
    drives+=(-device "nvme,serial=$serial,drive=$serial")
  fi
done

echo "nvme-lab: kernel $(basename "$kernel"), multipath=$multipath, initrd $(du -h "$work/initrd.gz" | cut -f1)"
boot_guest nvme-lab "$work/console.log" 512 "nvme_core.multipath=$multipath" "${drives[@]}"
