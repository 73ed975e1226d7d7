#!/usr/bin/env bash
# A one-node Kubernetes on 127.0.0.1 for the test suite, every piece of state under one directory.
#   tests/k8s/cluster.sh up   DIR   # etcd, apiserver, controller-manager, scheduler, containerd, kubelet
#   tests/k8s/cluster.sh down DIR   # stops what `up` started and removes DIR (also after a failed up)
#   tests/k8s/cluster.sh restart-kubelet DIR
#   tests/k8s/cluster.sh reboot DIR   # everything dies, what a reboot loses goes, then it starts again
# Binaries: $K8S_TOOLS (shared/tools/k8s: kube-*.xz, kubelet.xz, kubectl.xz), unpacked once into
# $K8S_BIN (default target/k8s/bin). etcd, containerd, runc and the CNI plugins come from Debian
# (tests/deps.sh). Facts behind the flags: shared/tools/k8s/README.md (loopback only, cgroup v1,
# no image pulls).
set -euo pipefail
cmd=${1:?up|down}
D=${2:?state directory}
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
BIN=${K8S_BIN:-$repo/target/k8s/bin}

log() { printf '[k8s %s] %s\n' "$(date +%T)" "$*" >&2; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

unpack() {
  mkdir -p "$BIN"
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
    if [[ ! -x $BIN/$b || $K8S_TOOLS/$b.xz -nt $BIN/$b ]]; then
      xz -dc "$K8S_TOOLS/$b.xz" >"$BIN/$b.tmp" && chmod +x "$BIN/$b.tmp" && mv "$BIN/$b.tmp" "$BIN/$b"
    fi
  done
}

# start NAME CMD...: runs CMD in the background with its log under DIR/logs; records the PID.
start() {
  local name=$1; shift
  setsid "$@" >"$D/logs/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$D/pids"
}

wait_for() { # wait_for SECONDS DESCRIPTION CMD...
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then log "timed out waiting for $what"; return 1; fi
    sleep 0.5
  done
}

certs() {
  local p=$D/pki
  mkdir -p "$p"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" -days 2 \
    -subj /CN=ebs-k8s-test-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$p/apiserver.key" -out "$p/apiserver.csr" \
    -subj /CN=kube-apiserver 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes.default.svc\n' >"$p/san.ext"
  openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -out "$p/apiserver.crt" -days 2 -extfile "$p/san.ext" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$p/admin.key" -out "$p/admin.csr" \
    -subj "/O=system:masters/CN=admin" 2>/dev/null
  openssl x509 -req -in "$p/admin.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -out "$p/admin.crt" -days 2 2>/dev/null
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  cat >"$D/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$p/ca.crt"}
users:
- name: admin
  user: {client-certificate: "$p/admin.crt", client-key: "$p/admin.key"}
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
KC
}

containerd_config() {
  local c=$D/containerd
  mkdir -p "$c/root" "$c/state" "$c/opt" "$D/cni/net.d"
  # Images and container layers in memory: unpacked and thrown away much faster than on disk.
  mount -t tmpfs -o size=4g,mode=0700 ebs-k8s-containerd "$c/root"
  # Every registry the manifests name points at a closed loopback port: a missing image fails
  # at once instead of reaching out.
  local r
  for r in registry.k8s.io ghcr.io docker.io public.ecr.aws _default; do
    mkdir -p "$c/certs.d/$r"
    printf 'server = "http://127.0.0.1:1"\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n' \
      >"$c/certs.d/$r/hosts.toml"
  done
  cat >"$D/cni/net.d/10-loopback.conflist" <<CNI
{"cniVersion": "0.4.0", "name": "lo-only", "plugins": [{"type": "loopback"}]}
CNI
  cat >"$c/config.toml" <<TOML
version = 2
root = "$c/root"
state = "$c/state"
oom_score = 0
[grpc]
  address = "$D/containerd.sock"
[ttrpc]
  address = "$D/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.1"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$D/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$c/certs.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$D/runc"
TOML
}

kubelet_config() {
  cat >"$D/kubelet.yaml" <<KY
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: ""
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
registerNode: true
podLogsDir: $D/pod-logs
KY
}

start_kubelet() {
  start kubelet "$BIN/kubelet" --config "$D/kubelet.yaml" --kubeconfig "$D/kubeconfig" \
    --root-dir "$D/kubelet" --cert-dir "$D/kubelet-pki" \
    --container-runtime-endpoint "unix://$D/containerd.sock" --hostname-override=127.0.0.1
}

# ours PID: the process is still one this cluster started (its command line names DIR), not a
# recycled PID.
ours() { grep -qF -- "$D/" "/proc/$1/cmdline" 2>/dev/null; }

# Stops kubelet (SIGKILL: no chance to tidy up, as a crash) and starts it again on the same state.
restart_kubelet() {
  stop kubelet
  start_kubelet
}

up() {
  : "${K8S_TOOLS:?K8S_TOOLS: the directory with kube-apiserver.xz and the rest}"
  mkdir -p "$D/logs"
  # Paths outside DIR that kubelet and containerd use whatever their flags say (device plugin
  # socket, /var/log/containers links, shim sockets): those this run creates are removed by down.
  local h
  for h in /var/lib/kubelet /var/log/containers /var/log/pods /run/containerd; do
    [[ -e $h ]] || echo "$h" >>"$D/created-host-paths"
  done
  # The kubelet directory is its own shared mount, so that Bidirectional propagation (the
  # agent's mounts reaching kubelet and pods) works whatever the host's / propagation is. Its
  # own peer group: a bind on a shared / joins /'s group, and every volume mount would then be
  # copied onto / below the bind too, each listed twice (seen in a chroot whose / is shared).
  mkdir -p "$D/kubelet"
  mount --bind "$D/kubelet" "$D/kubelet"
  mount --make-private "$D/kubelet"
  mount --make-rshared "$D/kubelet"
  unpack
  ETCD_PORT=$(free_port); ETCD_PEER_PORT=$(free_port); API_PORT=$(free_port)
  KCM_PORT=$(free_port); SCHED_PORT=$(free_port); KUBELET_PORT=$(free_port)
  KUBELET_HEALTHZ_PORT=$(free_port)
  declare -p ETCD_PORT API_PORT KUBELET_PORT KUBELET_HEALTHZ_PORT | sed 's/^declare -- //' >"$D/env"
  certs
  log "etcd"
  start etcd etcd --name test --data-dir "$D/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "test=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls ""
  containerd_config
  log "containerd"
  start containerd containerd --config "$D/containerd/config.toml"
  log "kube-apiserver"
  local p=$D/pki
  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --storage-backend=etcd3 --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
    --secure-port="$API_PORT" --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
    --client-ca-file="$p/ca.crt" --service-account-issuer="https://127.0.0.1:$API_PORT" \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 --authorization-mode=AlwaysAllow \
    --endpoint-reconciler-type=none --kubelet-client-certificate="$p/admin.crt" \
    --kubelet-client-key="$p/admin.key" --kubelet-preferred-address-types=InternalIP \
    --enable-priority-and-fairness=false --profiling=false --allow-privileged=true
  wait_for 90 "the apiserver's /readyz" "$BIN/kubectl" --kubeconfig "$D/kubeconfig" get --raw /readyz
  log "controller-manager, scheduler"
  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$D/kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --leader-elect=false \
    --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --use-service-account-credentials=false --profiling=false
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$D/kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --leader-elect=false --profiling=false
  wait_for 30 "containerd" ctr --address "$D/containerd.sock" version
  kubelet_config
  log "kubelet"
  start_kubelet
  wait_for 120 "the node to be Ready" "$BIN/kubectl" --kubeconfig "$D/kubeconfig" \
    wait --for=condition=Ready node/127.0.0.1 --timeout=2s
  wait_for 60 "the default service accounts" "$BIN/kubectl" --kubeconfig "$D/kubeconfig" \
    -n kube-system get serviceaccount default
  wait_for 30 "the default service account" "$BIN/kubectl" --kubeconfig "$D/kubeconfig" \
    get serviceaccount default
  log "up"
}

# Every process whose command line names our containerd socket (the shims), and every process in
# a kubepods cgroup kubelet made (pods and their children).
pod_pids() {
  grep -lF -- "$D/containerd.sock" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3 || true
  local h
  for h in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
    [[ -d $h ]] && find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
  true
}

# kill_pods: every pod process and shim (kubelet must be stopped first, so that it restarts
# nothing); the shims' ids are kept for their sockets under /run/containerd/s.
kill_pods() {
  local shim args id ns round pids
  for shim in $(grep -lF -- "$D/containerd.sock" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
    # (a shim may exit in between: the redirection's error is silenced too)
    args=$({ tr '\0' '\n' <"/proc/$shim/cmdline"; } 2>/dev/null || true)
    id=$(grep -A1 -x -- -id <<<"$args" | tail -n1 || true)
    ns=$(grep -A1 -x -- -namespace <<<"$args" | tail -n1 || true)
    [[ -n $id && -n $ns ]] && echo "$ns/$id" >>"$D/shim-ids"
  done
  for round in 1 2 3 4 5; do
    pids=$(pod_pids | sort -u)
    [[ -z $pids ]] && break
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    sleep 0.5
  done
}

# stop NAME: kills the recorded process NAME (SIGKILL, as a crash or power cut) and forgets it.
stop() {
  local name pid
  while read -r name pid; do
    if [[ $name == "$1" ]] && ours "$pid"; then
      kill -9 "$pid" 2>/dev/null || true
      while ours "$pid"; do sleep 0.1; done
    fi
  done <"$D/pids"
  grep -v "^$1 " "$D/pids" >"$D/pids.new" || true
  mv "$D/pids.new" "$D/pids"
  [[ -f $D/logs/$1.log ]] && mv "$D/logs/$1.log" "$D/logs/$1.log.$(date +%s%N)"
  true
}

# unmount_under DIR [KEEP]: every mount below DIR, deepest first (KEEP itself stays).
unmount_under() {
  local m round left
  for round in 1 2 3; do
    left=0
    while read -r m; do
      [[ -n $m && $m != "${2:-}" ]] || continue
      left=1
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(findmnt -rn -o TARGET | awk -v d="$1" 'index($0, d "/") == 1 || $0 == d' | sort -r)
    ((left)) || break
  done
}

# Loop devices whose backing files are ours: the agent's volume files, kubelet's block pins.
# The agent names its files by its own mount namespace's path (/var/lib/ebs-node-agent/...),
# so the files are matched by device and inode, not by the path losetup shows.
detach_ours() {
  local dev back ino majmin f ours_files=""
  for f in "$D"/agent-state*/volumes/* "$D"/agent-state*/snapshots/*; do
    [[ -f $f ]] && ours_files+="$(stat -c '%Hd:%Ld %i' "$f")"$'\n'
  done
  while read -r dev ino majmin back; do
    if [[ $back == "$D"/* ]] || { [[ -n $ino ]] && grep -qxF "$majmin $ino" <<<"$ours_files"; }; then
      losetup -d "$dev" 2>/dev/null || true
    fi
  done < <(losetup -l -n -O NAME,BACK-INO,BACK-MAJ:MIN,BACK-FILE 2>/dev/null)
}

remove_kubepods_cgroups() {
  local h
  for h in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
    [[ -d $h ]] && find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  true
}

# A node "reboot": kubelet, the pods, the shims and containerd die at once (SIGKILL); what a
# reboot loses goes: every mount under kubelet's directory (pods' volumes, the agent's staging
# mounts) but the directory itself (the root filesystem), containerd's and runc's run-time state
# (tmpfs on a real node: sandboxes' shm, container rootfs mounts), loop devices, the kubepods
# cgroups. Disks (the agent's volume files), kubelet's and the agent's state stay. Then
# containerd and kubelet start again.
reboot() {
  stop kubelet
  kill_pods
  stop containerd
  unmount_under "$D/kubelet" "$D/kubelet"
  unmount_under "$D/containerd/state"
  detach_ours
  remove_kubepods_cgroups
  rm -rf --one-file-system "$D/containerd/state" "$D/runc"
  mkdir -p "$D/containerd/state"
  start containerd containerd --config "$D/containerd/config.toml"
  wait_for 30 "containerd" ctr --address "$D/containerd.sock" version
  start_kubelet
}

down() {
  [[ -d $D ]] || return 0
  local name pid id
  # kubelet first, so that it restarts nothing; then the pods and shims; then the rest.
  if [[ -f $D/pids ]]; then
    while read -r name pid; do
      [[ $name == kubelet ]] && ours "$pid" && kill -9 "$pid" 2>/dev/null || true
    done <"$D/pids"
  fi
  log "down: pods and shims"
  kill_pods
  if [[ -f $D/pids ]]; then
    while read -r name pid; do ours "$pid" && kill -9 "$pid" 2>/dev/null || true; done <"$D/pids"
    while read -r name pid; do
      while ours "$pid"; do sleep 0.1; done
    done <"$D/pids"
  fi
  log "down: mounts, loop devices, cgroups"
  # Mounts under DIR, deepest first (pods' volumes, the agent's staging mounts, container
  # rootfs and shm, the kubelet bind mount itself).
  unmount_under "$D"
  detach_ours
  remove_kubepods_cgroups
  # Outside DIR: the links kubelet made to our pods' logs, the sockets of our shims (containerd
  # names them sha256(<its address>/<namespace>/<id>) under /run/containerd/s), and the host
  # paths that did not exist before up.
  find /var/log/containers -maxdepth 1 -type l -lname "$D/*" -delete 2>/dev/null || true
  local task h
  for task in "$D"/containerd/state/io.containerd.runtime.v2.task/*/*; do
    [[ -d $task ]] && echo "$(basename "$(dirname "$task")")/$(basename "$task")" >>"$D/shim-ids"
  done
  if [[ -f $D/shim-ids ]]; then
    while read -r id; do
      rm -f "/run/containerd/s/$(printf '%s' "$D/containerd.sock/$id" | sha256sum | cut -d' ' -f1)"
    done < <(sort -u "$D/shim-ids")
  fi
  rmdir /run/containerd/s 2>/dev/null || true
  if [[ -f $D/created-host-paths ]]; then
    while read -r h; do
      [[ -n $h && $h == /* ]] && rm -rf --one-file-system "$h"
    done <"$D/created-host-paths"
  fi
  log "down: removing $D"
  rm -rf --one-file-system "$D"
  log "down: done"
}

case $cmd in
  up) up ;;
  down) down ;;
  restart-kubelet) restart_kubelet ;;
  reboot) reboot ;;
  *) echo "usage: $0 up|down|restart-kubelet|reboot DIR" >&2; exit 2 ;;
esac
