#!/usr/bin/env bash
# The whole test suite: system packages, build, then every test (root-only tests need root and
# never skip under CI=true). Run from anywhere: sudo tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
# The agent under test carries the crash points (--crash-after) the crash matrix needs: the
# `test-hooks` feature, which no release build enables (agent/src/test_hooks.rs).
hooks=(--features ebs-node-agent/test-hooks)
cargo build --workspace --bins --locked "${hooks[@]}"
# The release configuration (no feature): the hooks' flags are neither listed nor accepted.
cargo test -p ebs-node-agent --lib --locked test_hooks
# Every fuzz target for a few seconds (its own workspace and build; docs/fuzzing.md).
FUZZ_PROFILE=ci bash fuzz/run.sh "${FUZZ_SECONDS:-5}"
# Includes tests/tests/kubernetes.rs: a one-node cluster from shared/tools/k8s (beside the
# checkout or above it, or $K8S_TOOLS); it skips without them, except under CI=true.
cargo test --workspace --locked "${hooks[@]}" -- --test-threads="${TEST_THREADS:-4}"
