#!/usr/bin/env bash
# Quick start: build the agent and run it with the loop backend on a default socket, so the whole
# CSI lifecycle can be tried on one Linux machine. Run as root: packaging/local/start.sh (as root)
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tests/deps.sh
cargo build --release --locked --bin ebs-node-agent
endpoint="${CSI_ENDPOINT:-unix:///run/ebs-node-agent/csi.sock}"
state_dir="${EBS_AGENT_STATE_DIR:-/var/lib/ebs-node-agent}"
bin="$PWD/target/release/ebs-node-agent"
cat <<MSG
ebs-node-agent (loop backend) on $endpoint, state in $state_dir. In another shell:
  $bin client --endpoint $endpoint identity info
  $bin client --endpoint $endpoint controller create-volume --name demo --size 1GiB
  $bin status --state-dir $state_dir
Stop with Ctrl-C.
MSG
exec "$bin" serve --backend loop --endpoint "$endpoint" --state-dir "$state_dir"
