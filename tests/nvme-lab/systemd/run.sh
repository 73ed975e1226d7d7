#!/usr/bin/env bash
# The systemd guest: a QEMU guest (software emulation) that boots Debian bookworm with systemd as
# PID 1 from a disk, installs the agent and systemd/ebs-node-agent.service exactly as
# docs/operations/systemd.md says, and checks (tests/nvme-lab/systemd/check.sh) READY after
# recovery, an ebs lifecycle on NVMe disks with EBS-style serials over the default socket, restarts
# after SIGKILL and SIGSEGV, the watchdog, the drain on `systemctl stop`, a journal without denied
# syscalls and `doctor` under the unit's sandbox. Prints the guest's LAB lines; exits 0 only when
# every check passed (3: a prerequisite is missing).
#
# The root filesystem and the kernel are built once (base.sh, cached outside the checkout); the
# run boots the cached image read-only with a throwaway overlay (QEMU's snapshot=on, in $work) and
# hands the guest a small payload disk: the agent binary, the unit, the env file, the guide's
# install lines and check.sh.
#
# Usage: tests/nvme-lab/systemd/run.sh [AGENT_BINARY]   (default: target/debug/ebs-node-agent)
# Env:   LAB_TIMEOUT    seconds the guest may run (default 420; the guest reports and stops 40 s before)
#        SDGUEST_CACHE  where base.sh keeps the image (default /var/cache/ebs-node-agent-tests)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
agent=${1:-$repo/target/debug/ebs-node-agent}
timeout_s=${LAB_TIMEOUT:-420}
lab=sdguest
. "$here/../lib.sh"
[[ $(id -u) = 0 ]] || missing "needs root (debootstrap, the cache in /var/cache)"
command -v qemu-system-x86_64 >/dev/null || missing "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
[[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1 || missing "no static /bin/busybox (apt-get install busybox-static)"
[[ -x $agent ]] || missing "agent binary $agent not found (cargo build --bins)"

started=$(date +%s)
base=$(bash "$here/base.sh") || exit $?
kernel=$base/vmlinuz
echo "sdguest: base $base ($(cat "$base/kernel")), ready after $(($(date +%s) - started)) s"

work=$(mktemp -d /tmp/ebs-sdguest.XXXXXX)
qemu_pid=
trap remove_tree EXIT
# QEMU's snapshot overlay goes to $TMPDIR: into $work, removed with it.
export TMPDIR=$work

# The payload, shaped like the checkout where the guide's commands run: the binary where the guide
# expects a release build (a debug build works the same), systemd/, and the guide's install lines.
p=$work/payload
mkdir -p "$p/target/release" "$p/systemd"
if command -v strip >/dev/null; then strip -o "$p/target/release/ebs-node-agent" "$agent"; else cp "$agent" "$p/target/release/ebs-node-agent"; fi
cp "$repo"/systemd/ebs-node-agent.service "$repo"/systemd/ebs-node-agent.env "$p/systemd/"
guide=$repo/docs/operations/systemd.md
sed -n '/^```sh$/,/^```$/p' "$guide" | grep '^install ' >"$p/guide-install.sh" || true
[[ $(grep -c . "$p/guide-install.sh") -ge 3 ]] || { echo "sdguest: no install lines in $guide" >&2; exit 1; }
grep -q '^systemctl daemon-reload && systemctl enable --now ebs-node-agent$' "$guide" ||
  { echo "sdguest: $guide no longer says 'systemctl daemon-reload && systemctl enable --now ebs-node-agent'" >&2; exit 1; }
install -m 644 "$here/check.sh" "$p/check.sh"
cat >"$p/lab.env" <<ENV
MODEL='QEMU NVMe Ctrl'
V1=vol-0123456789abcdef0
V3=vol-0aaaaaaaaaaaaaaaa
DEADLINE=$((timeout_s - 40))
ENV
mkfs.ext4 -q -L sdgpayload -d "$p" "$work/payload.img" $(($(du -sm "$p" | cut -f1) + 32))M >/dev/null
rm -rf "$p"

# The cloud kernel has NVMe and ext4 built in but virtio-blk as a module, and NVMe controllers
# are numbered in whatever order their probes finish: a busybox initramfs finds the root disk by
# its serial and hands over to systemd. The payload disk is mounted by its label.
mkdir -p "$work/initrd/bin" "$work/initrd/proc" "$work/initrd/sys" "$work/initrd/dev" "$work/initrd/root"
cp /bin/busybox "$work/initrd/bin/busybox"
cat >"$work/initrd/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
i=0
while [ $i -lt 200 ]; do
  for d in /sys/block/nvme*; do
    [ "$(tr -d ' ' <"$d/device/serial" 2>/dev/null)" = sdgroot ] && root=/dev/${d##*/}
  done
  [ -n "$root" ] && break
  sleep 0.05; i=$((i + 1))
done
mount -t ext4 -o rw "$root" /root || { echo "LAB DONE pass=0 fail=1 (no root disk)"; poweroff -f; }
umount /proc /sys /dev
exec switch_root /root /sbin/init
INIT
chmod 755 "$work/initrd/init"
(cd "$work/initrd" && find . | /bin/busybox cpio -o -H newc 2>/dev/null) | gzip -1 >"$work/initrd.gz"
rm -rf "$work/initrd"

drives=(-drive "file=$base/root.img,if=none,id=root,format=raw,snapshot=on,cache=unsafe"
  -device nvme,serial=sdgroot,drive=root
  -drive "file=$work/payload.img,if=none,id=payload,format=raw,readonly=on"
  -device nvme,serial=sdgpayload,drive=payload)
for serial in vol0123456789abcdef0 vol0aaaaaaaaaaaaaaaa; do
  truncate -s 64M "$work/$serial.img"
  drives+=(-drive "file=$work/$serial.img,if=none,id=$serial,format=raw,cache=unsafe"
    -device "nvme,serial=$serial,drive=$serial")
done
# cx16=off: QEMU 7.2's software cmpxchg16b breaks the 6.12 kernel's per-CPU slab fast path (a
# double fault in kmem_cache_alloc in about one boot of three); without it the kernel takes a lock.
cpu=max,cx16=off boot_guest sdguest "$work/console.log" 1024 \
  "rw loglevel=3 systemd.show_status=0 nvme_core.multipath=N" "${drives[@]}"
