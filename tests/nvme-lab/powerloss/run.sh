#!/usr/bin/env bash
# The power-loss recording (issue 22): boots a throwaway QEMU guest that puts the agent's state
# directory and one EBS-style volume on a dm-log-writes device (its log on a second NVMe disk),
# drives the volume's lifecycle through `ebs-node-agent client` and marks the log after every
# acknowledged call. The host test (tests/tests/power_loss/) replays the log to every flush point.
#
# Usage: tests/nvme-lab/powerloss/run.sh AGENT FS BASE OUT
#   AGENT  the agent binary
#   FS     ext4 or xfs: the state directory's filesystem, and the volume's
#   BASE   the directory every path of the run lives under, the same in the guest and on the
#          host that checks the replays (state mount, socket, staging and target paths, fixture)
#   OUT    where the log disk (log.img) and the console (console.log) are left
# Env:   LAB_TIMEOUT  seconds the guest may run (default 240)
#        LAB_CACHE    the NVMe lab's cache (default target/nvme-lab); its kernel is reused
#        PAYLOAD      what the workload writes through the target path
# Prints the guest's LAB lines; exits 0 when the recording is complete, 3 when a prerequisite
# is missing, 1 otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
agent=$1 fs=$2 base=$3 out=$4
cache=${LAB_CACHE:-$repo/target/nvme-lab}
timeout_s=${LAB_TIMEOUT:-240}
busybox=/bin/busybox
lab=powerloss-lab
. "$here/../lib.sh"
check_prerequisites
command -v dmsetup >/dev/null || missing "dmsetup not found (apt-get install dmsetup)"
case $fs in
  ext4) state_mb=64 vol_mb=64 ;;
  # mkfs.xfs refuses filesystems under 300 MB.
  xfs) state_mb=320 vol_mb=320 ;;
  *) echo "powerloss-lab: FS must be ext4 or xfs" >&2; exit 2 ;;
esac
for tool in mke2fs e2fsck resize2fs; do command -v "$tool" >/dev/null || missing "$tool not found (e2fsprogs)"; done
if [[ $fs == xfs ]]; then
  for tool in mkfs.xfs xfs_growfs; do command -v "$tool" >/dev/null || missing "$tool not found (xfsprogs)"; done
fi

# The kernel: the one the NVMe lab (tests/nvme-lab/run.sh) keeps in its cache, with its
# device-mapper and xfs modules fetched once from the same package into a cache of their own
# (the lab's keeps only the kernel); when that version can no longer be fetched, or the lab has
# no kernel yet, the current cloud image, kernel and modules both from this cache.
wanted=(kernel/drivers/md/dm-mod.ko kernel/drivers/md/dm-log-writes.ko kernel/lib/libcrc32c.ko kernel/fs/xfs/xfs.ko)
fetch() { # VERSION: fills $cache/powerloss-VERSION with the modules and vmlinuz
  local v=$1 dl mods=$cache/powerloss-$1 m src z
  dl=$(mktemp -d /tmp/ebs-powerloss-kernel.XXXXXX)
  chmod 755 "$dl"
  if ! (cd "$dl" && apt-get download -q "linux-image-$v" >/dev/null 2>&1); then
    rm -rf "$dl"
    return 1
  fi
  mkdir -p "$dl/x" && dpkg -x "$dl"/*.deb "$dl/x"
  rm -rf "$mods.tmp" && mkdir -p "$mods.tmp"
  for m in "${wanted[@]}"; do
    src=$dl/x/lib/modules/$v/$m
    [[ -f $src ]] || src=$(ls "$src".* 2>/dev/null | head -1)
    [[ -f $src ]] || { echo "powerloss-lab: linux-image-$v has no $m" >&2; rm -rf "$dl" "$mods.tmp"; return 1; }
    cp "$src" "$mods.tmp/"
  done
  # Compressed modules: this busybox's insmod takes plain ones.
  for z in "$mods.tmp"/*.ko.*; do
    if [[ $z == *.xz ]]; then xz -d "$z"; elif [[ $z == *.zst ]]; then zstd -q -d --rm "$z"; fi
  done
  cp "$dl/x/boot/vmlinuz-$v" "$mods.tmp/vmlinuz"
  rm -rf "$dl" "$mods" && mv "$mods.tmp" "$mods"
}
mkdir -p "$cache"
# The two filesystems' runs start together: one fetches, the other waits for it.
exec 9>"$cache/.powerloss.lock"
flock 9
kernel= mods=
lab_kernel=$(ls "$cache"/kernel/boot/vmlinuz-* 2>/dev/null | head -1 || true)
if [[ -n $lab_kernel ]]; then
  v=${lab_kernel##*/vmlinuz-}
  if [[ -f $cache/powerloss-$v/xfs.ko ]] || fetch "$v"; then kernel=$lab_kernel mods=$cache/powerloss-$v; fi
fi
if [[ -z $kernel ]]; then
  cloud_kernel_package
  v=${pkg#linux-image-}
  [[ -f $cache/powerloss-$v/vmlinuz ]] || fetch "$v" || missing "apt-get download $pkg failed"
  kernel=$cache/powerloss-$v/vmlinuz mods=$cache/powerloss-$v
fi
flock -u 9

# The initramfs: busybox, the agent, dmsetup, the filesystem tools and their libraries.
new_tree ebs-powerloss-lab
install -m 755 "$here/init.sh" "$root/init"
for m in dm-mod dm-log-writes libcrc32c xfs; do cp "$mods/$m.ko" "$root/lib/modules/"; done
install_agent "$agent"
tools=(dmsetup mke2fs e2fsck resize2fs)
[[ $fs == xfs ]] && tools+=(mkfs.xfs xfs_growfs)
install_tools "${tools[@]}"
cat >"$root/lab.env" <<ENV
FS=$fs
BASE='$base'
STATE_MB=$state_mb
VOL_MB=$vol_mb
PAYLOAD='${PAYLOAD:-power-loss payload}'
ENV
pack_initrd

# The logged disk holds the state filesystem and then the volume; the log disk gets every write.
# Both sparse: the log takes what the run writes (xfs zeroes a 64 MiB log per filesystem).
mkdir -p "$out"
truncate -s $((state_mb + vol_mb))M "$work/data.img"
rm -f "$out/log.img" && truncate -s 2G "$out/log.img"
drives=(
  -drive "file=$work/data.img,if=none,id=data,format=raw,cache=unsafe,discard=unmap"
  -device "nvme,serial=powerloss-data,drive=data"
  -drive "file=$out/log.img,if=none,id=log,format=raw,cache=unsafe"
  -device "nvme,serial=powerloss-log,drive=log"
)

echo "powerloss-lab: $fs, kernel $(basename "$kernel"), initrd $(du -h "$work/initrd.gz" | cut -f1)"
boot_guest "powerloss-lab: $fs" "$out/console.log" 768 "nvme_core.multipath=N" "${drives[@]}"
