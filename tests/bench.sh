#!/usr/bin/env bash
# The performance bench in one command (as root): build a release agent, start it with the loop
# backend on a scratch state directory, run `client bench` against it, stop it, clean up.
# Extra arguments go to the bench, e.g. `sudo tests/bench.sh --json` or `--volumes 16`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins --locked
bin=target/release/ebs-node-agent
scratch=$(mktemp -d /tmp/ebs-bench.XXXXXX)
"$bin" serve --backend loop --state-dir "$scratch/state" --endpoint "unix://$scratch/csi.sock" \
    2>"$scratch/agent.log" &
agent=$!
trap 'kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null; rm -rf "$scratch"' EXIT
for _ in $(seq 100); do [ -S "$scratch/csi.sock" ] && break; sleep 0.05; done
"$bin" client --endpoint "unix://$scratch/csi.sock" bench --pid "$agent" \
    --work-dir "$scratch/state/bench" --volumes 128 --concurrency 16 --restart-check "$@"
