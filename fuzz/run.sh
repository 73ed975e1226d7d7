#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer on the stable toolchain and runs each for a bounded time.
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 10 s, every target)
#   FUZZ_PROFILE=ci  builds the cheap profile tests/run.sh uses (default: release, for campaigns)
# Coverage comes from LLVM's sanitizer-coverage pass, which stable rustc reaches through
# -Cpasses/-Cllvm-args (the flags cargo-fuzz passes with `--sanitizer none`); no nightly needed.
# The working corpus grows in fuzz/corpus/TARGET (not committed), seeded from fuzz/seeds/TARGET;
# a crash leaves its input in fuzz/artifacts/TARGET and fails the run.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-10}"
shift || true
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' Cargo.toml | grep -v '^ebs-fuzz$')
fi

export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares ${FUZZ_RUSTFLAGS:-}"
# The main workspace's CARGO_TARGET_DIR, if set, must not receive instrumented builds: they go to
# a directory of their own (their RUSTFLAGS differ, so sharing one would rebuild both each time),
# inside the main target/ so that one `cargo clean` or `du -sh target` covers every build.
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$PWD/../target/fuzz}"
# An explicit --target keeps RUSTFLAGS off build scripts and proc macros (which would not link).
triple="$(rustc -vV | sed -n 's/^host: //p')"
profile="${FUZZ_PROFILE:-release}"
cargo build --profile "$profile" --locked --bins --target "$triple"
bin="$CARGO_TARGET_DIR/$triple/$profile"

# Targets that need files write them below TMPDIR; libFuzzer exits without running destructors,
# so the run's own TMPDIR is removed here instead.
TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/ebs-fuzz.XXXXXX")"
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t" "seeds/$t"
    echo "fuzz: $t for ${secs}s"
    # -timeout: one input taking over 10 s is a hang, reported like a crash.
    if ! "$bin/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="artifacts/$t/" "corpus/$t" "seeds/$t" \
        2> "artifacts/$t/last-run.log"; then
        tail -n 40 "artifacts/$t/last-run.log"
        failed+=("$t")
    else
        grep -E '^stat::number_of_executed_units|^Done' "artifacts/$t/last-run.log" || true
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: crashes in ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${secs}s each, no crash"
