#!/usr/bin/env bash
# Builds the images the manifests name, without a registry or a container builder, and loads them
# into the test cluster's containerd:
#   tests/k8s/images.sh DIR AGENT_BINARY
# The agent's image carries the name the shipped manifests use, so it is built from the agent as
# it ships (no features; tests/run.sh builds it in the dev profile, a release binary works the
# same): a binary with the test hooks (--crash-after) is refused, and can never be loaded under
# the release image's name.
# - the agent: packaging/container/Dockerfile's runtime stage (bookworm minbase with e2fsprogs,
#   xfsprogs, util-linux, libblkid1, libudev1, ca-certificates; the root tree is made once with
#   debootstrap and kept under /var/cache/ebs-node-agent-tests) plus the binary at
#   /usr/local/bin/ebs-node-agent;
# - the CSI sidecars and pause: one static binary each, at / as upstream's images have them.
# Each image is written as a docker-save archive (kept in target/k8s/images, made again when its
# binary changed) and imported with `ctr -n k8s.io images import`.
set -euo pipefail
D=${1:?cluster directory}
agent=${2:?agent binary}
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache=${K8S_CACHE:-$repo/target/k8s}
# The base (debootstrap's tree and its layer) outlives checkouts, as the systemd guest's does: a
# fresh clone on a machine that built it once skips the download. Its name carries the package
# list, so a change to the list makes a new base.
pkgs=e2fsprogs,xfsprogs,util-linux,libblkid1,libudev1,ca-certificates
base=${K8S_BASE_CACHE:-/var/cache/ebs-node-agent-tests/k8s-bookworm-$(sha256sum <<<"$pkgs" | cut -c1-12)}
: "${K8S_TOOLS:?K8S_TOOLS: the directory with the .xz binaries of the sidecars}"
work=$D/images
mkdir -p "$work" "$cache" "$base"
# The hooks' environment variables exist in a test-hooks build only (agent/daemon/src/test_hooks.rs).
if grep -qaF EBS_AGENT_CRASH_AFTER "$agent"; then
  echo "images.sh: $agent is a test-hooks build (it knows EBS_AGENT_CRASH_AFTER); the image named" \
    "like the release image is built from a build without features only:" \
    "cargo build --locked -p ebs-node-agent --bin ebs-node-agent" >&2
  exit 1
fi

log() { printf '[images %s] %s\n' "$(date +%T)" "$*" >&2; }

base_layer() {
  if [[ -f $base/bookworm-base.tar && -f $base/bookworm-base.tar.sha256 ]]; then return; fi
  local root=$base/bookworm-root
  if [[ ! -x $root/usr/sbin/mkfs.xfs ]]; then
    log "debootstrap bookworm (once; kept in $root)"
    rm -rf "$root.partial"
    local mirror
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [[ -n $mirror ]] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    debootstrap --variant=minbase \
      --include="$pkgs" \
      bookworm "$root.partial" "${mirror:-http://deb.debian.org/debian}" >"$base/debootstrap.log" 2>&1
    rm -rf "$root.partial"/var/lib/apt/lists/* "$root.partial"/var/cache/apt/*.bin \
      "$root.partial"/var/cache/apt/archives/*.deb "$root.partial"/usr/share/doc/* \
      "$root.partial"/usr/share/man/* "$root.partial"/usr/share/info/* "$root.partial"/usr/share/locale/*
    mv "$root.partial" "$root"
  fi
  tar -C "$root" --numeric-owner --xattrs -cf "$base/bookworm-base.tar.partial" .
  sha256sum "$base/bookworm-base.tar.partial" | cut -d' ' -f1 >"$base/bookworm-base.tar.sha256"
  mv "$base/bookworm-base.tar.partial" "$base/bookworm-base.tar"
}

# archive NAME REF ENTRYPOINT_JSON LAYER...: writes DIR/images/NAME.tar (docker-save format).
archive() {
  local name=$1 ref=$2 entry=$3; shift 3
  local a=$work/$name
  rm -rf "$a"; mkdir -p "$a"
  local layers="" diffs="" l sum i=0
  for l in "$@"; do
    if [[ $l == "$base/bookworm-base.tar" ]]; then sum=$(cat "$base/bookworm-base.tar.sha256")
    else sum=$(sha256sum "$l" | cut -d' ' -f1); fi
    mkdir -p "$a/l$i"
    ln "$l" "$a/l$i/layer.tar" 2>/dev/null || cp "$l" "$a/l$i/layer.tar"
    layers+="${layers:+,}\"l$i/layer.tar\""
    diffs+="${diffs:+,}\"sha256:$sum\""
    i=$((i + 1))
  done
  printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"%s],"Entrypoint":%s,"Cmd":%s},"rootfs":{"type":"layers","diff_ids":[%s]}}' \
    "${EXTRA_ENV:-}" "$entry" "${CMD_JSON:-null}" "$diffs" >"$a/config.json"
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":[%s]}]' "$ref" "$layers" >"$a/manifest.json"
  tar -C "$a" -cf "$work/$name.tar" --dereference .
  rm -rf "$a"
}

import() {
  ctr --address "$D/containerd.sock" -n k8s.io images import --no-unpack=false "$1" >/dev/null
}

# The archives are kept in target/k8s/images and made again only when their input changed.
mkdir -p "$cache/images"

# One static binary at /NAME.
static_image() {
  local bin=$1 ref=$2
  local out=$cache/images/$bin.tar
  if [[ ! -f $out || $K8S_TOOLS/$bin.xz -nt $out ]]; then
    local root=$work/$bin-root
    mkdir -p "$root"
    xz -dc "$K8S_TOOLS/$bin.xz" >"$root/$bin"
    chmod 0755 "$root/$bin"
    tar -C "$root" --numeric-owner --owner=0 --group=0 -cf "$work/$bin-layer.tar" .
    rm -rf "$root"
    archive "$bin" "$ref" "[\"/$bin\"]" "$work/$bin-layer.tar"
    rm -f "$work/$bin-layer.tar"
    mv "$work/$bin.tar" "$out"
  fi
  import "$out"
  local also
  for also in "${@:3}"; do
    ctr --address "$D/containerd.sock" -n k8s.io images tag --force "$ref" "$also" >/dev/null
  done
}

base_layer
log "agent image"
out=$cache/images/agent.tar
stamp="$(stat -L -c '%s %Y %i' "$agent") $(cat "$base/bookworm-base.tar.sha256")"
if [[ ! -f $out || $(cat "$out.stamp" 2>/dev/null) != "$stamp" ]]; then
  root=$work/agent-root
  mkdir -p "$root/usr/local/bin"
  strip -o "$root/usr/local/bin/ebs-node-agent" "$agent" 2>/dev/null || cp "$agent" "$root/usr/local/bin/ebs-node-agent"
  chmod 0755 "$root/usr/local/bin/ebs-node-agent"
  mkdir -p "$root/csi" "$root/var/lib/ebs-node-agent"
  tar -C "$root" --numeric-owner --owner=0 --group=0 -cf "$work/agent-layer.tar" .
  rm -rf "$root"
  EXTRA_ENV=',"CSI_ENDPOINT=unix:///csi/csi.sock","EBS_AGENT_STATE_DIR=/var/lib/ebs-node-agent"' \
  CMD_JSON='["serve"]' archive agent ghcr.io/ebs-node-agent/ebs-node-agent:0.1.0 \
    '["/usr/local/bin/ebs-node-agent"]' "$base/bookworm-base.tar" "$work/agent-layer.tar"
  rm -f "$work/agent-layer.tar"
  mv "$work/agent.tar" "$out"
  echo "$stamp" >"$out.stamp"
fi
import "$out"

log "sidecar images"
static_image pause registry.k8s.io/pause:3.10.1
# Also under the names in the upstream chart's rendered node manifest (tests/fixtures).
static_image csi-node-driver-registrar registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0 \
  public.ecr.aws/csi-components/csi-node-driver-registrar:placeholder
static_image livenessprobe registry.k8s.io/sig-storage/livenessprobe:v2.15.0 \
  public.ecr.aws/csi-components/livenessprobe:placeholder
static_image csi-provisioner registry.k8s.io/sig-storage/csi-provisioner:v6.3.0
static_image csi-attacher registry.k8s.io/sig-storage/csi-attacher:v4.12.0
static_image csi-resizer registry.k8s.io/sig-storage/csi-resizer:v2.2.1
rm -rf "$work"
log "images loaded"
