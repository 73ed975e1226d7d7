#!/usr/bin/env bash
# The outside programs some tests run (csi-sanity; the Kubernetes tier's binaries in
# shared/tools/k8s/*.xz), found the same way wherever the suite runs.
#   tests/tools.sh find NAME      print the tool's path, or say what to do and exit 1 (instant:
#                                 the tests call this, so a missing tool fails in seconds)
#   tests/tools.sh provide NAME   the same, but first build it where a recipe exists and the
#                                 machine can (tests/run.sh calls this before the tests)
# NAME may have a directory (k8s/kubelet). Where a tool is looked for, in this order:
#   1. the environment variable named after it: upper case, '-' as '_' (CSI_SANITY, KUBELET);
#      when set it is the only place looked at;
#   2. shared/tools/NAME or shared/tools/NAME.xz beside the checkout or beside any directory
#      above it (a .xz is unpacked once into target/tools/);
#   3. target/tools/ (what `provide` built or unpacked before).
# Can be sourced: tool_find and tool_provide are the functions.

CSI_SANITY_VERSION=v5.4.0
CSI_SANITY_MODULE=github.com/kubernetes-csi/csi-test/v5
# Debian 12's golang-go is Go 1.19, too old for csi-test v5.4; Go 1.21+ fetches a newer one by
# itself (GOTOOLCHAIN), 1.19 gets this one through the module proxy (golang.org/toolchain).
GO_TOOLCHAIN=go1.24.4

tools_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
tools_dir="${CARGO_TARGET_DIR:-$tools_repo/target}/tools"

tool_var() { local b="${1##*/}"; b="${b^^}"; echo "${b//-/_}"; }

# Prints the path of tool $1, or returns 1 (quietly: tool_missing says why).
tool_find() {
  local name="$1" base="${1##*/}" var dir src out
  var="$(tool_var "$name")"
  if [[ -n "${!var:-}" ]]; then
    [[ -f "${!var}" && -x "${!var}" ]] && { echo "${!var}"; return 0; }
    return 1
  fi
  dir="$(dirname "$tools_repo")"
  while :; do
    if [[ -f "$dir/shared/tools/$name" && -x "$dir/shared/tools/$name" ]]; then
      echo "$dir/shared/tools/$name"; return 0
    fi
    src="$dir/shared/tools/$name.xz"
    if [[ -f "$src" ]]; then
      out="$tools_dir/$base"
      if [[ ! -x "$out" || "$src" -nt "$out" ]]; then
        mkdir -p "$tools_dir"
        if ! { xz -dc "$src" >"$out.$$" && chmod +x "$out.$$" && mv -f "$out.$$" "$out"; }; then
          rm -f "$out.$$"; echo "cannot unpack $src (xz-utils installed?)" >&2; return 1
        fi
      fi
      echo "$out"; return 0
    fi
    [[ "$dir" == / ]] && break
    dir="$(dirname "$dir")"
  done
  [[ -x "$tools_dir/$base" ]] && { echo "$tools_dir/$base"; return 0; }
  return 1
}

# What to do when tool $1 is missing, to stderr.
tool_missing() {
  local name="$1" var
  var="$(tool_var "$name")"
  if [[ -n "${!var:-}" ]]; then
    echo "$name: $var=${!var} is not an executable file (unset it to look elsewhere)" >&2
    return
  fi
  {
    echo "$name is missing. Provide it in one of these ways:"
    echo "  - $var=/path/to/$(basename "$name") (an environment variable naming the binary)"
    echo "  - shared/tools/$name (or $name.xz) beside the checkout or a directory above it"
    case "$name" in
      csi-sanity)
        echo "  - build it (needs Go and the Go module proxy):"
        echo "      GOBIN=$tools_dir go install $CSI_SANITY_MODULE/cmd/csi-sanity@$CSI_SANITY_VERSION"
        echo "    (tests/run.sh tries this by itself: tests/tools.sh provide csi-sanity)"
        ;;
    esac
  } >&2
}

# The Go module proxy answers within a few seconds (go env GOPROXY, first entry); when not,
# $go_proxy_why says why.
go_proxy_answers() {
  local proxy="${GOPROXY:-}"
  [[ -z "$proxy" ]] && command -v go >/dev/null && proxy="$(go env GOPROXY 2>/dev/null)"
  proxy="${proxy:-https://proxy.golang.org}"
  proxy="${proxy%%[,|]*}"
  case "$proxy" in off | direct)
    go_proxy_why="GOPROXY=$proxy: no Go module proxy to fetch csi-test from"; return 1 ;;
  esac
  go_proxy_why="the Go module proxy ($proxy) did not answer within 5 s"
  local url="$proxy/$CSI_SANITY_MODULE/@v/$CSI_SANITY_VERSION.info"
  if command -v curl >/dev/null; then
    curl -fsS -m 5 -o /dev/null "$url" 2>/dev/null
  else
    local host="${proxy#*://}"
    timeout 5 bash -c ": </dev/tcp/${host%%/*}/443" 2>/dev/null
  fi
}

# A go command that can build csi-sanity, on stdout; may install Debian's golang-go.
go_for_build() {
  local go g
  go="$(command -v go || true)"
  for g in /usr/lib/go/bin/go /usr/local/go/bin/go; do [[ -z "$go" && -x "$g" ]] && go="$g"; done
  if [[ -z "$go" && $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "tools: installing golang-go (about 400 MB) to build csi-sanity" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq --no-install-recommends golang-go ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends golang-go; }; } \
      >/dev/null 2>&1 || true
    go="$(command -v go || true)"
  fi
  [[ -n "$go" ]] || return 1
  if [[ -z "$("$go" env GOTOOLCHAIN 2>/dev/null)" ]]; then
    # Before Go 1.21: fetch a newer toolchain as a module; zips keep no exec bits.
    local arch dir
    arch="$("$go" env GOARCH)"
    dir="$(timeout 600 "$go" mod download -json \
      "golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-$arch" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    [[ -n "$dir" && -f "$dir/bin/go" ]] || return 1
    chmod -R +x "$dir/bin" "$dir/pkg/tool" && go="$dir/bin/go"
  fi
  echo "$go"
}

# tool_find, after building tool $1 into target/tools/ where there is a recipe and a way.
tool_provide() {
  local name="$1" go
  tool_find "$name" && return 0
  [[ "$name" == csi-sanity && -z "${CSI_SANITY:-}" ]] || { tool_missing "$name"; return 1; }
  if ! go_proxy_answers; then
    echo "tools: not building csi-sanity: $go_proxy_why" >&2
    tool_missing "$name"; return 1
  fi
  # Go's caches under target/ too, writable, so that cargo clean or rm -rf takes them.
  export GOPATH="$tools_dir/go" GOCACHE="$tools_dir/go/cache" GOFLAGS=-modcacherw
  go="$(go_for_build)" || { echo "tools: no Go toolchain to build csi-sanity" >&2; tool_missing "$name"; return 1; }
  echo "tools: building csi-sanity $CSI_SANITY_VERSION with $go (a minute or two)" >&2
  if ! GOBIN="$tools_dir" timeout 900 "$go" install \
    "$CSI_SANITY_MODULE/cmd/csi-sanity@$CSI_SANITY_VERSION" >&2; then
    tool_missing "$name"; return 1
  fi
  tool_find "$name"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  case "${1:-}:${2:-}" in
    find:?*) tool_find "$2" || { tool_missing "$2"; exit 1; } ;;
    provide:?*) tool_provide "$2" ;;
    *) echo "usage: $0 find|provide NAME" >&2; exit 2 ;;
  esac
fi
