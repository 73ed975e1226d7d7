#!/usr/bin/env bash
# The whole test suite: system packages, build, then every test (root-only tests need root and
# never skip under CI=true). Run from anywhere: sudo tests/run.sh
# Every test binary runs even when one fails (--no-fail-fast); the closing summary names the
# failed ones, the fuzz result and every skipped test (tests append to $EBS_SKIP_LOG).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
mkdir -p target
export EBS_SKIP_LOG="$PWD/target/test-skips.log"
: >"$EBS_SKIP_LOG"
# csi-sanity for the conformance test: found, or built where Go and its module proxy are at hand;
# when neither, csi_sanity says how to provide it (and fails at once under CI=true).
csi_sanity="$(bash tests/tools.sh provide csi-sanity)" && export CSI_SANITY="$csi_sanity"
# The agent under test carries the crash points (--crash-after) the crash matrix needs: the
# `test-hooks` feature, which no release build enables (agent/src/test_hooks.rs).
hooks=(--features ebs-node-agent/test-hooks)
# The Kubernetes tier's image carries the release image's name, so its binary is the agent as
# it ships: no features, never the test hooks (tests/k8s/images.sh refuses a hooks build). It is
# the dev profile's, not --release's: a cold release build takes 5.5 min on 2 cores, most of the
# tier's budget, and the optimisation level changes nothing the tier checks. Built before the
# hooks build, which then leaves target/debug/ebs-node-agent with the hooks for the other tests.
k8s_tools() {
  [[ -n ${K8S_TOOLS:-} ]] && return 0
  local d=$PWD
  while [[ $d != / ]]; do
    d=$(dirname "$d")
    [[ -f $d/shared/tools/k8s/kubelet.xz ]] && return 0
  done
  [[ -f /work/shared/tools/k8s/kubelet.xz ]] # tests/src/k8s.rs's last place to look
}
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
# Includes tests/tests/kubernetes.rs: a one-node cluster from shared/tools/k8s (beside the
# checkout or above it, or $K8S_TOOLS); it skips without them, except under CI=true. So does
# tests/tests/kube_duties.rs (its own etcd and kube-apiserver only, on free loopback ports).
cargo test --workspace --locked --no-fail-fast "${hooks[@]}" -- --test-threads="${TEST_THREADS:-4}" 2>&1 |
  tee "$log"
rc=${PIPESTATUS[0]}
set -e
# cargo closes a failed run with "error: N targets failed:" and one `-p crate --test name` a line.
# shellcheck disable=SC2016 # the backquotes are cargo's, not an expansion
mapfile -t -O "${#failed[@]}" failed < <(sed -n '/^error: [0-9]* targets\? failed:$/,$ s/^    `\(.*\)`$/\1/p' "$log")
((rc == 0 || ${#failed[@]})) || failed+=("cargo test (exit $rc, see $log)")
read -r passed nfailed < <(awk '/^test result:/ { p += $4; f += $6 } END { print p + 0, f + 0 }' "$log")
nskipped=$(wc -l <"$EBS_SKIP_LOG")
echo
echo "== summary =="
((${#failed[@]})) && printf 'FAILED: %s\n' "${failed[@]}"
cat "$EBS_SKIP_LOG"
# One plain closing line; a skipped test counts as skipped, not passed.
echo "tests: $((passed - nskipped)) passed, $nfailed failed, $nskipped skipped"
((${#failed[@]} == 0))
