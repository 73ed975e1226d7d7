#!/usr/bin/env bash
# The closing summary of tests/run.sh:
#   tests/summary.sh CARGO_TEST_LOG SKIP_LOG CARGO_TEST_EXIT [FAILED_STEP...]
# CARGO_TEST_LOG: `cargo test --no-fail-fast` output (stdout and stderr) and CARGO_TEST_EXIT its
# exit code; SKIP_LOG: the lines
# tests append through ebs_tests::skip ("SKIPPED: test: reason"); FAILED_STEP: the steps before
# the tests that failed (fmt, clippy, fuzz, ...). Exits 1 when anything failed.
#
# Two units, never mixed in one number:
#   FAILED lines: one per failed step and one per failed test binary, as cargo names it
#     (`-p crate --test name`), each saying how many of its tests failed, or that it ended
#     without a `test result` line (it crashed, or refused before running any test);
#   tests: individual tests, from the `test result` lines. A skipped test (one line in the skip
#     log) shows as "ok" in cargo's output; it is counted as skipped, not passed.
# The closing line gives both: "2 FAILED lines (1 step, 1 test binary); tests: 300 passed,
# 4 failed, 25 skipped".
set -euo pipefail
log="$1" skips="$2" rc="$3"
shift 3
steps=("$@")

# Each failed binary: cargo prints "error: test failed, to rerun pass `X`" right after its output,
# whose last `test result` line (if any) came after its "Running"/"Doc-tests" line.
mapfile -t binaries < <(awk '
  /^ *(Running|Doc-tests) / { result = "" }
  /^test result: / { result = $6 }
  /^error: test failed, to rerun pass `/ {
    sub(/^error: test failed, to rerun pass `/, ""); sub(/`.*$/, "")
    if (result == "") print $0 ": no `test result` line (crashed, or refused before its tests)"
    else print $0 ": " result " test" (result == 1 ? "" : "s") " failed"
  }' "$log")
# cargo also fails without a failed binary (a build error): one FAILED line, as a step.
if ((rc != 0 && ${#binaries[@]} == 0)); then
  steps+=("cargo test (exit $rc): $(grep -m1 '^error' "$log" || echo "see $log")")
fi
read -r passed nfailed < <(awk '/^test result:/ { p += $4; f += $6 } END { print p + 0, f + 0 }' "$log")
nskipped=$(grep -c '^SKIPPED: ' "$skips" || true)

echo
echo "== summary =="
((${#steps[@]})) && printf 'FAILED: %s\n' "${steps[@]}"
((${#binaries[@]})) && printf 'FAILED: %s\n' "${binaries[@]}"
# Every skip with its reason; tests skipped for one reason share one line.
awk '
  /^SKIPPED: / {
    line = substr($0, 10); i = index(line, ": ")
    test = i ? substr(line, 1, i - 1) : line; why = i ? substr(line, i + 2) : "(no reason given)"
    if (!(why in n)) order[++k] = why
    names[why] = names[why] (n[why]++ ? ", " : "") test
  }
  END {
    for (j = 1; j <= k; j++) {
      w = order[j]
      printf "SKIPPED: %s%s: %s\n", names[w], (n[w] > 1 ? " (" n[w] " tests)" : ""), w
    }
  }' "$skips"
nlines=$((${#steps[@]} + ${#binaries[@]}))
n() { if (($1 == 1)); then echo "$1 $2"; else echo "$1 $3"; fi; }
echo "$(n "$nlines" "FAILED line" "FAILED lines") ($(n "${#steps[@]}" step steps)," \
  "$(n "${#binaries[@]}" "test binary" "test binaries"))"
# The plain closing line, alone and last, as CI reads it.
echo "tests: $((passed - nskipped)) passed, $nfailed failed, $nskipped skipped"
((nlines == 0))
