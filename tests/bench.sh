#!/usr/bin/env bash
# The performance bench in one command (as root): build a release agent, start it with the loop
# backend on a scratch state directory, run `client bench` against it, stop it, clean up.
# Extra arguments go to the bench and win over these defaults, e.g. `sudo tests/bench.sh --json`,
# `--volumes 16` or `--rounds 1`. Three rounds alternate agent and floor, so that the machine's
# drift between them (the floor's own wall time moves by a quarter here) weighs less.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins --locked
bin=target/release/ebs-node-agent
scratch=$(mktemp -d /tmp/ebs-bench.XXXXXX)
"$bin" serve --backend loop --state-dir "$scratch/state" --endpoint "unix://$scratch/csi.sock" \
    --allowed-path-prefix "$scratch/work" 2>"$scratch/agent.log" &
agent=$!
trap 'kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null; rm -rf "$scratch"' EXIT
for _ in $(seq 100); do [ -S "$scratch/csi.sock" ] && break; sleep 0.05; done
"$bin" client --endpoint "unix://$scratch/csi.sock" bench --pid "$agent" \
    --work-dir "$scratch/work/bench" --volumes 128 --concurrency 16 --rounds 3 --restart-check \
    --grpc-floor "$@"
