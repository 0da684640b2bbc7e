#!/usr/bin/env bash
# The test suites under load: every CPU saturated by a busy loop while ctest runs the whole suite
# ROUNDS times (default 2) in BUILD (default build, then build-asan when it exists), as -j nproc.
# A test that depends on a timing margin a loaded machine breaks fails here. Run after
# tests/run.sh (which builds both trees):
#     bash tests/run-loaded.sh [ROUNDS]
# Exits non-zero on the first failing round; the ctest logs are in $TMPDIR/attnstat-loaded-*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
jobs=$(nproc 2>/dev/null || echo 2)
tmp=${TMPDIR:-/tmp}

hogs=()
cleanup() { [ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq "$jobs"); do
  ( while :; do :; done ) &
  hogs+=($!)
done
echo "run-loaded: $jobs busy loops started (pids ${hogs[*]})"

trees=(build)
[ -d build-asan ] && trees+=(build-asan)
for r in $(seq "$rounds"); do
  for b in "${trees[@]}"; do
    log="$tmp/attnstat-loaded-$b-$r.log"
    start=$(date +%s)
    if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       ctest --test-dir "$b" --output-on-failure -j "$jobs" --timeout 900 >"$log" 2>&1; then
      echo "run-loaded: round $r, $b: passed in $(( $(date +%s) - start )) s"
    else
      echo "run-loaded: round $r, $b: FAILED (log: $log)"
      grep -E "Failed|\*\*\*|FAIL" "$log" | head -20
      exit 1
    fi
  done
done
echo "run-loaded: every round passed with every CPU busy"
