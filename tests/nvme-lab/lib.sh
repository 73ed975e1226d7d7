# Shared by the lab scripts (run.sh, powerloss/run.sh): building the initramfs and booting the
# guest. Sourced; the caller sets `lab` (its name), `agent`, `busybox`, `kernel` and `timeout_s`, and
# calls `new_tree` before building the tree.

# missing WHAT: a prerequisite is missing: says so (as `$lab`) and exits 3.
missing() { echo "$lab: $*" >&2; exit 3; }

# check_prerequisites: qemu, a static busybox ($busybox) and the agent binary ($agent).
check_prerequisites() {
  command -v qemu-system-x86_64 >/dev/null || missing "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
  [[ -x $busybox ]] || missing "$busybox not found (apt-get install busybox-static)"
  ldd "$busybox" >/dev/null 2>&1 && missing "$busybox is not static (apt-get install busybox-static)"
  [[ -x $agent ]] || missing "agent binary $agent not found (cargo build --bins)"
}

# cloud_kernel_package: sets `pkg` to the package of Debian's current cloud kernel.
cloud_kernel_package() {
  pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
  [[ -n $pkg ]] || missing "cannot find the linux-image-cloud-amd64 package (apt-get update?)"
}

# new_tree TAG: a scratch $work under /tmp, removed at exit together with the guest, and the
# initramfs tree $root in it with busybox ($busybox).
new_tree() {
  work=$(mktemp -d "/tmp/$1.XXXXXX")
  qemu_pid=
  trap remove_tree EXIT
  root=$work/root
  mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,run,tmp,lib/modules}
  cp "$busybox" "$root/bin/busybox"
}

remove_tree() {
  [[ -n $qemu_pid ]] && kill "$qemu_pid" 2>/dev/null || true
  rm -rf "$work"
}

# copy_libs BINARY: the shared libraries BINARY loads, into the initramfs.
copy_libs() {
  ldd "$1" | awk '/=> \// {print $3} /^[[:space:]]*\/lib/ {print $1}' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

# install_agent AGENT: the agent (stripped when strip is there) and its libraries.
install_agent() {
  if command -v strip >/dev/null; then
    strip -o "$root/bin/ebs-node-agent" "$1"
  else
    cp "$1" "$root/bin/ebs-node-agent"
  fi
  copy_libs "$1"
}

# install_tools TOOL...: host tools into /sbin with their libraries, plus mkfs.ext4 and mke2fs.conf.
install_tools() {
  local tool src
  for tool in "$@"; do
    src=$(command -v "$tool" || echo "/sbin/$tool")
    cp -L "$src" "$root/sbin/$tool"
    copy_libs "$src"
  done
  ln -s mke2fs "$root/sbin/mkfs.ext4"
  if [[ -f /etc/mke2fs.conf ]]; then cp /etc/mke2fs.conf "$root/etc/"; fi
}

# pack_initrd: the guests' shared /init prelude, then the tree into $work/initrd.gz.
pack_initrd() {
  install -m 644 "$(dirname "${BASH_SOURCE[0]}")/guest.sh" "$root/lab-guest.sh"
  (cd "$root" && find . | /bin/busybox cpio -o -H newc 2>/dev/null) | gzip -1 >"$work/initrd.gz"
}

# boot_guest LABEL CONSOLE MEMORY_MB APPEND DRIVE_ARGS...: boots the guest, prints its LAB lines
# and succeeds only when it finished with `LAB DONE ... fail=0`. `cpu`: QEMU's -cpu (default max).
boot_guest() {
  local label=$1 console=$2 mem=$3 append=$4 started elapsed_ms rc=0
  shift 4
  started=$(date +%s%N)
  timeout --kill-after=5 "$timeout_s" qemu-system-x86_64 -accel tcg,thread=multi -cpu "${cpu:-max}" -machine q35 \
    -smp 1 -m "$mem" -nodefaults -no-user-config -display none -serial stdio -no-reboot \
    -kernel "$kernel" -initrd "$work/initrd.gz" \
    -append "console=ttyS0 quiet panic=-1 $append" \
    "$@" </dev/null >"$console" 2>&1 &
  qemu_pid=$!
  wait "$qemu_pid" || rc=$?
  qemu_pid=
  elapsed_ms=$((($(date +%s%N) - started) / 1000000))

  tr -d '\r' <"$console" | grep '^LAB' || true
  if ! grep -q '^LAB DONE' "$console"; then
    echo "$label: the guest did not finish (qemu exit $rc, ${elapsed_ms} ms); console:" >&2
    tr -d '\r' <"$console" | tail -"${LAB_CONSOLE_LINES:-40}" >&2
    exit 1
  fi
  echo "$label: guest run ${elapsed_ms} ms (boot to poweroff)"
  tr -d '\r' <"$console" | grep -q '^LAB DONE .*fail=0$'
}
