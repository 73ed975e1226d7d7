#!/usr/bin/env bash
# First contact, rehearsed: a bare Debian bookworm (debootstrap minbase + git, curl,
# ca-certificates) with rustup toolchains copied from this host, a fresh clone, and the README's
# two commands run exactly as written, as root. Reports wall times. docs/first-contact.md has the
# results and what a fresh machine needs. Run as root on the host:
#   tests/fresh/rehearse.sh [PHASE...]     default: setup quickstart tests noshared newcomer
#     setup       debootstrap (once), the toolchains (once), a fresh clone (always: a cold build)
#     quickstart  packaging/local/start.sh serves; the README's lifecycle blocks from $HOME;
#                 Ctrl-C (SIGINT); nothing left: no mount, loop device, socket or directory
#     tests       CI=true ./tests/run.sh, under flock /run/lock/ebs-k8s.lock (one cluster a host)
#     k8s         the Kubernetes tier alone, on the tests phase's build
#     noshared    no ../shared and no Go proxy: tools.sh, fetch-tools.sh and the two tests that
#                 need them must fail at once under CI=true, saying what to do (reuses the tests
#                 phase's build)
#     newcomer    the newcomer's own run: no ../shared, no CI=true, the toolchain
#                 $FRESH_TOOLCHAIN instead of the pinned one: ./tests/run.sh must exit 0 and
#                 list every skip (the Kubernetes tier's scenarios, csi-sanity) in its summary
# Environment:
#   FRESH_ROOT       the chroot (default: target/fresh/bookworm of this checkout)
#   FRESH_SRC        the repository to clone (default: this checkout); FRESH_REV (its HEAD)
#   FRESH_SHARED     bound read-only at ../shared beside the clone for the phases that want it
#                    (default: shared/ beside this checkout, when there is one; empty: none)
#   FRESH_MIRROR     (http://deb.debian.org/debian)
#   FRESH_TOOLCHAIN  the rustup toolchain of the newcomer phase (default: stable, i.e. what
#                    rustup's installer gives today). It is copied from this host's rustup, so it
#                    must be installed here (`rustup toolchain install stable` where the network
#                    allows; on a machine whose network reaches no Rust distribution server the
#                    host's "stable" is what it is: see docs/first-contact.md). Inside the chroot
#                    it is selected with RUSTUP_TOOLCHAIN, which wins over rust-toolchain.toml.
# Each phase runs in its own mount namespace (private propagation): /proc, /sys (with
# /sys/fs/cgroup), /dev (with /dev/pts, /dev/shm, loop-control), a tmpfs /run and ../shared are
# mounted there only, so they vanish with it, also when a phase fails. The network is the host's:
# apt, crates.io and PyPI must be reachable (a fresh machine downloads its packages). Processes
# left inside the chroot are stopped by PID at exit. Idempotent.
set -euo pipefail
checkout="$(cd "$(dirname "$0")/../.." && pwd -P)"
root="${FRESH_ROOT:-$checkout/target/fresh/bookworm}"
src="${FRESH_SRC:-$checkout}"
rev="${FRESH_REV:-$(git -C "$src" rev-parse HEAD)}"
default_shared="$(dirname "$checkout")/shared"
[[ -d $default_shared ]] || default_shared=""
shared="${FRESH_SHARED-$default_shared}"
mirror="${FRESH_MIRROR:-http://deb.debian.org/debian}"
toolchain="${FRESH_TOOLCHAIN:-stable}"
phases=("$@")
((${#phases[@]})) || phases=(setup quickstart tests noshared newcomer)
[[ $(id -u) -eq 0 ]] || { echo "rehearse.sh: run as root" >&2; exit 1; }
out="$root/src/rehearsal"
times="$out/times"
namespaces="$out/namespaces"

log() { printf '%s rehearse: %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$times" >&2; }

# Stops every process of the phases' mount namespaces (recorded by in_chroot) or whose root is
# the chroot (only this script starts any), by PID.
stop_chroot_processes() {
  local p r n pids=()
  for p in /proc/[0-9]*; do
    r="$(readlink "$p/root" 2>/dev/null)" || continue
    n="$(readlink "$p/ns/mnt" 2>/dev/null)" || continue
    if [[ "$r" == "$root" || "$r" == "$root"/* ]] || grep -qxF -- "$n" "$namespaces" 2>/dev/null; then
      pids+=("${p#/proc/}")
    fi
  done
  ((${#pids[@]})) || return 0
  echo "rehearse: stopping leftover processes ${pids[*]}" >&2
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 3
  kill -KILL "${pids[@]}" 2>/dev/null || true
}
cleanup() {
  stop_chroot_processes
  # The mounts live in the phases' namespaces; a mount under the chroot in the host's namespace
  # would be a bug of this script, but is not left behind either.
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(
    awk -v r="$root" 'index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r)
}
trap cleanup EXIT

# Runs bash -c "$2" as root inside the chroot, in a mount namespace of its own; $1: bind
# ../shared (1) or not (0). The environment is what a login shell after rustup's installer has.
# The chroot becomes the namespace's root by pivot_root, not chroot(2), as a booted machine's /
# is its namespace's root: in a chroot, runc's pivot_root moves the chroot's mount and not the
# namespace's root, so `runc exec` (kubectl exec) joined the container's mount namespace at the
# host's / and saw none of the container's files (rehearsal of 2026-11-26). / is then made
# rshared, as systemd makes it: the agent container's Bidirectional mounts must reach kubelet and
# the pods (the namespace is private: peers inside it only). Its id is recorded for the clean-up.
in_chroot() {
  local with_shared="$1" cmd="$2"
  # shellcheck disable=SC2016 # the inner script expands its own arguments
  unshare --mount --propagation private -- bash -euc '
    r="$1" s="$2" ns="$3"; shift 3
    readlink /proc/self/ns/mnt >>"$ns"
    mount --bind "$r" "$r"                # pivot_root wants a mount point
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"           # /sys/fs/cgroup too: containerd, kubelet
    mount --rbind /dev "$r/dev"           # loop-control and loop devices, pts, shm
    mount -t tmpfs -o mode=0755 run "$r/run"
    mkdir -p "$r/run/lock" "$r/src/shared" "$r/.oldroot"
    if [[ -n "$s" ]]; then
      mount --bind "$s" "$r/src/shared"
      mount -o remount,bind,ro "$r/src/shared"
    fi
    cd "$r"
    pivot_root . .oldroot
    exec /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb USER=root \
      PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      RUSTUP_HOME=/root/.rustup CARGO_HOME=/root/.cargo ${GOPROXY+GOPROXY="$GOPROXY"} \
      ${RUSTUP_TOOLCHAIN+RUSTUP_TOOLCHAIN="$RUSTUP_TOOLCHAIN"} ${CI+CI="$CI"} bash -c "umount -l /.oldroot && mount --make-rshared / && cd / && $1"
  ' _ "$root" "$([[ $with_shared == 1 ]] && echo "$shared")" "$namespaces" "$cmd"
}

# Wall time of a phase: runs "$@", logs its seconds and exit code, returns the code.
timed() {
  local name="$1" t0 rc=0
  shift
  t0=$(date +%s)
  "$@" || rc=$?
  log "$name: $(($(date +%s) - t0)) s, exit $rc"
  return "$rc"
}

phase_setup() {
  if [[ ! -e "$root/.debootstrap-done" ]]; then
    command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
    rm -rf "$root"
    timed debootstrap debootstrap --variant=minbase --include=git,curl,ca-certificates \
      bookworm "$root" "$mirror"
    touch "$root/.debootstrap-done"
  fi
  mkdir -p "$out"
  # What any installed Debian has and minbase leaves out: name resolution of localhost.
  [[ -s "$root/etc/hosts" ]] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n' \
    >"$root/etc/hosts"
  cp -f /etc/resolv.conf "$root/etc/resolv.conf"
  # What every machine of this site has: its local certificate authorities (here the egress
  # proxy's, without which apt works over http but crates.io and PyPI fail TLS).
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp -f /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null
  fi
  # The toolchain as rustup's installer leaves it: the default toolchain, rustup's settings and
  # the proxies in ~/.cargo/bin (no registry cache: crates come from crates.io). Then the one
  # rust-toolchain.toml pins (rustup would download it at the first cargo call, as on a
  # newcomer's machine; copied, since this site's network may not reach Rust's servers) and the
  # newcomer phase's $FRESH_TOOLCHAIN.
  local rh="${RUSTUP_HOME:-$HOME/.rustup}" ch="${CARGO_HOME:-$HOME/.cargo}" tc pin host
  tc="$(sed -n 's/^default_toolchain = "\(.*\)"$/\1/p' "$rh/settings.toml")"
  pin="$(sed -n 's/^channel = "\(.*\)"$/\1/p' "$src/rust-toolchain.toml" 2>/dev/null || true)"
  host="$(rustc -vV | sed -n 's/^host: //p')"
  if [[ ! -x "$root/root/.cargo/bin/cargo" ]]; then
    mkdir -p "$root/root/.rustup/toolchains" "$root/root/.cargo"
    cp -a "$rh/settings.toml" "$root/root/.rustup/"
    cp -a "$ch/bin" "$root/root/.cargo/"
    # shellcheck disable=SC2016 # expanded by the chroot's shell, as rustup's own env file is
    printf 'export PATH="$HOME/.cargo/bin:$PATH"\n' >"$root/root/.cargo/env"
  fi
  local t
  for t in "$tc" ${pin:+"$pin-$host"} "$toolchain-$host"; do
    [[ -e "$root/root/.rustup/toolchains/$t" ]] && continue
    if [[ ! -e "$rh/toolchains/$t" ]]; then
      log "setup: toolchain $t is not installed on this host (rustup toolchain install ${t%-"$host"}); the phases that need it fail"
      continue
    fi
    cp -a "$(readlink -f "$rh/toolchains/$t")" "$root/root/.rustup/toolchains/$t"
    log "setup: toolchain $t: $("$rh/toolchains/$t/bin/rustc" -V)"
  done
  # A fresh clone of the revision under test, ../shared beside it as on CI.
  rm -rf "$root/src/main"
  git clone -q --no-local "$src" "$root/src/main"
  git -C "$root/src/main" checkout -q "$rev"
  log "setup: $(git -C "$root/src/main" log --oneline -1)"
}

phase_quickstart() {
  cat >"$out/quickstart.sh" <<'EOF'
set -u
cd /src/main
sock=/run/ebs-node-agent/csi.sock
t0=$(date +%s)
# The README's first command, in the background as in its own shell.
setsid ./packaging/local/start.sh >/src/rehearsal/start.log 2>&1 </dev/null &
pid=$!
until [[ -S $sock ]]; do
  kill -0 "$pid" 2>/dev/null || { echo "start.sh exited before serving"; tail -30 /src/rehearsal/start.log; exit 1; }
  sleep 2
done
echo "quickstart: serving after $(($(date +%s) - t0)) s"
# The README's lifecycle blocks, in "another shell" from $HOME; R as start.sh prints it.
awk '/^```sh runnable$/ {f = 1; next} /^```$/ {f = 0} f' README.md |
  sed 's|^R=.*|R=/src/main|' >/src/rehearsal/lifecycle.sh
(cd "$HOME" && bash -e /src/rehearsal/lifecycle.sh) >/src/rehearsal/lifecycle.log 2>&1
rc=$?
echo "quickstart: lifecycle exit $rc"; cat /src/rehearsal/lifecycle.log
kill -INT "$pid"; wait "$pid"; echo "quickstart: agent exit $? after SIGINT"
left=0
grep ' /mnt/ebs-node-agent' /proc/mounts && left=1
[[ -e $sock ]] && { echo "left: $sock"; left=1; }
[[ -n "$(ls -A /mnt/ebs-node-agent)" ]] && { echo "left in /mnt/ebs-node-agent:"; ls -A /mnt/ebs-node-agent; left=1; }
losetup -a | grep /var/lib/ebs-node-agent && left=1
ls -A /var/lib/ebs-node-agent
echo "quickstart: leftovers $left"
exit $((rc || left))
EOF
  timed quickstart in_chroot 1 "bash /src/rehearsal/quickstart.sh" 2>&1 | tee "$out/quickstart.out"
  return "${PIPESTATUS[0]}"
}

phase_tests() {
  local rc=0
  # The Kubernetes tier brings up the host's one cluster: the lock is the host's.
  log "tests: waiting for /run/lock/ebs-k8s.lock"
  {
    flock 9
    CI=true timed tests in_chroot 1 'cd /src/main && ./tests/run.sh' >"$out/tests.log" 2>&1 || rc=$?
  } 9>/run/lock/ebs-k8s.lock
  sed -n '/^== summary ==$/,$p' "$out/tests.log"
  log "disk: $(du -sh "$root/src/main/target" | cut -f1) target/, $(du -sh "$root/root/.cargo/registry" 2>/dev/null | cut -f1) cargo registry"
  return "$rc"
}

# The Kubernetes tier alone, on the tests phase's build (to check a fix to the chroot's setup).
phase_k8s() {
  local rc=0
  {
    flock 9
    CI=true timed k8s in_chroot 1 'cd /src/main && cargo test --locked -p ebs-tests \
      --features ebs-node-agent/test-hooks --test kubernetes' >"$out/k8s.log" 2>&1 || rc=$?
  } 9>/run/lock/ebs-k8s.lock
  grep -E '^test |^test result' "$out/k8s.log"
  return "$rc"
}

phase_noshared() {
  cat >"$out/noshared.sh" <<'EOF'
cd /src/main
t0=$(date +%s%N)
bash tests/tools.sh provide csi-sanity
echo "tools.sh provide: exit $?, $((($(date +%s%N) - t0) / 1000000)) ms"
cargo build --workspace --bins --locked --features ebs-node-agent/test-hooks -q
bash tests/k8s/fetch-tools.sh find; echo "fetch-tools.sh find: exit $?"
# The two tests that use ../shared: each must fail at once under CI=true, saying what to do
# (the Kubernetes tier: each scenario FAILED with the reason, and a `test result` line).
for t in csi_sanity kubernetes; do
  t0=$(date +%s)
  cargo test -q --locked -p ebs-tests --features ebs-node-agent/test-hooks --test "$t" 2>&1 | tail -25
  echo "$t: exit ${PIPESTATUS[0]}, $(($(date +%s) - t0)) s"
done
EOF
  # Without ../shared the Kubernetes tier cannot start a cluster, but the lock costs nothing.
  {
    flock 9
    GOPROXY="" timed noshared-default in_chroot 0 "CI=true bash /src/rehearsal/noshared.sh"
    GOPROXY=off timed noshared-goproxy-off in_chroot 0 "CI=true bash /src/rehearsal/noshared.sh"
  } 9>/run/lock/ebs-k8s.lock 2>&1 | tee "$out/noshared.out"
  return "${PIPESTATUS[0]}"
}

# The newcomer's run as the issue rehearsed it: no ../shared, no CI=true, another toolchain than
# the pinned one (RUSTUP_TOOLCHAIN wins over rust-toolchain.toml). Must exit 0 and list every
# skip with its reason; the disk it took is logged. target/tools goes first: what earlier phases
# unpacked there from ../shared (csi-sanity) a newcomer does not have.
phase_newcomer() {
  local rc=0
  {
    flock 9
    RUSTUP_TOOLCHAIN="$toolchain" timed newcomer in_chroot 0 \
      'cd /src/main && rm -rf target/tools && rustc -V && ./tests/run.sh' >"$out/newcomer.log" 2>&1 || rc=$?
  } 9>/run/lock/ebs-k8s.lock
  sed -n '/^== summary ==$/,$p' "$out/newcomer.log"
  grep -q '^SKIPPED: .*kubernetes::k8s_' "$out/newcomer.log" ||
    { log "newcomer: the Kubernetes tier's skip is not in the summary"; rc=1; }
  grep -q '^SKIPPED: .*csi-sanity' "$out/newcomer.log" ||
    { log "newcomer: csi-sanity's skip is not in the summary"; rc=1; }
  log "newcomer: $(head -1 "$out/newcomer.log"); disk: $(du -sh "$root/src/main/target" | cut -f1) target/"
  return "$rc"
}

mkdir -p "$out"
: >"$namespaces"
for p in "${phases[@]}"; do
  case "$p" in
    setup | quickstart | tests | k8s | noshared | newcomer) "phase_$p" || log "$p failed" ;;
    *) echo "rehearse.sh: unknown phase $p" >&2; exit 2 ;;
  esac
done
log "done; times in $times"
