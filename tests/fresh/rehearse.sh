#!/usr/bin/env bash
# First contact, rehearsed: a bare Debian bookworm (debootstrap minbase + git, curl,
# ca-certificates) with a rustup toolchain copied from this host, a fresh clone, and the README's
# two commands run exactly as written, as root. Reports wall times. docs/first-contact.md has the
# results and what a fresh machine needs. Run as root on the host:
#   tests/fresh/rehearse.sh [PHASE...]     default: setup quickstart tests noshared
#     setup       debootstrap (once), the toolchain (once), a fresh clone (always: a cold build)
#     quickstart  packaging/local/start.sh serves; the README's lifecycle blocks from $HOME;
#                 Ctrl-C (SIGINT); nothing left: no mount, loop device, socket or directory
#     tests       CI=true ./tests/run.sh, under flock /run/lock/ebs-k8s.lock (one cluster a host)
#     k8s         the Kubernetes tier alone, on the tests phase's build
#     noshared    no ../shared and no Go proxy: tools.sh and the conformance test must fail at
#                 once, saying what to do (reuses the tests phase's build)
# Environment: FRESH_ROOT (/work/chroot/bookworm), FRESH_SRC (/work/main), FRESH_REV (HEAD of
# FRESH_SRC), FRESH_SHARED (/work/shared, bound read-only at ../shared beside the clone),
# FRESH_MIRROR (http://deb.debian.org/debian).
# Each phase runs in its own mount namespace (private propagation): /proc, /sys (with
# /sys/fs/cgroup), /dev (with /dev/pts, /dev/shm, loop-control), a tmpfs /run and ../shared are
# mounted there only, so they vanish with it, also when a phase fails. The network is the host's:
# apt, crates.io and PyPI must be reachable (a fresh machine downloads its packages). Processes
# left inside the chroot are stopped by PID at exit. Idempotent.
set -euo pipefail
root="${FRESH_ROOT:-/work/chroot/bookworm}"
src="${FRESH_SRC:-/work/main}"
rev="${FRESH_REV:-$(git -C "$src" rev-parse HEAD)}"
shared="${FRESH_SHARED-/work/shared}"
mirror="${FRESH_MIRROR:-http://deb.debian.org/debian}"
phases=("$@")
((${#phases[@]})) || phases=(setup quickstart tests noshared)
[[ $(id -u) -eq 0 ]] || { echo "rehearse.sh: run as root" >&2; exit 1; }
out="$root/work/rehearsal"
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
    mkdir -p "$r/run/lock" "$r/work/shared" "$r/.oldroot"
    if [[ -n "$s" ]]; then
      mount --bind "$s" "$r/work/shared"
      mount -o remount,bind,ro "$r/work/shared"
    fi
    cd "$r"
    pivot_root . .oldroot
    exec /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb USER=root \
      PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      RUSTUP_HOME=/root/.rustup CARGO_HOME=/root/.cargo ${GOPROXY+GOPROXY="$GOPROXY"} \
      ${CI+CI="$CI"} bash -c "umount -l /.oldroot && mount --make-rshared / && cd / && $1"
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
  # the proxies in ~/.cargo/bin (no registry cache: crates come from crates.io).
  local rh="${RUSTUP_HOME:-$HOME/.rustup}" ch="${CARGO_HOME:-$HOME/.cargo}" tc
  tc="$(sed -n 's/^default_toolchain = "\(.*\)"$/\1/p' "$rh/settings.toml")"
  if [[ ! -x "$root/root/.cargo/bin/cargo" ]]; then
    mkdir -p "$root/root/.rustup/toolchains" "$root/root/.cargo"
    cp -a "$rh/settings.toml" "$root/root/.rustup/"
    cp -a "$(readlink -f "$rh/toolchains/$tc")" "$root/root/.rustup/toolchains/$tc"
    cp -a "$ch/bin" "$root/root/.cargo/"
    # shellcheck disable=SC2016 # expanded by the chroot's shell, as rustup's own env file is
    printf 'export PATH="$HOME/.cargo/bin:$PATH"\n' >"$root/root/.cargo/env"
  fi
  # A fresh clone of the revision under test, ../shared beside it as on CI.
  rm -rf "$root/work/main"
  git clone -q --no-local "$src" "$root/work/main"
  git -C "$root/work/main" checkout -q "$rev"
  log "setup: $(git -C "$root/work/main" log --oneline -1)"
}

phase_quickstart() {
  cat >"$out/quickstart.sh" <<'EOF'
set -u
cd /work/main
sock=/run/ebs-node-agent/csi.sock
t0=$(date +%s)
# The README's first command, in the background as in its own shell.
setsid ./packaging/local/start.sh >/work/rehearsal/start.log 2>&1 </dev/null &
pid=$!
until [[ -S $sock ]]; do
  kill -0 "$pid" 2>/dev/null || { echo "start.sh exited before serving"; tail -30 /work/rehearsal/start.log; exit 1; }
  sleep 2
done
echo "quickstart: serving after $(($(date +%s) - t0)) s"
# The README's lifecycle blocks, in "another shell" from $HOME; R as start.sh prints it.
awk '/^```sh runnable$/ {f = 1; next} /^```$/ {f = 0} f' README.md |
  sed 's|^R=.*|R=/work/main|' >/work/rehearsal/lifecycle.sh
(cd "$HOME" && bash -e /work/rehearsal/lifecycle.sh) >/work/rehearsal/lifecycle.log 2>&1
rc=$?
echo "quickstart: lifecycle exit $rc"; cat /work/rehearsal/lifecycle.log
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
  timed quickstart in_chroot 1 "bash /work/rehearsal/quickstart.sh" 2>&1 | tee "$out/quickstart.out"
  return "${PIPESTATUS[0]}"
}

phase_tests() {
  local rc=0
  # The Kubernetes tier brings up the host's one cluster: the lock is the host's.
  log "tests: waiting for /run/lock/ebs-k8s.lock"
  {
    flock 9
    CI=true timed tests in_chroot 1 'cd /work/main && ./tests/run.sh' >"$out/tests.log" 2>&1 || rc=$?
  } 9>/run/lock/ebs-k8s.lock
  sed -n '/^== summary ==$/,$p' "$out/tests.log"
  log "disk: $(du -sh "$root/work/main/target" | cut -f1) target/, $(du -sh "$root/root/.cargo/registry" 2>/dev/null | cut -f1) cargo registry"
  return "$rc"
}

# The Kubernetes tier alone, on the tests phase's build (to check a fix to the chroot's setup).
phase_k8s() {
  local rc=0
  {
    flock 9
    CI=true timed k8s in_chroot 1 'cd /work/main && cargo test --locked -p ebs-tests \
      --features ebs-node-agent/test-hooks --test kubernetes' >"$out/k8s.log" 2>&1 || rc=$?
  } 9>/run/lock/ebs-k8s.lock
  grep -E '^test |^test result' "$out/k8s.log"
  return "$rc"
}

phase_noshared() {
  cat >"$out/noshared.sh" <<'EOF'
cd /work/main
t0=$(date +%s%N)
bash tests/tools.sh provide csi-sanity
echo "tools.sh provide: exit $?, $((($(date +%s%N) - t0) / 1000000)) ms"
cargo build --workspace --bins --locked --features ebs-node-agent/test-hooks -q
# The two tests that use ../shared: each must fail at once under CI=true, saying what to do.
for t in csi_sanity kubernetes; do
  t0=$(date +%s)
  cargo test -q --locked -p ebs-tests --features ebs-node-agent/test-hooks --test "$t" 2>&1 | tail -25
  echo "$t: exit ${PIPESTATUS[0]}, $(($(date +%s) - t0)) s"
done
EOF
  # Without ../shared the Kubernetes tier cannot start a cluster, but the lock costs nothing.
  {
    flock 9
    GOPROXY="" timed noshared-default in_chroot 0 "CI=true bash /work/rehearsal/noshared.sh"
    GOPROXY=off timed noshared-goproxy-off in_chroot 0 "CI=true bash /work/rehearsal/noshared.sh"
  } 9>/run/lock/ebs-k8s.lock 2>&1 | tee "$out/noshared.out"
  return "${PIPESTATUS[0]}"
}

mkdir -p "$out"
: >"$namespaces"
for p in "${phases[@]}"; do
  case "$p" in
    setup | quickstart | tests | k8s | noshared) "phase_$p" || log "$p failed" ;;
    *) echo "rehearse.sh: unknown phase $p" >&2; exit 2 ;;
  esac
done
log "done; times in $times"
