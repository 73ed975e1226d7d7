# The guests' /init prelude (sourced by init.sh and powerloss/init.sh): busybox applets, the
# kernel's file systems, the run's settings, and the LAB line helpers the host reads.
/bin/busybox --install -s /bin
export PATH=/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
. /lab.env

pass=0
fail=0
ok() { echo "LAB ok   $*"; pass=$((pass + 1)); }
bad() { echo "LAB FAIL $*"; fail=$((fail + 1)); }
now_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }
