#!/usr/bin/env bash
# The in-process fuzz run of the test command: builds tests/fuzz/fuzz_session with clang and
# libFuzzer (ASan + UBSan, tree build-fuzz/) and runs it over the seed corpus (tests/fuzz/corpus)
# for FUZZ_SECONDS (default 60) seconds. Fails on any crash, leak, sanitizer report or timeout
# (the input is kept under $TMPDIR/attnstat-fuzz-*/ and its path printed); then fuzz_validate
# (validate_push alone, host and device buffers) for FUZZ_VALIDATE_SECONDS (default half as long).
# Skipped, with the reason, where clang or its libFuzzer runtime is missing (deploy/install-deps.sh
# installs both).
#     bash tests/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${FUZZ_SECONDS:-60}}
jobs=$(nproc 2>/dev/null || echo 2)

if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz: SKIPPED: clang is not installed (Debian: clang, libclang-rt-dev)"
  exit 0
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return (int)(d && n > 99999); }\n' \
  >"$probe/p.c"
if ! clang -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then
  echo "fuzz: SKIPPED: clang has no libFuzzer runtime (Debian: libclang-rt-dev)"
  exit 0
fi

echo "== build (clang, libFuzzer, asan+ubsan) =="
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DATTNSTAT_FUZZ=ON -DATTNSTAT_CUDA=OFF >/dev/null
cmake --build build-fuzz -j "$jobs" --target fuzz_session fuzz_validate

# run TARGET SECONDS [CORPUS...]: one target for SECONDS over a fresh work corpus (and the seeds)
run() {
  local target=$1 t=$2 work
  shift 2
  work=$(mktemp -d "${TMPDIR:-/tmp}/attnstat-fuzz-XXXXXX")
  echo "== fuzz: $target for $t s${1:+ over $*} (work corpus $work) =="
  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     build-fuzz/tests/fuzz/$target -max_total_time="$t" -max_len=65536 -timeout=30 \
       -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/" \
       "$work" "$@" >"$work/fuzz.log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE|^fuzz_validate:" \
      "$work/fuzz.log" || true
    echo "fuzz: $target $t s, 0 crashes"
    rm -rf "$work"
  else
    tail -60 "$work/fuzz.log"
    echo "fuzz: FAILED: $target; the input and the log are in $work"
    exit 1
  fi
}
run fuzz_session "$secs" tests/fuzz/corpus
# validate_push() alone with host and device buffers (no seeds: it builds its pushes from bytes)
run fuzz_validate "${FUZZ_VALIDATE_SECONDS:-$(( (secs + 1) / 2 ))}"
