#!/usr/bin/env bash
# The whole test suite: system packages, build, then every test (root-only tests need root and
# never skip under CI=true). Run from anywhere: sudo tests/run.sh
# Every test binary runs even when one fails (--no-fail-fast); the closing summary
# (tests/summary.sh) names the failed steps and binaries and every skipped test with its reason
# (tests append to $EBS_SKIP_LOG through ebs_tests::skip).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
# Under CI=true the checkout is fresh and built once: cargo's incremental caches of the
# workspace's crates (target/debug/incremental, 45% of target/debug as measured; see
# docs/first-contact.md, "Disk") would never be read again, so none are written. Outside CI
# they stay, for the next build.
if [[ ${CI:-} == true ]]; then export CARGO_INCREMENTAL=0; fi
mkdir -p target
export EBS_SKIP_LOG="$PWD/target/test-skips.log"
: >"$EBS_SKIP_LOG"
# The core's simulation (issue 51) writes its count here; printed before the summary. The suite
# runs its quick mode, 3,600 seeds (a million calls, about a minute); `cargo test -p
# ebs-node-core` alone runs 36, so the core's unit tests take a second.
export EBS_SIM_REPORT="$PWD/target/simulation.txt"
export EBS_SIM_SEEDS="${EBS_SIM_SEEDS:-3600}"
: >"$EBS_SIM_REPORT"
# csi-sanity for the conformance test: found, or built where Go and its module proxy are at hand;
# when neither, csi_sanity says how to provide it (and fails at once under CI=true).
csi_sanity="$(bash tests/tools.sh provide csi-sanity)" && export CSI_SANITY="$csi_sanity"
# The agent under test carries the crash points (--crash-after) the crash matrix needs: the
# `test-hooks` feature, which no release build enables (agent/daemon/src/test_hooks.rs).
hooks=(--features ebs-node-agent/test-hooks)
# The Kubernetes tier's image carries the release image's name, so its binary is the agent as
# it ships: no features, never the test hooks (tests/k8s/images.sh refuses a hooks build). It is
# the dev profile's, not --release's: a cold release build takes 5.5 min on 2 cores, most of the
# tier's budget, and the optimisation level changes nothing the tier checks. Built before the
# hooks build, which then leaves target/debug/ebs-node-agent with the hooks for the other tests.
# The tier's binaries: $K8S_TOOLS, shared/tools/k8s beside the checkout or a directory above it,
# or target/tools/k8s, where tests/k8s/fetch-tools.sh puts them. That script runs here only when
# they are missing and K8S_FETCH=1 asks for it (it downloads ~400 MB and builds the sidecars).
k8s_tools() { bash tests/k8s/fetch-tools.sh find >/dev/null; }
if ! k8s_tools && [[ ${K8S_FETCH:-} == 1 ]]; then
  bash tests/k8s/fetch-tools.sh || echo "tests/run.sh: K8S_FETCH=1: the fetch failed (above)" >&2
fi
if [[ ${CI:-} == true ]] || k8s_tools; then
  cargo build --locked -p ebs-node-agent --bin ebs-node-agent
  mkdir -p target/k8s
  cp target/debug/ebs-node-agent target/k8s/ebs-node-agent.partial
  mv target/k8s/ebs-node-agent.partial target/k8s/ebs-node-agent
fi
cargo build --workspace --bins --locked "${hooks[@]}"
failed=()
# The code's standards are part of the suite: unformatted code or a clippy warning fails the run
# (lints live in the workspace's Cargo.toml). fuzz/ is a workspace of its own: its oracles are
# formatted here and compiled by fuzz/run.sh.
cargo fmt --all --check || failed+=("cargo fmt --check (run: cargo fmt --all)")
cargo fmt --manifest-path fuzz/Cargo.toml --check || failed+=("cargo fmt --check in fuzz/")
cargo clippy --workspace --all-targets --locked "${hooks[@]}" -- -D warnings || failed+=("cargo clippy -D warnings")
# The release configuration (no feature): the hooks' flags are neither listed nor accepted.
cargo test -p ebs-node-agent --lib --locked test_hooks || failed+=("test_hooks without the feature")
# Every fuzz target for a few seconds (its own workspace and build; docs/fuzzing.md).
FUZZ_PROFILE=ci bash fuzz/run.sh "${FUZZ_SECONDS:-5}" || failed+=("fuzz (inputs in fuzz/artifacts/)")
log=target/test-output.log
set +e
# Includes tests/tests/kubernetes.rs: a one-node cluster from the binaries k8s_tools finds; it
# skips without them (each scenario in the summary), except under CI=true. So does
# tests/tests/kube_duties.rs (its own etcd and kube-apiserver only, on free loopback ports).
cargo test --workspace --locked --no-fail-fast "${hooks[@]}" -- --test-threads="${TEST_THREADS:-4}" 2>&1 |
  tee "$log"
rc=${PIPESTATUS[0]}
set -e
cat "$EBS_SIM_REPORT"
# The closing summary: every FAILED step and test binary, every skip with its reason, and the
# counts, each in its unit (tests/summary.sh says which).
bash tests/summary.sh "$log" "$EBS_SKIP_LOG" "$rc" "${failed[@]}"
