#!/usr/bin/env bash
# The systemd guest's base: a Debian bookworm root filesystem (debootstrap, systemd as init) in an
# ext4 image built without mounting (mkfs.ext4 -d), and the guest kernel. Made once and kept in
#   $SDGUEST_CACHE (default /var/cache/ebs-node-agent-tests)/sdguest-<hash of this script>/
# so a change to the package list or to anything below makes a new one; a run only adds a qcow2
# overlay on top. Prints that directory. Needs root (debootstrap), network on the first run.
#
# The kernel: Debian's cloud kernel from bookworm-backports (6.12: statmount and listmount exist,
# so the unit's syscall filter meets them), fetched through a private apt configuration that leaves
# the host's sources alone; where backports cannot be reached, bookworm's own cloud kernel (6.1).
set -euo pipefail
packages=systemd,systemd-sysv,udev,kmod,e2fsprogs,xfsprogs,util-linux,libblkid1,libudev1,procps
key=$(sha256sum <"$0" | cut -c1-16)
out=${SDGUEST_CACHE:-/var/cache/ebs-node-agent-tests}/sdguest-$key
[[ -f $out/ok ]] && { echo "$out"; exit 0; }
log() { printf '[sdguest base %s] %s\n' "$(date +%T)" "$*" >&2; }
command -v debootstrap >/dev/null || { echo "debootstrap not found (apt-get install debootstrap)" >&2; exit 3; }
mkdir -p "$(dirname "$out")"
# One builder at a time; a second waits and then finds the result.
exec 9>"$out.lock"
flock 9
[[ -f $out/ok ]] && { echo "$out"; exit 0; }
tmp=$(mktemp -d "$out.tmp.XXXXXX")
# debootstrap mounts /proc and /sys in the root while it works: a failed run may leave them.
cleanup() {
  awk -v t="$tmp/" 'index($2, t) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
root=$tmp/root

mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[[ -n $mirror ]] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

# The kernel first (seconds), so a failure shows before the long debootstrap.
apt=$tmp/apt
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/deb"
echo "deb $mirror bookworm-backports main" >"$apt/sources.list"
aptopts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o Debug::NoLocking=1)
kpkg=
if apt-get "${aptopts[@]}" update -q >"$tmp/apt.log" 2>&1; then
  kpkg=$(apt-cache "${aptopts[@]}" depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
  [[ -n $kpkg ]] && (cd "$apt/deb" && apt-get "${aptopts[@]}" download -q "$kpkg" >>"$tmp/apt.log" 2>&1) || kpkg=
fi
if [[ -z $kpkg ]]; then
  log "bookworm-backports unreachable: bookworm's own cloud kernel (no statmount)"
  kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
  [[ -n $kpkg ]] || { echo "cannot find linux-image-cloud-amd64 (apt-get update?)" >&2; exit 3; }
  (cd "$apt/deb" && apt-get download -q "$kpkg" >>"$tmp/apt.log" 2>&1) || { echo "apt-get download $kpkg failed" >&2; exit 3; }
fi
log "kernel $kpkg; debootstrap bookworm from $mirror (minutes, once)"

debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
  { tail -20 "$tmp/debootstrap.log" >&2; exit 1; }
# The kernel's modules in the root (xfs, loop, ...), its image beside the disk.
dpkg -x "$apt"/deb/*.deb "$tmp/kernel"
kver=$(ls "$tmp/kernel/lib/modules")
mkdir -p "$root/lib/modules"
cp -a "$tmp/kernel/lib/modules/$kver" "$root/lib/modules/"
depmod -b "$root" "$kver"
rm -rf "$out.new" && mkdir -p "$out.new"
cp "$tmp/kernel/boot/vmlinuz-$kver" "$out.new/vmlinuz"
echo "$kpkg" >"$out.new/kernel"

rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
echo sdguest >"$root/etc/hostname"
echo 'LABEL=sdguest / ext4 rw,errors=remount-ro 0 1' >"$root/etc/fstab"
# An empty machine-id: systemd makes one at boot.
: >"$root/etc/machine-id"
# No login prompts on the console the host reads; nothing else competing for the one CPU.
for u in serial-getty@ttyS0.service getty@tty1.service getty.target systemd-timesyncd.service \
  apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer; do
  ln -sf /dev/null "$root/etc/systemd/system/$u"
done
# The lab: at boot, mount the run's payload disk (label sdgpayload) and run its check.sh, which reports on
# the console and powers off.
cat >"$root/etc/systemd/system/ebs-lab.service" <<'UNIT'
[Unit]
Description=ebs-node-agent systemd lab
After=basic.target
[Service]
Type=simple
ExecStartPre=/bin/mkdir -p /lab
# No udev-settle (slow under emulation): the NVMe driver is built in; wait for the disk a little.
ExecStartPre=/bin/sh -c 'i=0; until mount -o ro LABEL=sdgpayload /lab; do i=$$((i + 1)); [ $$i -gt 100 ] && exit 1; sleep 0.1; done'
ExecStart=/bin/bash /lab/check.sh
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
[Install]
WantedBy=multi-user.target
UNIT
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/ebs-lab.service "$root/etc/systemd/system/multi-user.target.wants/ebs-lab.service"

# The image, without mounting it.
size=$(($(du -sm "$root" | cut -f1) + 400))
mkfs.ext4 -q -F -L sdguest -d "$root" "$out.new/root.img" "${size}M" >&2
touch "$out.new/ok"
rm -rf "$out"
mv "$out.new" "$out"
log "base in $out ($(du -sh --apparent-size "$out/root.img" | cut -f1) image, $(du -sh "$out/root.img" | cut -f1) used)"
echo "$out"
