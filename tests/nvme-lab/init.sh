#!/bin/busybox sh
# The NVMe lab guest's /init: print the NVMe disks the kernel shows, run the agent with the ebs
# backend and drive the volume lifecycle through its client. Every result is one `LAB ...` line on
# the serial console, which the host reads; the last is `LAB DONE pass=N fail=M`.
. /lab-guest.sh   # busybox, /proc /sys /dev /run /tmp, /lab.env, ok/bad/now_ms (tests/nvme-lab/guest.sh)
finish() {
  kill "$agent_pid" 2>/dev/null
  echo "LAB DONE pass=$pass fail=$fail"
  [ "$fail" -ne 0 ] && tail -n 60 /tmp/agent.log | sed 's/^/LAB log /'
  poweroff -f
}
trap finish EXIT
serial_of() { tr -d ' ' <"$1" 2>/dev/null; }
# The visible namespace whose controller has serial $1.
ns_of() {
  for d in /sys/block/nvme*; do
    [ "$(cat "$d/hidden" 2>/dev/null)" = 1 ] && continue
    [ "$(serial_of "$d/device/serial")" = "$1" ] && { echo "${d##*/}"; return 0; }
  done
  return 1
}
mounted() { grep -q " $1 " /proc/mounts; }
# The ext4 superblock UUID (16 bytes at 1024 + 0x68); busybox-static has no blkid.
fs_uuid() { dd if="$1" bs=1 skip=1128 count=16 2>/dev/null | hexdump -v -e '16/1 "%02x"'; }
# Whether the first MiB is all zeros: nothing was ever written there.
blank() { [ "$(dd if="$1" bs=64k count=16 2>/dev/null | tr -d '\000' | wc -c)" = 0 ]; }

for d in /sys/block/*; do
  echo "LAB disk ${d##*/} serial=$(serial_of "$d/device/serial") model=\"$(sed 's/ *$//' "$d/device/model" 2>/dev/null)\" hidden=$(cat "$d/hidden" 2>/dev/null) sysfs=$(readlink -f "$d" | cut -d/ -f3-5)"
done

A=/bin/ebs-node-agent
EP=unix:///run/csi.sock
C() { "$A" client --endpoint "$EP" "$@"; }
ip link set lo up
"$A" serve --mode node --backend ebs --endpoint "$EP" --state-dir /var/lib/ebs-node-agent \
  --node-id i-lab --zone lab-zone-1a --imds-disabled --ebs-model "$MODEL" --device-wait 20s \
  --metrics-address 127.0.0.1:9809 >/tmp/agent.log 2>&1 &
agent_pid=$!
t0=$(now_ms)
i=0
# Bounded by time, not tries: each client call is slow under software emulation.
until C --json identity probe 2>/dev/null | grep -q '"ready":true'; do
  [ $(($(now_ms) - t0)) -gt 90000 ] && { bad "agent not ready: $(tail -c 500 /tmp/agent.log)"; exit 1; }
  sleep 0.05
done
ok "agent ready ($(($(now_ms) - t0)) ms)"

s1=${V1#vol-}; s2=${V2#vol-}; s3=${V3#vol-}
N1=$(ns_of "vol$s1"); N2=$(ns_of "vol$s2"); N3=$(ns_of "vol$s3")
echo "LAB serials: $V1=$N1 $V2=$N2 $V3=$N3"
ln -s "$N1" /dev/xvdba
ln -s "$N2" /dev/xvdbb
K=/var/lib/kubelet
S=$K/plugins/kubernetes.io/csi/ebs.csi.aws.com/$V1/globalmount
T=$K/pods/pod-1/volumes/kubernetes.io~csi/$V1/mount
mkdir -p "$(dirname "$T")"

# step NAME CMD...: runs a client call, expecting success, and reports its time.
step() {
  name=$1; shift
  t=$(now_ms)
  if "$@" >/tmp/out 2>&1; then ok "$name ($(($(now_ms) - t)) ms)"; return 0; fi
  bad "$name: $(tail -c 400 /tmp/out)"
  return 1
}

# A devicePath link to another volume's device: refused, nothing formatted or mounted.
t=$(now_ms)
if C node stage --id "$V1" --staging-path "$S" --publish-context devicePath=/dev/xvdbb >/tmp/out 2>&1; then
  bad "stage through a link to the wrong serial was accepted"
elif grep -q FailedPrecondition /tmp/out && ! mounted "$S" && blank "/dev/$N2" && blank "/dev/$N1"; then
  ok "wrong serial refused ($(($(now_ms) - t)) ms): $(head -c 300 /tmp/out)"
else
  bad "wrong serial: unexpected outcome: $(head -c 400 /tmp/out)"
fi

step "stage $V1 via devicePath=/dev/xvdba" C node stage --id "$V1" --staging-path "$S" --publish-context devicePath=/dev/xvdba
if grep -q "^/dev/$N1 $S ext4" /proc/mounts; then ok "staged: /dev/$N1 on $S (ext4)"; else bad "not mounted: $(grep kubelet /proc/mounts)"; fi
uuid1=$(fs_uuid "/dev/$N1")
step "publish" C node publish --id "$V1" --staging-path "$S" --target-path "$T"
echo "hello from $V1" >"$T/data" && sync && ok "write through the target path" || bad "write failed"
# The condition proves the NVMe serial once and judges the staging mount and the bind by it.
if C --json node stats --id "$V1" --volume-path "$T" >/tmp/out 2>&1 && grep -q '"abnormal": *false' /tmp/out; then
  ok "stats: healthy, by the serial"
else
  bad "stats: $(head -c 400 /tmp/out)"
fi

# EBS statistics with a volume staged and published: the agent reads log page 0xD0 through the
# NVMe admin ioctl at scrape time; QEMU's controller does not implement the page, so the read
# fails with an NVMe status, which is counted while the scrape answers with everything else.
if wget -qO /tmp/metrics http://127.0.0.1:9809/metrics 2>/tmp/out; then
  grep -E '^(aws_ebs_csi_nvme_collector_(errors|scrapes)_total|ebs_agent_ebs_stats_errors_total\{reason="unsupported"\}|ebs_agent_volumes_)' /tmp/metrics | sed 's/^/LAB metric /'
  if grep -q '^aws_ebs_csi_nvme_collector_errors_total{instance_id="i-lab"} 1$' /tmp/metrics &&
    grep -q '^ebs_agent_ebs_stats_errors_total{reason="unsupported"} 1$' /tmp/metrics &&
    grep -q '^aws_ebs_csi_nvme_collector_duration_seconds_count{instance_id="i-lab"} 1$' /tmp/metrics &&
    grep -q '^ebs_agent_volumes_staged 1$' /tmp/metrics && grep -q '^ebs_agent_volumes_published 1$' /tmp/metrics &&
    grep -q '^ebs_agent_rpc_requests_total{code="OK",rpc="NodeStageVolume"} ' /tmp/metrics &&
    ! grep -q '^aws_ebs_csi_read_ops_total' /tmp/metrics; then
    ok "ebs stats scrape: page 0xD0 unsupported by QEMU's controller, counted, the other metrics intact"
  else
    bad "ebs stats scrape: $(grep -E 'collector_errors|ebs_stats_errors|volumes_|NodeStage' /tmp/metrics | tr '\n' ' ' | head -c 600)"
  fi
  grep 'EBS statistics unavailable' /tmp/agent.log | head -1 | sed 's/^.*WARN //;s/^/LAB ebs-log /'
else
  bad "metrics scrape failed: $(cat /tmp/out)"
fi
if "$A" ebs-stats "/dev/$N1" >/tmp/out 2>&1; then
  bad "ebs-stats on QEMU's controller succeeded: $(head -c 300 /tmp/out)"
elif grep -q 'does not provide log page 0xd0 (NVMe status 0x' /tmp/out; then
  ok "ebs-stats /dev/$N1 (the ioctl from the command line): $(head -c 300 /tmp/out)"
else
  bad "ebs-stats /dev/$N1: $(head -c 400 /tmp/out)"
fi
step "unpublish" C node unpublish --id "$V1" --target-path "$T"
step "unstage" C node unstage --id "$V1" --staging-path "$S"
if mounted "$S" || mounted "$T"; then bad "still mounted after unstage"; else ok "nothing mounted after unstage"; fi
step "restage $V1 (no devicePath)" C node stage --id "$V1" --staging-path "$S"
uuid2=$(fs_uuid "/dev/$N1")
if [ -n "$uuid1" ] && [ "$uuid1" != 00000000000000000000000000000000 ] && [ "$uuid1" = "$uuid2" ] && [ "$(cat "$S/data" 2>/dev/null)" = "hello from $V1" ]; then
  ok "restage kept the filesystem (UUID $uuid2) and the data"
else
  bad "restage: UUID $uuid1 -> $uuid2, data: $(cat "$S/data" 2>&1)"
fi
formats=$(grep -c 'formatted.*uuid' /tmp/agent.log)
[ "$formats" = 1 ] && ok "formatted once in the whole run" || bad "formatted $formats times"
step "unstage again" C node unstage --id "$V1" --staging-path "$S"

# Hot-plug: the volume's controller leaves the PCI bus, stage starts waiting, the bus is rescanned,
# the kernel's uevent wakes the wait.
ctrl=
for c in /sys/class/nvme/nvme*; do [ "$(serial_of "$c/serial")" = "vol$s3" ] && ctrl=$c; done
pci=$(readlink -f "$ctrl/device")
echo 1 >"$pci/remove"
sleep 0.3
if ns_of "vol$s3" >/dev/null; then bad "$V3 still visible after removal"; fi
S3=$K/plugins/kubernetes.io/csi/ebs.csi.aws.com/$V3/globalmount
t=$(now_ms)
(C node stage --id "$V3" --staging-path "$S3" >/tmp/out3 2>&1; echo $? >/tmp/rc3) &
stage_pid=$!
# Rescan only once the agent is waiting (client start-up under TCG takes seconds).
i=0
until grep -q 'device not there yet' /tmp/agent.log || [ $i -gt 400 ]; do sleep 0.05; i=$((i + 1)); done
sleep 0.5
echo 1 >/sys/bus/pci/rescan
wait "$stage_pid"
took=$(($(now_ms) - t))
if [ "$(cat /tmp/rc3)" = 0 ] && mounted "$S3" && grep -q "device resolved volume=$V3 .*looks=[2-9]" /tmp/agent.log; then
  ok "hot-plugged $V3: stage waited, the rescan's uevent woke it: staged on $(ns_of "vol$s3") in $took ms"
else
  bad "hot-plug: rc=$(cat /tmp/rc3) after $took ms: $(tail -c 400 /tmp/out3)"
fi
step "unstage $V3" C node unstage --id "$V3" --staging-path "$S3"

# Online grow of a mounted ext4 while a writer appends, on a loop device, through a second agent
# with the loop backend. The kernel grows a mounted ext4 only for CAP_SYS_RESOURCE, which this
# guest's root has (the CI host's capability bounding set lacks it).
LS=/tmp/loop-agent
LEP=unix:///run/loop.sock
L() { "$A" client --endpoint "$LEP" "$@"; }
if insmod /lib/loop.ko 2>/tmp/out || [ -e /dev/loop-control ]; then
  "$A" serve --backend loop --endpoint "$LEP" --state-dir "$LS" --node-id i-lab \
    --allowed-path-prefix /var/lib/loop-mounts \
    --zone lab-zone-1a --imds-disabled >/tmp/loop-agent.log 2>&1 &
  loop_pid=$!
  t0=$(now_ms)
  until L --json identity probe 2>/dev/null | grep -q '"ready":true'; do
    [ $(($(now_ms) - t0)) -gt 90000 ] && break
    sleep 0.05
  done
  GS=/var/lib/loop-mounts/staging/grow
  GT=/var/lib/loop-mounts/pods/grow/mount
  gid=$(L --json controller create-volume --name grow --size 64MiB 2>/tmp/out | sed -n 's/.*"volume_id": *"\([^"]*\)".*/\1/p')
  total() { L --json node stats --id "$gid" --volume-path "$GT" | sed -n 's/.*"total": *\([0-9]*\),"unit":1.*/\1/p'; }
  if [ -n "$gid" ] && L controller publish --id "$gid" --node-id i-lab >/tmp/out 2>&1 &&
    L node stage --id "$gid" --staging-path "$GS" >>/tmp/out 2>&1 &&
    L node publish --id "$gid" --staging-path "$GS" --target-path "$GT" >>/tmp/out 2>&1; then
    dd if=/dev/urandom of="$GT/data" bs=64k count=160 2>/dev/null
    sum1=$(md5sum <"$GT/data")
    before=$(total)
    : >"$GT/append"
    touch /tmp/writing
    (i=0; while [ -e /tmp/writing ]; do echo "$i" >>"$GT/append"; i=$((i + 1)); done) &
    writer=$!
    sleep 0.5
    lines_before=$(wc -l <"$GT/append")
    step "ControllerExpandVolume to 128 MiB" L controller expand --id "$gid" --size 128MiB
    step "NodeExpandVolume (mounted ext4, writer running)" L --json node expand --id "$gid" --volume-path "$GT" --size 128MiB
    cap1=$(sed -n 's/.*"capacity_bytes": *\([0-9]*\).*/\1/p' /tmp/out)
    step "NodeExpandVolume again" L --json node expand --id "$gid" --volume-path "$GT" --size 128MiB
    cap2=$(sed -n 's/.*"capacity_bytes": *\([0-9]*\).*/\1/p' /tmp/out)
    sleep 0.5
    rm -f /tmp/writing
    wait "$writer"
    after=$(total)
    lines=$(wc -l <"$GT/append")
    if [ -n "$before" ] && [ -n "$after" ] && [ "$after" -gt 104857600 ] && [ "$before" -lt 67108864 ] &&
      [ "$lines" -gt "$lines_before" ] && [ "$lines_before" -gt 0 ] &&
      awk 'NR - 1 != $1 { bad = 1 } END { exit bad }' "$GT/append" &&
      [ "$(md5sum <"$GT/data")" = "$sum1" ]; then
      ok "mounted ext4 grown online: statvfs total $before -> $after bytes; the writer appended $lines lines without a gap ($lines_before before the expand); 10 MiB of data intact"
    else
      bad "online grow: total $before -> $after, lines $lines_before -> $lines, sums $sum1 / $(md5sum <"$GT/data"): $(tail -c 300 /tmp/loop-agent.log)"
    fi
    [ "$cap2" = 134217728 ] && ok "second NodeExpandVolume is a no-op success ($cap2 bytes)" ||
      bad "second expand answered capacity '$cap2' (first '$cap1')"
    grep ' expanded ' /tmp/loop-agent.log | sed 's/^.*INFO /LAB loop-agent /'
    step "unpublish (loop)" L node unpublish --id "$gid" --target-path "$GT"
    step "unstage (loop)" L node unstage --id "$gid" --staging-path "$GS"
  else
    bad "loop volume setup: $(tail -c 400 /tmp/out) $(tail -c 300 /tmp/loop-agent.log)"
  fi
  kill "$loop_pid" 2>/dev/null
else
  bad "insmod loop: $(cat /tmp/out)"
fi

grep 'device resolved' /tmp/agent.log | sed 's/^.*INFO //' | sed 's/^/LAB resolve /'
