#!/usr/bin/env bash
# Installs the system packages that building and testing ebs-node-agent need, as on a new
# Debian/Ubuntu machine. Idempotent: installs only what is missing.
set -euo pipefail

packages=(
  gcc g++ libc6-dev                     # build: the C toolchain (cc) for build scripts and ring;
                                        # (g++: libFuzzer, which the fuzz targets link, is C++)
                                        # rustup brings Rust but not a linker or libc headers
  pkg-config libblkid-dev libudev-dev   # build: libblkid (probe FFI), libudev (device discovery)
  e2fsprogs xfsprogs util-linux         # runtime: mkfs/fsck/grow, mount helpers for tests
  gdisk fdisk lvm2 cryptsetup-bin       # tests: seed partition tables, LVM and LUKS signatures
  kmod                                  # modprobe loop
  systemd                               # tests: systemd-analyze verify on the shipped unit
  qemu-system-x86 busybox-static        # NVMe lab (tests/nvme-lab): a QEMU guest with NVMe disks
  dmsetup                               # power-loss lab (tests/nvme-lab/powerloss): dm-log-writes in the guest
  python3 python3-venv                  # tests/tests/grpc_clients.rs: a real grpcio client
  python3-seccomp                       # tests/tests/operations/syscall_filter.rs: a seccomp filter
  etcd-server containerd runc           # tests/tests/kubernetes.rs: a one-node cluster (tests/k8s)
  containernetworking-plugins openssl   #   (loopback CNI; its certificates)
  debootstrap xz-utils                  #   (the agent's image root; the .xz binaries)
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

# A Python gRPC C-core client (grpcio >= 1.57 sends the socket path as :authority) and the
# stub generator, in a venv under target/ that the tests find; made once, kept across runs.
venv="$(cd "$(dirname "$0")/.." && pwd)/target/grpcio-venv"
if ! "$venv/bin/python" -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "installing grpcio into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'grpcio==1.85.1' 'grpcio-tools==1.85.1'
fi
