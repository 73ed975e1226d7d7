#!/usr/bin/env bash
# Installs what the test suite needs on a Debian/Ubuntu machine: what building and running the
# agent needs (packaging/local/deps.sh), plus the test lab below. On a bare Debian 12 (minbase) the
# lab adds 93 packages and 390 MB installed (QEMU and systemd most of it) to the build's 64 and
# 260 MB, about 90 s, then a Python venv with grpcio in target/grpcio-venv (~60 MB). Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

lab=(
  g++                                   # libFuzzer, which the fuzz targets link, is C++
  gdisk fdisk lvm2 cryptsetup-bin       # seed partition tables, LVM and LUKS signatures
  btrfs-progs                           # node_local::btrfs: volume files in a btrfs subvolume
  systemd                               # systemd-analyze verify on the shipped unit
  qemu-system-x86 busybox-static        # NVMe lab (tests/nvme-lab): a QEMU guest with NVMe disks
  dmsetup                               # power-loss lab (tests/nvme-lab/powerloss): dm-log-writes in the guest
  python3 python3-venv                  # tests/tests/grpc_clients.rs: a real grpcio client
  python3-seccomp                       # tests/tests/operations/syscall_filter.rs: a seccomp filter
  etcd-server containerd runc           # tests/tests/kubernetes.rs: a one-node cluster (tests/k8s)
  containernetworking-plugins openssl   #   (loopback CNI; its certificates)
  debootstrap                           #   (the agent's image root; the systemd guest's root, tests/nvme-lab/systemd)
  xz-utils                              # tests/tools.sh unpacks shared/tools/k8s/*.xz
)
bash "$repo/packaging/local/deps.sh" "${lab[@]}"

# A Python gRPC C-core client (grpcio >= 1.57 sends the socket path as :authority) and the
# stub generator, in a venv under target/ that the tests find; made once, kept across runs.
venv="$repo/target/grpcio-venv"
if ! "$venv/bin/python" -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "installing grpcio into $venv (tests only: tests/tests/grpc_clients.rs)"
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check 'grpcio==1.85.1' 'grpcio-tools==1.85.1'; then
    # Not fatal: every other test runs; that one fails (CI=true) or skips, saying why.
    echo "tests/deps.sh: pip could not install grpcio into $venv; only the test" \
      "grpc_clients::python_grpcio_cycle needs it (building and running the agent do not)" >&2
  fi
fi

# Go, for building csi-sanity from source (tests/tools.sh provide) and the Kubernetes tier's CSI
# sidecars (tests/k8s/fetch-tools.sh): Debian's golang-go (Debian 12: Go 1.19, which fetches the
# newer toolchain those builds need through the Go module proxy). Only where csi-sanity is not
# already at hand, the archive has the package, and the proxy answers (else Go would be ~400 MB
# installed for nothing; tools.sh then says what to do instead).
# shellcheck source=tests/tools.sh
source "$repo/tests/tools.sh"
candidate="$(apt-cache policy golang-go 2>/dev/null | sed -n 's/^ *Candidate: //p')"
if ! tool_find csi-sanity >/dev/null && ! command -v go >/dev/null &&
  [[ -n $candidate && $candidate != "(none)" ]]; then
  if go_proxy_answers; then
    bash "$repo/packaging/local/deps.sh" golang-go
  else
    echo "tests/deps.sh: not installing golang-go: $go_proxy_why" >&2
  fi
fi
