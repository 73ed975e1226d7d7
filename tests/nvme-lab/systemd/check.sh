#!/bin/bash
# The systemd guest's checks (run by ebs-lab.service from the payload disk at /lab, systemd PID 1):
# install the agent as docs/operations/systemd.md says, then READY after recovery, an ebs lifecycle
# over the default socket, restarts after SIGKILL and SIGSEGV, the watchdog, the drain on
# `systemctl stop`, the journal free of denied syscalls, and `doctor` under the unit's sandbox.
# One `LAB ...` line per result on the serial console; the last is `LAB DONE pass=N fail=M`.
. /lab/lab.env
pass=0
fail=0
ok() { echo "LAB ok   $*"; pass=$((pass + 1)); }
bad() { echo "LAB FAIL $*"; fail=$((fail + 1)); }
now_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }
U=ebs-node-agent
J() { journalctl -u "$U" -o cat --no-pager; }
finish() {
  echo "LAB DONE pass=$pass fail=$fail"
  [ "$fail" -ne 0 ] && journalctl -u "$U" -o short-monotonic --no-pager | tail -n 80 | sed 's/^/LAB journal /'
  sync
  systemctl poweroff -ff
}
trap finish EXIT
# A check that hangs still reports: the journal, then power off, before the host's timeout.
(
  sleep $((DEADLINE - $(now_ms) / 1000))
  echo "LAB FAIL guest deadline (${DEADLINE} s after boot) reached"
  echo "LAB DONE pass=$pass fail=1"
  journalctl -o short-monotonic --no-pager | grep -v kernel: | tail -n 100 | sed 's/^/LAB journal /'
  sync
  systemctl poweroff -ff
) &
prop() { systemctl show -P "$1" "$U"; }
# wait_for SECONDS CMD...: polls CMD until it succeeds; fails after SECONDS.
wait_for() {
  local until=$(($(now_ms) + $1 * 1000))
  shift
  until "$@"; do [ "$(now_ms)" -gt "$until" ] && return 1; sleep 0.2; done
}
# The client with the default endpoint (unix:///run/ebs-node-agent/csi.sock): no --endpoint.
C() { timeout 120 /usr/local/bin/ebs-node-agent client "$@"; }
ready() { C --json identity probe 2>/dev/null | grep -q '"ready":true'; }
restarted() { [ "$(prop NRestarts)" = "$1" ] && [ "$(prop ActiveState)" = active ]; }
serial_of() { tr -d ' ' <"$1" 2>/dev/null; }
ns_of() {
  for d in /sys/block/nvme*; do
    [ "$(cat "$d/hidden" 2>/dev/null)" = 1 ] && continue
    [ "$(serial_of "$d/device/serial")" = "$1" ] && { echo "${d##*/}"; return 0; }
  done
  return 1
}
mounted() { grep -q " $1 " /proc/mounts; }
step() {
  local name=$1 t
  shift
  t=$(now_ms)
  if "$@" >/tmp/out 2>&1; then ok "$name ($(($(now_ms) - t)) ms)"; return 0; fi
  bad "$name: $(tail -c 400 /tmp/out)"
  return 1
}

echo "LAB guest kernel $(uname -r), $(systemctl --version | head -1), PID 1 $(cat /proc/1/comm)"
echo "LAB boot $(systemd-analyze time 2>/dev/null | head -1)"

# --- Install exactly as the guide says (its `install` lines, run from a tree shaped like the
# checkout), then edit the env file, then its `systemctl daemon-reload && systemctl enable --now`.
if cd /lab && bash -e /lab/guide-install.sh; then ok "installed as docs/operations/systemd.md says"; else bad "guide install failed"; fi
cd /
cat >>/etc/ebs-node-agent/ebs-node-agent.env <<ENV
EBS_AGENT_NODE_ID=i-lab
EBS_AGENT_ZONE=lab-zone-1a
EBS_AGENT_IMDS_DISABLED=true
EBS_AGENT_EBS_MODEL=$MODEL
ENV

# --- READY only after start-up recovery: `systemctl start` of a Type=notify unit returns at READY=1.
t=$(now_ms)
if systemctl daemon-reload && systemctl enable --now "$U" 2>/tmp/out; then
  took=$(($(now_ms) - t))
  # One probe, no retry: ready the moment `enable --now` returned.
  if ready; then ok "enable --now returned after READY=1 ($took ms); the first Probe answers ready"; else bad "not ready when enable --now returned"; fi
  J | grep -m1 'start-up recovery done' | sed 's/^/LAB agent /'
else
  bad "enable --now: $(cat /tmp/out)"
fi
order=$(J | grep -n -e 'start-up recovery done; ready' -e 'Started ebs-node-agent' | cut -d: -f2- | sed 's/.*\(start-up recovery done\).*/recovery/;s/.*Started.*/started/' | tr '\n' ' ')
[ "${order% }" = "recovery started" ] && ok "journal: recovery done, then systemd's Started" || bad "journal order: '$order'"
echo "LAB socket $(stat -c '%a %n' /run/ebs-node-agent /run/ebs-node-agent/csi.sock /var/lib/ebs-node-agent /var/lib/ebs-node-agent/state.redb 2>&1 | tr '\n' ' ')"
[ "$(stat -c %a /run/ebs-node-agent/csi.sock)" = 660 ] && [ "$(stat -c %a /run/ebs-node-agent)" = 750 ] &&
  ok "socket at its default path, 0660 in a 0750 directory" || bad "socket modes"

# --- An ebs lifecycle over the default socket.
N1=$(ns_of "vol${V1#vol-}")
N3=$(ns_of "vol${V3#vol-}")
echo "LAB serials: $V1=$N1 $V3=$N3"
K=/var/lib/kubelet
S=$K/plugins/kubernetes.io/csi/ebs.csi.aws.com/$V1/globalmount
T=$K/pods/pod-1/volumes/kubernetes.io~csi/$V1/mount
mkdir -p "$(dirname "$T")"
step "stage $V1" C node stage --id "$V1" --staging-path "$S"
grep -q "^/dev/$N1 $S ext4" /proc/mounts && ok "staged: /dev/$N1 on $S" || bad "not staged: $(grep kubelet /proc/mounts)"
step "publish" C node publish --id "$V1" --staging-path "$S" --target-path "$T"
echo "hello from $V1" >"$T/data" && sync && ok "write through the target path" || bad "write failed"

# --- A crash, twice: SIGKILL, then SIGSEGV (the first is taken by Rust's stack-overflow handler,
# which then restores the default action; the second kills). Restart= brings it back and start-up
# recovery finds the volume staged and published.
crash() {
  local name=$1 n=$2 pid t
  shift 2
  pid=$(prop MainPID)
  t=$(now_ms)
  "$@" "$pid"
  if wait_for 60 restarted "$n" && [ "$(prop MainPID)" != "$pid" ] && ready; then
    ok "$name: restarted by Restart= ($(($(now_ms) - t)) ms, NRestarts=$n), ready again"
  else
    bad "$name: NRestarts=$(prop NRestarts) state=$(prop ActiveState) pid $pid -> $(prop MainPID)"
  fi
  J | grep 'start-up recovery done' | tail -1 | grep -q 'volumes=1' &&
    ok "$name: recovery found the staged and published volume" ||
    bad "$name: recovery: $(J | grep 'start-up recovery done' | tail -1)"
}
segv_twice() {
  kill -SEGV "$1"
  sleep 1
  if kill -0 "$1" 2>/dev/null; then ok "first SIGSEGV taken by Rust's handler: still running"; else echo "LAB note first SIGSEGV killed it"; fi
  kill -SEGV "$1"
}
crash "kill -9" 1 kill -9
crash "SIGSEGV" 2 segv_twice
[ "$(cat "$T/data" 2>/dev/null)" = "hello from $V1" ] && mounted "$T" && ok "data readable through the target after two crashes" || bad "target after crashes: $(grep kubelet /proc/mounts)"

step "unpublish" C node unpublish --id "$V1" --target-path "$T"
step "unstage" C node unstage --id "$V1" --staging-path "$S"
mounted "$S" || mounted "$T" && bad "still mounted after unstage" || ok "nothing mounted after unstage"

# --- The drain: a stage waits for its device (the controller is off the PCI bus), `systemctl stop`
# comes, the device comes back: the call completes and is answered, then the agent exits.
S3=$K/plugins/kubernetes.io/csi/ebs.csi.aws.com/$V3/globalmount
pci=
for c in /sys/class/nvme/nvme*; do [ "$(serial_of "$c/serial")" = "vol${V3#vol-}" ] && pci=$(readlink -f "$c/device"); done
echo 1 >"$pci/remove"
(C node stage --id "$V3" --staging-path "$S3" >/tmp/out3 2>&1; echo $? >/tmp/rc3) &
stage_pid=$!
wait_for 60 sh -c "journalctl -u $U -o cat | grep -q 'device not there yet'" || bad "stage never waited"
systemctl stop "$U" &
stop_pid=$!
wait_for 30 sh -c "journalctl -u $U -o cat | grep -q 'SIGTERM: draining'" || bad "no SIGTERM"
state=$(prop ActiveState)
echo 1 >/sys/bus/pci/rescan
wait "$stage_pid"
wait "$stop_pid"
if [ "$state" = deactivating ] && [ "$(cat /tmp/rc3)" = 0 ] && mounted "$S3" && [ "$(prop ActiveState)" = inactive ] &&
  [ "$(prop Result)" = success ]; then
  ok "drain: a stage in flight at SIGTERM ($state) completed and was answered; then a clean exit"
else
  bad "drain: state at stop $state, stage rc $(cat /tmp/rc3) $(tail -c 200 /tmp/out3), now $(prop ActiveState) result $(prop Result)"
fi
order=$(J | grep -e 'SIGTERM: draining' -e 'rpc="NodeStageVolume"' -e 'stopped$' | tail -3 |
  sed 's/.*SIGTERM.*/sigterm/;s/.*NodeStageVolume.*/stage/;s/.*stopped$/stopped/' | tr '\n' ' ')
[ "${order% }" = "sigterm stage stopped" ] && ok "journal: SIGTERM, the stage answered, stopped" || bad "drain order: '$order'"
step "start again" systemctl start "$U"
J | grep 'start-up recovery done' | tail -1 | grep -q 'volumes=1' && ok "recovery after the drain: the drained stage's volume" || bad "recovery after drain: $(J | grep 'start-up recovery done' | tail -1)"
step "unstage $V3" C node unstage --id "$V3" --staging-path "$S3"

# --- No denied syscall in the agent's journal. systemd 252 does not know statmount/listmount and
# answers them with the unit's EPERM: the agent says so once each and takes its fallback; every
# other EPERM, a seccomp or a "denied" line is a failure, and openat2 must be used (no fallback).
J | grep 'syscall not available here' | sed 's/^/LAB fallback /'
other=$(J | grep -iE 'eperm|seccomp|denied|not permitted|os error 1\)' | grep -vE 'syscall not available here; taking the fallback from now on syscall="(statmount|listmount)"')
[ -z "$other" ] && ok "journal: no EPERM, seccomp or denied line beyond the statmount/listmount fallback notes" || bad "journal: $(echo "$other" | head -5)"
J | grep -q 'syscall="openat2"' && bad "openat2 not available under the unit" || ok "openat2 used under the unit (no fallback line)"
journalctl -b --no-pager -o cat | grep -i 'ebs-node-agent.service.*\(parse\|ignoring\)' | head -3 | sed 's/^/LAB systemd /'

# --- doctor under the unit's own sandbox: the installed unit as a oneshot running `doctor`.
sed -e 's/^Type=notify/Type=oneshot/' -e 's|^ExecStart=.*|ExecStart=-/usr/local/bin/ebs-node-agent doctor --backend ebs --mode node|' \
  -e '/^\(WatchdogSec\|Restart\|RestartSec\|NotifyAccess\)=/d' -e '/^\[Install\]/,$d' \
  /etc/systemd/system/$U.service >/etc/systemd/system/ebs-lab-doctor.service
systemctl daemon-reload
systemctl start ebs-lab-doctor
journalctl -u ebs-lab-doctor -o cat --no-pager | grep -E 'seccomp|openat2|statmount' | sed 's/^/LAB doctor /'
journalctl -u ebs-lab-doctor -o cat --no-pager | grep -qE '^ok +openat2 +available' &&
  ok "doctor under the unit: openat2 usable" || bad "doctor's openat2 line: $(journalctl -u ebs-lab-doctor -o cat | grep openat2)"
echo "LAB security $(systemd-analyze security "$U" --no-pager 2>/dev/null | tail -1)"

# --- The watchdog, with a short interval for the test (a drop-in, as `systemctl edit` makes).
mkdir -p /etc/systemd/system/$U.service.d
printf '[Service]\nWatchdogSec=4s\n' >/etc/systemd/system/$U.service.d/lab-watchdog.conf
systemctl daemon-reload
systemctl restart "$U"
pid=$(prop MainPID)
n=$(prop NRestarts)
sleep 10
if [ "$(prop MainPID)" = "$pid" ] && [ "$(prop NRestarts)" = "$n" ] && ! J | grep -q 'Watchdog timeout'; then
  ok "WatchdogSec=4s: 10 s later the same process runs (the agent pings)"
else
  bad "watchdog killed a live agent: pid $pid -> $(prop MainPID), NRestarts $n -> $(prop NRestarts)"
fi
t=$(now_ms)
kill -STOP "$pid"
if wait_for 60 restarted $((n + 1)) && J | grep -q 'Watchdog timeout' && ready; then
  ok "a stalled (SIGSTOPped) agent: watchdog timeout, killed, restarted in $(($(now_ms) - t)) ms"
else
  bad "stalled agent: NRestarts=$(prop NRestarts) state=$(prop ActiveState)"
fi
J | grep -m1 'Watchdog timeout' | sed 's/^/LAB journal /'

