#!/usr/bin/env bash
# Quick start: build the agent and run it with the loop backend on a default socket, so the whole
# CSI lifecycle can be tried on one Linux machine. Run as root: packaging/local/start.sh
# Staging and target paths go below $EBS_AGENT_MOUNTS (default /mnt/ebs-node-agent), the agent's
# only allowed path prefix here: never below its state directory. README.md's quick start uses
# the same socket and prefix (tests/tests/readme.rs checks that they agree).
set -euo pipefail
cd "$(dirname "$0")/../.."
# Only what building and running the agent needs (tests/deps.sh adds the test lab).
bash packaging/local/deps.sh
# The first release build takes about 6 minutes on 2 cores, and for most of the last 4 cargo
# prints nothing (or a still progress bar): it optimises and links the agent itself (thin LTO,
# one codegen unit). A line every 30 s says it is still at work; seconds when already built.
echo "start.sh: building the agent (release; about 6 min on 2 cores the first time)" >&2
t0=$SECONDS
(while sleep 30; do
  kill -0 $$ 2>/dev/null || exit 0
  echo "start.sh: still building ($((SECONDS - t0)) s)" >&2
done) &
heartbeat=$!
trap 'kill "$heartbeat" 2>/dev/null || true' EXIT
cargo build --release --locked --bin ebs-node-agent
kill "$heartbeat" 2>/dev/null || true
trap - EXIT
echo "start.sh: built in $((SECONDS - t0)) s" >&2
endpoint="${CSI_ENDPOINT:-unix:///run/ebs-node-agent/csi.sock}"
state_dir="${EBS_AGENT_STATE_DIR:-/var/lib/ebs-node-agent}"
mounts="${EBS_AGENT_MOUNTS:-/mnt/ebs-node-agent}"
bin="$PWD/target/release/ebs-node-agent"
# What this host lacks for the loop backend, one line per check; stop if something needed is.
"$bin" doctor --backend loop --skip-imds --endpoint "$endpoint" --state-dir "$state_dir"
mkdir -p "$mounts"
# The state holds the volumes' images: root's alone (the agent keeps it so at every start too).
install -d -m 0700 "$state_dir"
cat <<MSG
ebs-node-agent (loop backend) on $endpoint, state in $state_dir, mounts below $mounts.
In another shell (README.md, Quick start, has the whole lifecycle; its checkout line is
  R=$PWD
):
  $bin client --endpoint $endpoint identity info
  $bin client --endpoint $endpoint controller create-volume --name demo --size 1GiB
  $bin status --endpoint $endpoint
Stop with Ctrl-C.
MSG
exec "$bin" serve --backend loop --endpoint "$endpoint" --state-dir "$state_dir" \
  --allowed-path-prefix "$mounts"
