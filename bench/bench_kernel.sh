#!/bin/bash
# bench_kernel.sh — build the CUDA kernels and compare them with PyTorch (bench/bench_kernel.py).
# Run from the repository root on a machine with an NVIDIA GPU, PyTorch and the CUDA toolkit:
#   bench/bench_kernel.sh            build libattnstat_cuda.so, check against float64, print the table
#   bench/bench_kernel.sh test       build and run tests/test_stats_cuda
#   bench/bench_kernel.sh sanitize   the same test under compute-sanitizer memcheck and racecheck
#   bench/bench_kernel.sh profile    Nsight Compute on one run of each variant (PROFILE_VARIANTS,
#                                    default 0) of (2,32,4096,128) full
#   bench/bench_kernel.sh dev ARGS   build and run kernels/dev/stats_dev (e.g. `dev all`, `dev 2 1 16
#                                    4096 128 --causal`): variant N against the CPU reference, timed
#   bench/bench_kernel.sh extras     the bench, each shape also asking for sink mass and distance
#                                    (the kernels' instances that compute them), checked and timed
#                                    beside the default run
#   bench/bench_kernel.sh maxonly    the same asking for the max logit alone (the instances
#                                    without exps)
#   ATTNSTAT_BENCH_VARIANTS=0,1,.. bench/bench_kernel.sh   also check and time those variants
#   ATTNSTAT_TEST_VARIANTS=1 bench/bench_kernel.sh test     also test every Hopper variant (0-3)
#   ATTNSTAT_TEST_WG_ONLY=N bench/bench_kernel.sh sanitize  the sanitizers on Hopper variant N alone
# Variant numbers: kernels/cuda/variants.h (`stats_dev list`), the same in bench/kernel_notes.md.
# BENCH_LINEINFO=1 builds with -lineinfo (source lines for Nsight Compute's source page and
# bench/ncu_regions.py; the code is the same). BUILD (default build-cuda) names the build
# directory. When the CMake configure of the whole project fails (a dependency missing on the GPU
# machine), the kernels and the test are compiled directly with nvcc and cc instead.
set -euo pipefail
BUILD=${BUILD:-build-cuda}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=$(dirname "$(dirname "$NVCC")")
mode=${1:-bench}
LINEINFO=()
[ "${BENCH_LINEINFO:-0}" = 1 ] && LINEINFO=(-lineinfo)
[ $# -gt 0 ] && shift

direct_build() {
  mkdir -p "$BUILD/direct"
  local d="$BUILD/direct"
  local objs=() src
  for src in kernels/cuda/*.cu; do  # one object per file, no -rdc (as kernels/cuda.cmake)
    "$NVCC" -std=c++17 -O3 -Xcompiler=-fPIC -Xptxas=-warn-spills -gencode=arch=compute_90a,code=sm_90a \
      -gencode=arch=compute_80,code=sm_80 ${LINEINFO[@]+"${LINEINFO[@]}"} -Ikernels -Ivocab \
      -c "$src" -o "$d/$(basename "$src" .cu).o"
    objs+=("$d/$(basename "$src" .cu).o")
  done
  cc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Ikernels -Ivocab -c kernels/stats.c -o "$d/stats.o"
  cc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Ikernels -Ivocab -c kernels/stats_cpu.c -o "$d/stats_cpu.o"
  objs+=("$d/stats.o" "$d/stats_cpu.o")
  local cudalib="-L$CUDA_HOME/lib64 -lcudart_static -lstdc++ -lrt -ldl -lpthread -lm"
  cc -shared -o "$d/libattnstat_cuda.so" "${objs[@]}" $cudalib
  if [ "$mode" = test ] || [ "$mode" = sanitize ] || [ "$mode" = build ]; then
    cc -std=c11 -O2 -D_GNU_SOURCE -Ikernels -I"$CUDA_HOME/include" $(pkg-config --cflags check) \
      tests/test_stats_cuda.c "${objs[@]}" $(pkg-config --libs check) $cudalib -o "$d/test_stats_cuda"
  fi
  if [ "$mode" = dev ] || [ "$mode" = build ]; then
    cc -std=c11 -O2 -D_GNU_SOURCE -Ikernels -I"$CUDA_HOME/include" kernels/dev/stats_dev.c \
      "${objs[@]}" $cudalib -o "$d/stats_dev"
  fi
  LIB="$d/libattnstat_cuda.so"
  TEST="$d/test_stats_cuda"
  DEV="$d/stats_dev"
}

gencode=() # kernels/cuda.cmake's default -gencode list with -lineinfo
gc="-gencode=arch=compute_90a,code=sm_90a;-gencode=arch=compute_80,code=sm_80"
gc="$gc;-gencode=arch=compute_80,code=compute_80"
[ ${#LINEINFO[@]} -gt 0 ] && gencode=("-DATTNSTAT_CUDA_GENCODE=$gc;-lineinfo")
if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNSTAT_CUDA=ON \
    ${gencode[@]+"${gencode[@]}"} >"$BUILD.configure.log" 2>&1; then
  targets=(attnstat_cuda)
  if [ "$mode" = test ] || [ "$mode" = sanitize ] || [ "$mode" = build ]; then
    targets+=(test_stats_cuda)
  fi
  if [ "$mode" = dev ] || [ "$mode" = build ]; then
    targets+=(stats_dev)
  fi
  LIB="$BUILD/kernels/libattnstat_cuda.so"
  TEST="$BUILD/tests/test_stats_cuda"
  DEV="$BUILD/kernels/stats_dev"
  if ! cmake --build "$BUILD" --target "${targets[@]}"; then
    echo "bench_kernel.sh: the CMake build failed; building directly" >&2
    direct_build
  fi
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
elif [ "$mode" = build ]; then
  echo "built $LIB, $TEST and $DEV"
elif [ "$mode" = dev ]; then
  "$DEV" "${@:-all}"
elif [ "$mode" = profile ]; then
  rep=${PROFILE_REPORT:-$BUILD/profile}
  args=(-k "regex:stats_(wg|ws|mma|generic)" python3 bench/profile_kernel.py "$LIB" "${PROFILE_VARIANTS:-0}"
        "${PROFILE_SHAPE:-0}")
  sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats
            --section SchedulerStats --section InstructionStats --section Occupancy)
  pipes=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
  ncu -f -o "$rep" "${sections[@]}" --metrics "$pipes" "${args[@]}" ||
    ncu -f -o "$rep" "${sections[@]}" "${args[@]}"
  ncu -i "$rep.ncu-rep" --page details
  ncu -i "$rep.ncu-rep" --page raw --csv > "$rep.raw.csv"
elif [ "$mode" = extras ]; then
  ATTNSTAT_BENCH_EXTRAS=1 python3 bench/bench_kernel.py "$LIB"
elif [ "$mode" = maxonly ]; then
  ATTNSTAT_BENCH_MAXONLY=1 python3 bench/bench_kernel.py "$LIB"
else
  python3 bench/bench_kernel.py "$LIB"
fi
