#!/usr/bin/env bash
# The test command. On a fresh machine: installs the dependencies, builds attnstat (CUDA parts too
# when nvcc is present), runs every test with ctest, then builds again with AddressSanitizer and
# UndefinedBehaviorSanitizer and runs every test once more, then fuzzes the daemon's receiving side
# in process for FUZZ_SECONDS (tests/fuzz.sh: libFuzzer under clang; skipped, saying why, where
# clang is missing). Exits non-zero on any failure.
#   ATTNSTAT_SKIP_SANITIZE=1   skip the sanitizer pass (quicker local runs)
#   FUZZ_SECONDS=N             fuzz for N seconds (default 60; 0 skips the fuzz run)
#   ATTNSTAT_TEST_NO_INSTALL=1 test_package builds and inspects the Debian packages but does not
#                              install them (as root it otherwise installs them with dpkg, runs
#                              them and purges them; the user attnstat it creates stays)
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh

jobs=$(nproc 2>/dev/null || echo 2)

echo "== build (release) =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNSTAT_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
echo "== tests (release) =="
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600

if [ "${ATTNSTAT_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== build (asan+ubsan) =="
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DATTNSTAT_SANITIZE=ON \
        -DATTNSTAT_CUDA=OFF -DATTNSTAT_WERROR=ON >/dev/null
  cmake --build build-asan -j "$jobs"
  echo "== tests (asan+ubsan) =="
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 900
fi
if [ "${FUZZ_SECONDS:-60}" != 0 ]; then
  bash tests/fuzz.sh "${FUZZ_SECONDS:-60}"
fi
echo "== all tests passed =="
