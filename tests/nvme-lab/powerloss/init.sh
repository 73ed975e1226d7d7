#!/bin/busybox sh
# The power-loss guest's /init. One NVMe disk carries, through dm-log-writes, two linear devices:
# the filesystem that holds the agent's state directory, and an EBS-style volume (a fixture sysfs
# tree gives it the volume's NVMe serial, so the ebs backend finds it as it would on EC2). Every
# write to either reaches the log on the second disk in the order it became durable, so one log
# replays both at once. The workload runs through `ebs-node-agent client`; after each
# acknowledged call the log gets a mark. Results are `LAB ...` lines on the serial console.
. /lab-guest.sh   # busybox, /proc /sys /dev /run /tmp, /lab.env, ok/bad/now_ms (tests/nvme-lab/guest.sh)
agent_pid=
finish() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && sleep 1
  grep -q " $BASE/" /proc/mounts && umount "$S" "$T" "$BASE/state" 2>/dev/null
  for d in pvol pstate plw; do dmsetup --noudevsync remove "$d" 2>/dev/null; done
  echo "LAB DONE pass=$pass fail=$fail"
  [ "$fail" -ne 0 ] && tail -n 40 /tmp/agent.log | sed 's/^/LAB log /'
  poweroff -f
}
trap finish EXIT
die() { bad "$*"; exit 1; }

for m in dm-mod dm-log-writes; do insmod "/lib/modules/$m.ko" || die "insmod $m"; done
if [ "$FS" = xfs ]; then
  for m in libcrc32c xfs; do insmod "/lib/modules/$m.ko" || die "insmod $m"; done
fi

# The disk whose controller has serial $1.
disk_of() {
  for d in /sys/block/nvme*; do
    [ "$(tr -d ' ' <"$d/device/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}
DATA=$(disk_of powerloss-data) || die "no data disk"
LOG=$(disk_of powerloss-log) || die "no log disk"
SECTORS=$(cat "/sys/block/${DATA#/dev/}/size")
STATE_SECTORS=$((STATE_MB * 2048))
VOL_SECTORS=$((VOL_MB * 2048))
# No udev here: the nodes are devtmpfs's /dev/dm-N; tables name devices by number.
dm() { dmsetup --noudevsync "$@" >/tmp/dm.out 2>&1 || die "dmsetup $*: $(cat /tmp/dm.out)"; }
numbers() { dmsetup info -c --noheadings -o major,minor "$1" | tr -d ' '; }
node() { echo "/dev/dm-$(dmsetup info -c --noheadings -o minor "$1" | tr -d ' ')"; }
dm create plw --table "0 $SECTORS log-writes $DATA $LOG"
dm create pstate --table "0 $STATE_SECTORS linear $(numbers plw) 0"
dm create pvol --table "0 $VOL_SECTORS linear $(numbers plw) $STATE_SECTORS"
STATE_DEV=$(node pstate)
VOL_DEV=$(node pvol)
mark() { dmsetup message plw 0 mark "$1" && echo "LAB mark $1"; }
mark begin

# The state filesystem, made and mounted before the agent exists.
mkdir -p "$BASE/state" "$BASE/run" "$BASE/w"
if [ "$FS" = xfs ]; then mkfs.xfs -f -q "$STATE_DEV"; else /sbin/mke2fs -t ext4 -q -F "$STATE_DEV"; fi \
  >/tmp/mkfs.out 2>&1 || die "mkfs of the state filesystem: $(cat /tmp/mkfs.out)"
mount -t "$FS" "$STATE_DEV" "$BASE/state" || die "mounting the state filesystem"
sync
mark state-fs

# The fixture: the volume's NVMe controller and namespace as sysfs shows them (the layout of
# agent/daemon/src/backend/ebs/fixture.rs), its node a link to the logged linear device.
VOL=vol-0123456789abcdef0
FX=$BASE/fixture
CTRL=$FX/sys/devices/pci0000:00/0000:00:05.0/nvme/nvme1
mkdir -p "$CTRL/nvme1n1" "$FX/sys/block" "$FX/dev"
printf '%-40s\n' "vol${VOL#vol-}" >"$CTRL/serial"
printf '%-40s\n' "Amazon Elastic Block Store" >"$CTRL/model"
: >"$CTRL/rescan_controller"
numbers pvol >"$CTRL/nvme1n1/dev"
echo 1 >"$CTRL/nvme1n1/nsid"
ln -s "$CTRL" "$CTRL/nvme1n1/device"
ln -s "$VOL_DEV" "$FX/dev/nvme1n1"
ln -s "$CTRL/nvme1n1" "$FX/sys/block/nvme1n1"

A=/bin/ebs-node-agent
EP=unix://$BASE/run/csi.sock
C() { "$A" client --endpoint "$EP" "$@"; }
# The same arguments as the host's checks use (tests/tests/power_loss/).
"$A" serve --endpoint "$EP" --state-dir "$BASE/state" --allowed-path-prefix "$BASE/w" \
  --backend ebs --mode node --node-id i-lab --zone lab-zone-1a --imds-disabled \
  --sysfs-root "$FX/sys" --dev-root "$FX/dev" >/tmp/agent.log 2>&1 &
agent_pid=$!
t0=$(now_ms)
until C --json identity probe 2>/dev/null | grep -q '"ready":true'; do
  [ $(($(now_ms) - t0)) -gt 120000 ] && die "agent not ready: $(tail -c 500 /tmp/agent.log)"
  sleep 0.05
done
ok "agent ready ($(($(now_ms) - t0)) ms)"
mark agent-ready

S=$BASE/w/staging/$VOL
T=$BASE/w/pods/pod-1/mount
mkdir -p "$(dirname "$T")"
# call MARK CMD...: a client call that must succeed; once it has, the log gets MARK.
call() {
  name=$1; shift
  t=$(now_ms)
  "$@" >/tmp/out 2>&1 || die "$name: $(tail -c 400 /tmp/out)"
  mark "$name"
  ok "$name ($(($(now_ms) - t)) ms)"
}
call staged C node stage --id "$VOL" --staging-path "$S" --fs-type "$FS"
call published C node publish --id "$VOL" --staging-path "$S" --target-path "$T" --fs-type "$FS"
printf '%s' "$PAYLOAD" >/tmp/payload
call written dd if=/tmp/payload of="$T/data" conv=fsync
call unpublished C node unpublish --id "$VOL" --target-path "$T"
call unstaged C node unstage --id "$VOL" --staging-path "$S"
call restaged C node stage --id "$VOL" --staging-path "$S" --fs-type "$FS"
if [ "$(cat "$S/data" 2>/dev/null)" = "$PAYLOAD" ]; then
  ok "restage kept the data"
else
  bad "restage: data reads '$(cat "$S/data" 2>&1)'"
fi
mark end
formats=$(grep -c 'formatted.*uuid' /tmp/agent.log)
[ "$formats" = 1 ] && ok "formatted once in the whole run" || bad "formatted $formats times"
echo "LAB status $(C --json identity probe >/dev/null 2>&1; "$A" status --json --endpoint "$EP" --state-dir "$BASE/state")"
