#!/usr/bin/env bash
# Installs what building and running ebs-node-agent needs on a Debian/Ubuntu machine, and nothing
# for the tests (tests/deps.sh adds those): on a bare Debian 12 (debootstrap minbase with git and
# curl) 64 packages, 260 MB installed, about 70 s, most of it the C toolchain (docs/first-contact.md). Idempotent: installs only what is missing. Rust comes from rustup.
# Also loads the loop module (the loop backend's devices).
#   packaging/local/deps.sh [PACKAGE...]   (tests/deps.sh passes the test lab's packages)
set -euo pipefail

packages=(
  gcc libc6-dev                         # build: the C toolchain (cc) for build scripts and ring;
                                        # rustup brings Rust but not a linker or libc headers
  pkg-config libblkid-dev libudev-dev   # build: libblkid (probe FFI), libudev (device discovery)
  e2fsprogs xfsprogs util-linux         # runtime: mkfs, fsck, resize2fs/xfs_growfs, blkdiscard
  kmod                                  # runtime: modprobe loop
  "$@"
)
if [[ -n "${EBS_EXTRA_PACKAGES:-}" ]]; then
  read -r -a extra <<<"$EBS_EXTRA_PACKAGES"
  packages+=("${extra[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [[ $(id -u) -eq 0 ]]; then
  modprobe loop 2>/dev/null || true
  [[ -e /dev/loop-control ]] || mknod -m 0660 /dev/loop-control c 10 237 || true
fi
