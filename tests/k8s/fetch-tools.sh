#!/usr/bin/env bash
# The Kubernetes tier's binaries (tests/tests/kubernetes.rs, tests/tests/kube_duties.rs) for a
# machine without shared/tools/k8s beside its checkout: fetched from upstream into
# target/tools/k8s/, where the tier looks (tests/src/k8s.rs, find_tools), as NAME.xz like
# shared/tools/k8s has them.
#   tests/k8s/fetch-tools.sh          fetch or build what is missing (idempotent)
#   tests/k8s/fetch-tools.sh find     print the directory the tier would use, or exit 1
# Where each comes from (the versions CI's copies were built at; docs/operations/kubernetes.md):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl $KUBE_VERSION:
#     Kubernetes' release binaries, $KUBE_DL/$KUBE_VERSION/bin/linux/ARCH/NAME, each checked
#     against the NAME.sha256 published beside it;
#   csi-node-driver-registrar, livenessprobe, csi-provisioner, csi-attacher, csi-resizer:
#     upstream publishes these as container images only, no binaries: built with Go from the
#     release tag of kubernetes-csi/<repo> (a shallow git clone of the tag; their modules are
#     vendored), CGO off, as CI's copies were;
#   pause: build/pause/linux/pause.c of Kubernetes' own tree at $KUBE_VERSION, gcc -static.
# Go comes from tests/tools.sh (Debian's golang-go plus a newer toolchain through the Go module
# proxy; tests/deps.sh installs golang-go). Every download has a time limit; when a source
# cannot be reached this says which URL and why, and exits 1 without touching what is there.
# tests/run.sh runs this only when the binaries are missing and K8S_FETCH=1 asks for it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
# shellcheck source=tests/tools.sh
source "$repo/tests/tools.sh"
out="${CARGO_TARGET_DIR:-$repo/target}/tools/k8s"

KUBE_VERSION=v1.36.2
KUBE_DL="${KUBE_DL:-https://dl.k8s.io/release}"
KUBE_GIT=https://github.com/kubernetes/kubernetes
# name  repository  tag  go build tags (the http2legacy tag as CI's copies were built)
SIDECARS=(
  "csi-node-driver-registrar node-driver-registrar v2.13.0 -"
  "livenessprobe livenessprobe v2.15.0 -"
  "csi-provisioner external-provisioner v6.3.0 -"
  "csi-attacher external-attacher v4.12.0 http2legacy"
  "csi-resizer external-resizer v2.2.1 http2legacy"
)
KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
ALL=("${KUBE_BINARIES[@]}" csi-node-driver-registrar livenessprobe csi-provisioner csi-attacher
  csi-resizer pause)
# Seconds: connecting, and a whole download (kubelet and kube-apiserver are ~100 MB).
CONNECT_TIMEOUT="${FETCH_CONNECT_TIMEOUT:-10}"
DOWNLOAD_TIMEOUT="${FETCH_DOWNLOAD_TIMEOUT:-600}"

# The directory the tier uses, as tests/src/k8s.rs's find_tools looks: $K8S_TOOLS, then
# shared/tools/k8s beside the checkout or a directory above it, then target/tools/k8s.
k8s_find() {
  local d
  if [[ -n ${K8S_TOOLS:-} ]]; then
    [[ -f $K8S_TOOLS/kubelet.xz && -f $K8S_TOOLS/kube-apiserver.xz ]] && echo "$K8S_TOOLS"
    return
  fi
  d="$repo"
  while [[ $d != / ]]; do
    d="$(dirname "$d")"
    if [[ -f $d/shared/tools/k8s/kubelet.xz && -f $d/shared/tools/k8s/kube-apiserver.xz ]]; then
      echo "$d/shared/tools/k8s"; return 0
    fi
  done
  [[ -f $out/kubelet.xz && -f $out/kube-apiserver.xz ]] && echo "$out"
}

fail() { echo "fetch-tools: $*" >&2; exit 1; }

# Downloads $1 to $2, or fails saying what went wrong with which URL.
download() {
  local url="$1" to="$2" err
  if ! err="$(curl -fsSL --proto '=https' --connect-timeout "$CONNECT_TIMEOUT" \
    --max-time "$DOWNLOAD_TIMEOUT" -o "$to" "$url" 2>&1)"; then
    rm -f "$to"
    fail "cannot download $url: ${err:-curl failed}" \
      "(no network to it? a proxy? FETCH_CONNECT_TIMEOUT=$CONNECT_TIMEOUT s)"
  fi
}

# $2 compressed into $out/$1.xz (what the tier unpacks), replacing an older one atomically.
store() {
  xz -T0 -0 -c "$2" >"$out/$1.xz.part" && mv -f "$out/$1.xz.part" "$out/$1.xz"
  echo "fetch-tools: $out/$1.xz" >&2
}

fetch_kube() {
  local name="$1" arch="$2" tmp="$3" url want got
  url="$KUBE_DL/$KUBE_VERSION/bin/linux/$arch/$name"
  download "$url.sha256" "$tmp/$name.sha256"
  download "$url" "$tmp/$name"
  want="$(tr -d ' \n' <"$tmp/$name.sha256")"
  got="$(sha256sum "$tmp/$name" | cut -d' ' -f1)"
  [[ $want == "$got" ]] || fail "$url: sha256 $got, but $url.sha256 says $want: not used"
  store "$name" "$tmp/$name"
}

# A shallow clone of tag $2 of $1 into $3 (only the paths $4... when given), or fail saying so.
clone() {
  local url="$1" tag="$2" dir="$3" err
  shift 3
  if ! err="$(export GIT_HTTP_LOW_SPEED_LIMIT=1000 GIT_HTTP_LOW_SPEED_TIME="$CONNECT_TIMEOUT"
    git() { timeout "$DOWNLOAD_TIMEOUT" command git -c advice.detachedHead=false "$@"; }
    if (($#)); then
      git clone -q --depth 1 --filter=blob:none --sparse --branch "$tag" "$url" "$dir" &&
        git -C "$dir" sparse-checkout set "$@"
    else
      git clone -q --depth 1 --branch "$tag" "$url" "$dir"
    fi 2>&1)"; then
    fail "cannot clone $url at $tag: ${err:-timed out after $DOWNLOAD_TIMEOUT s}"
  fi
}

build_sidecar() {
  local name="$1" project="$2" tag="$3" tags="$4" go="$5" tmp="$6" src
  src="$tmp/$project"
  clone "https://github.com/kubernetes-csi/$project" "$tag" "$src"
  echo "fetch-tools: building $name $tag ($(git -C "$src" rev-parse HEAD))" >&2
  [[ $tags == - ]] && tags=""
  (cd "$src" && CGO_ENABLED=0 timeout 1800 "$go" build -trimpath -ldflags '-s -w' \
    ${tags:+-tags "$tags"} -o "$tmp/$name" "./cmd/$name") || fail "go build of $name failed"
  store "$name" "$tmp/$name"
}

build_pause() {
  local tmp="$1" src="$1/kubernetes"
  command -v gcc >/dev/null || fail "pause: no gcc (bash packaging/local/deps.sh installs it)"
  clone "$KUBE_GIT" "$KUBE_VERSION" "$src" build/pause
  gcc -Os -static -o "$tmp/pause" "$src/build/pause/linux/pause.c" || fail "gcc pause.c failed"
  store pause "$tmp/pause"
}

main() {
  local arch tmp go="" name line missing=()
  case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) fail "no build for $(uname -m)" ;; esac
  for name in "${ALL[@]}"; do [[ -f $out/$name.xz ]] || missing+=("$name"); done
  if ((${#missing[@]} == 0)); then
    echo "fetch-tools: all in $out" >&2; return 0
  fi
  command -v curl >/dev/null || fail "no curl (apt-get install curl)"
  command -v xz >/dev/null || fail "no xz (apt-get install xz-utils)"
  mkdir -p "$out"
  tmp="$(mktemp -d "$out/.fetch.XXXXXX")"
  # shellcheck disable=SC2064 # $tmp is fixed now
  trap "rm -rf '$tmp'" EXIT
  echo "fetch-tools: missing ${missing[*]}" >&2
  for name in "${missing[@]}"; do
    if [[ " ${KUBE_BINARIES[*]} " == *" $name "* ]]; then
      fetch_kube "$name" "$arch" "$tmp"
    elif [[ $name == pause ]]; then
      build_pause "$tmp"
    else
      if [[ -z $go ]]; then
        export GOPATH="$tools_dir/go" GOCACHE="$tools_dir/go/cache" GOFLAGS=-modcacherw
        go_proxy_answers || fail "the sidecars are built with Go: $go_proxy_why"
        go="$(go_for_build)" || fail "no Go toolchain to build the CSI sidecars (bash tests/deps.sh installs golang-go)"
      fi
      for line in "${SIDECARS[@]}"; do
        # shellcheck disable=SC2086 # the fields of one line
        set -- $line
        [[ $1 == "$name" ]] && build_sidecar "$1" "$2" "$3" "$4" "$go" "$tmp"
      done
    fi
  done
  echo "fetch-tools: done; the tier finds them in $out" >&2
}

case "${1:-}" in
  find) k8s_find || exit 1 ;;
  "") main ;;
  *) echo "usage: $0 [find]" >&2; exit 2 ;;
esac
