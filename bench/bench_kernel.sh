#!/bin/bash
# bench_kernel.sh — build the CUDA kernels and compare them with PyTorch (bench/bench_kernel.py).
# Run from the repository root on a machine with an NVIDIA GPU, PyTorch and the CUDA toolkit:
#   bench/bench_kernel.sh            build libattnstat_cuda.so, check against float64, print the table
#   bench/bench_kernel.sh test       build and run tests/test_stats_cuda
#   bench/bench_kernel.sh sanitize   the same test under compute-sanitizer memcheck and racecheck
# BUILD (default build-cuda) names the build directory. When the CMake configure of the whole
# project fails (a dependency missing on the GPU machine), the kernels and the test are compiled
# directly with nvcc and cc instead.
set -euo pipefail
BUILD=${BUILD:-build-cuda}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=$(dirname "$(dirname "$NVCC")")
mode=${1:-bench}

direct_build() {
  mkdir -p "$BUILD/direct"
  local d="$BUILD/direct"
  "$NVCC" -std=c++17 -O3 -Xcompiler=-fPIC -Xptxas=-warn-spills -gencode=arch=compute_90a,code=sm_90a \
    -gencode=arch=compute_80,code=sm_80 -Ikernels -c kernels/stats_cuda.cu -o "$d/stats_cuda.o"
  cc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Ikernels -c kernels/stats.c -o "$d/stats.o"
  cc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Ikernels -c kernels/stats_cpu.c -o "$d/stats_cpu.o"
  local cudalib="-L$CUDA_HOME/lib64 -lcudart_static -lstdc++ -lrt -ldl -lpthread -lm"
  cc -shared -o "$d/libattnstat_cuda.so" "$d/stats_cuda.o" "$d/stats.o" "$d/stats_cpu.o" $cudalib
  if [ "$mode" != bench ]; then
    cc -std=c11 -O2 -D_GNU_SOURCE -Ikernels -I"$CUDA_HOME/include" $(pkg-config --cflags check) \
      tests/test_stats_cuda.c "$d/stats_cuda.o" "$d/stats.o" "$d/stats_cpu.o" \
      $(pkg-config --libs check) $cudalib -o "$d/test_stats_cuda"
  fi
  LIB="$d/libattnstat_cuda.so"
  TEST="$d/test_stats_cuda"
}

if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNSTAT_CUDA=ON >"$BUILD.configure.log" 2>&1; then
  if [ "$mode" != bench ]; then
    cmake --build "$BUILD" --target test_stats_cuda attnstat_cuda
  else
    cmake --build "$BUILD" --target attnstat_cuda
  fi
  LIB="$BUILD/kernels/libattnstat_cuda.so"
  TEST="$BUILD/tests/test_stats_cuda"
else
  echo "bench_kernel.sh: the CMake configure failed (see $BUILD.configure.log); building directly" >&2
  tail -5 "$BUILD.configure.log" >&2 || true
  direct_build
fi

if [ "$mode" = test ]; then
  "$TEST"
elif [ "$mode" = sanitize ]; then
  seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool (seed $seed)"
    ATTNSTAT_TEST_SEED=$seed timeout "${SANITIZER_TIMEOUT:-900}" \
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$TEST" 2>&1 | tail -6
  done
else
  python3 bench/bench_kernel.py "$LIB"
fi
