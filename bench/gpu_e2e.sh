#!/usr/bin/env bash
# gpu_e2e.sh — on a GPU machine: builds what the GPU path needs, runs the GPU tests (tests/gpu), the
# example GPT (healthy and collapsing runs, alerts, heads) and the step-time overhead bench, and
# writes logs to OUTDIR (default ./gpu-e2e-out). Summary on stdout, last.
#   ATTNSTAT_GENCODE   nvcc -gencode flags (default: sm_90a only, for a quick Hopper build)
#   TESTS, PART        a part of tests/gpu (below; PART=two: the tests that need two GPUs);
#                      SKIP_TESTS, SKIP_EXAMPLE, SKIP_BENCH=1 skip a step
#   (the GPU tests alone, in two calls of under 10 minutes:
#    PART=1/2 SKIP_EXAMPLE=1 SKIP_BENCH=1 bench/gpu_e2e.sh $OUT, then PART=2/2 the same)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-e2e-out}}
mkdir -p "$out"
b=build-gpu-e2e
gencode=${ATTNSTAT_GENCODE:--gencode=arch=compute_90a,code=sm_90a}
t0=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  git log -1 --format='commit %H %s' 2>/dev/null || true
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
} > "$out/env.txt" 2>&1
cmake -S . -B $b -G Ninja -DATTNSTAT_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "-DATTNSTAT_CUDA_GENCODE=$gencode" > "$out/build.log" 2>&1 &&
  cmake --build $b -j "$(nproc)" --target attnstatd attnstat_shared attnstat_cli gpu_raw_push \
      >> "$out/build.log" 2>&1
build_rc=$?
echo "build rc $build_rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/build.log"
[ $build_rc -eq 0 ] || { tail -30 "$out/build.log"; exit 1; }
export ATTNSTAT_LIB=$PWD/$b/client/libattnstat.so ATTNSTAT_DAEMON=$PWD/$b/daemon/attnstatd
export ATTNSTAT_RAW_PUSH=$PWD/$b/tests/gpu_raw_push ATTNSTAT_GPU_OUT=$out PYTHONUNBUFFERED=1

# 1. GPU tests (all of tests/gpu: about 12 minutes on an H200, the compiled models most of it;
#    TESTS="TestGPU.test_N ..." runs a part; PART=K/N the K-th of N parts, every N-th test in the
#    file's order from the K-th, so that the suite fits calls of a limited length: PART=1/2 then
#    PART=2/2, the build kept between them)
if [ "${PART:-}" = two ] && [ -z "${TESTS:-}" ]; then # the tests marked @two_gpus
  TESTS=$(grep -A1 '^    @two_gpus$' tests/gpu/test_gpu.py | grep -oE 'def test_[0-9a-z_]+' |
          sed 's/^def /TestGPU./' | tr '\n' ' ')
elif [ -n "${PART:-}" ] && [ -z "${TESTS:-}" ]; then
  [[ "$PART" =~ ^[0-9]+/[0-9]+$ ]] && [ "${PART%/*}" -ge 1 ] && [ "${PART%/*}" -le "${PART#*/}" ] ||
    { echo "gpu_e2e: PART=$PART: K/N with 1 <= K <= N"; exit 2; }
  TESTS=$(grep -oE '^    def test_[0-9a-z_]+' tests/gpu/test_gpu.py | sed 's/^    def /TestGPU./' |
          awk -v k="${PART%/*}" -v n="${PART#*/}" '(NR - k) % n == 0' | tr '\n' ' ')
  [ -n "$TESTS" ] || { echo "gpu_e2e: PART=$PART selects no test"; exit 2; }
fi
[ "${SKIP_TESTS:-0}" = 1 ] && echo skipped > "$out/test_gpu.log" ||
timeout ${TEST_TIMEOUT:-1200} python3 tests/gpu/test_gpu.py -v ${TESTS:-} > "$out/test_gpu.log" 2>&1
test_rc=$?
echo "test_gpu rc $test_rc at $(( $(date +%s) - t0 )) s" >> "$out/test_gpu.log"
# the binding with real PyTorch 2 (CI has none: skipped there), with the GPU and the daemon built
[ "${SKIP_TESTS:-0}" = 1 ] || ATTNSTAT_CC=cc ATTNSTAT_INCLUDE=$PWD/include \
  timeout 120 python3 tests/test_python_torch.py > "$out/test_python_torch.log" 2>&1
py_rc=$?
echo "test_python_torch rc $py_rc at $(( $(date +%s) - t0 )) s" >> "$out/test_python_torch.log"

# 2. the example: healthy and collapsing runs on one daemon, then the CLI's view
ex=$(mktemp -d)
$ATTNSTAT_DAEMON --socket "$ex/s" --db "$ex/db" > "$out/example.log" 2>&1 &
dpid=$!
for i in $(seq 100); do [ -S "$ex/s" ] && break; sleep 0.1; done
{
  if [ "${SKIP_EXAMPLE:-0}" != 1 ]; then
  echo "== healthy: lr 6e-4, warm-up 100, every 10th step"
  timeout 150 python3 examples/gpt.py --socket "$ex/s" --run healthy --steps 400 --verbose
  echo "== collapse: lr 3e-2, no warm-up, no clipping, every 10th step"
  timeout 150 python3 examples/gpt.py --socket "$ex/s" --run collapse --steps 400 --lr 3e-2 \
      --warmup 0 --clip 0 --verbose
  cli="$b/client/attnstat --db $ex/db --color never"
  echo "== attnstat runs"; $cli runs
  echo "== attnstat alerts --run healthy"; $cli alerts --run healthy | head -20
  echo "== attnstat alerts --run collapse"; $cli alerts --run collapse | head -40
  echo "== attnstat heads --run healthy"; $cli heads --run healthy
  echo "== attnstat heads --run collapse"; $cli heads --run collapse
  echo "== attnstat trend --run collapse --layer 0"; $cli trend --run collapse --layer 0 | head -50
  fi
  if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== bench: step time off / every 10th / every step"
  timeout 200 python3 examples/gpt.py --socket "$ex/s" --run bench --bench --steps ${BENCH_STEPS:-2700} ${BENCH_ARGS:-}
  fi
} > "$out/example_out.log" 2>&1
kill -TERM $dpid; wait $dpid
echo "== summary ($(( $(date +%s) - t0 )) s)"
cat "$out/env.txt"
grep -E "^(test_|Ran|OK|FAILED|push CPU)|Error|error:" "$out/test_gpu.log" | head -40
grep -E "^(Ran|OK|FAILED|test_python_torch rc)" "$out/test_python_torch.log" 2>/dev/null
grep -E '^\{' "$out/example_out.log" | cut -c1-600
grep -E "raised" "$out/example_out.log" | head -5
# the status says whether the tests passed (the example and the bench are read from their logs)
[ "$test_rc" = 0 ] && [ "$py_rc" = 0 ]
