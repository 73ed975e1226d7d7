#!/usr/bin/env bash
# The whole test suite: system packages, build, then every test (root-only tests need root and
# never skip under CI=true). Run from anywhere: sudo tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
cargo build --workspace --bins --locked
cargo test --workspace --locked -- --test-threads="${TEST_THREADS:-4}"
