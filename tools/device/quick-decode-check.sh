#!/usr/bin/env bash
# A short decode-path check for a session with little device time (~2-3 minutes; the full check
# is run-all.sh). Runs on the GPU machine through the device tool and builds nothing: needs
# .device/cuda from tools/device/bundle.sh (carry: [".device/cuda.tar.xz"]).
#
#  1. cuda_real_model_test's decode cases: the real-shape model against the CPU model, CUDA graphs
#     against eager launches bit for bit, short contexts without the indexer;
#  2. 8-layer decode steps (M3.1-Flash shapes, GPU-sampled tokens) for each arm of an A/B: the
#     arms are environment assignments for cuda_model_decode_bench, separated by '|', run in
#     turn twice (A B A B) so that drift shows;
#  3. sparse_decode_test and moe_route_test (attention, indexer, norm, router against the CPU).
# Every part writes to $OUT as it goes, so a call cut by its time limit still returns what ran.
#
# Usage: quick-decode-check.sh [arms] [configs]
#   arms     default "M3_BENCH_NORM_CLUSTER_ROWS=16|M3_BENCH_NORM_CLUSTER_ROWS=0"
#            (CudaM3Tuning through the bench's environment)
#   configs  M3_BENCH_ONLY, default "1,1024;1,4096;8,4096"
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
ARMS=${1:-"M3_BENCH_NORM_CLUSTER_ROWS=16|M3_BENCH_NORM_CLUSTER_ROWS=0"}
CONFIGS=${2:-"1,1024;1,4096;8,4096"}
. tools/device/bundle-env.sh
LOG=$OUT/quick.log
SUMMARY=()
{ date -u +%FT%TZ; cat "$B/BUILD_INFO"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv; } >>"$LOG" 2>&1

run() {  # label limit command...
  local label=$1 limit=$2 t0=$SECONDS
  shift 2
  echo "== $label" >>"$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  SUMMARY+=("$(printf '%-44s rc=%-3s %4ss' "$label" "$rc" "$((SECONDS - t0))")")
  echo "== $label rc=$rc ($((SECONDS - t0))s)" >>"$LOG"
}

run "cuda_real_model_test Decode*" 90 "$B/cuda_real_model_test" --gtest_filter='CudaRealModel.Decode*'
IFS='|' read -r -a arms <<<"$ARMS"
for round in 1 2; do
  for arm in "${arms[@]}"; do
    run "bench round $round: $arm" 40 env $arm M3_BENCH_SAMPLE=1 M3_BENCH_LAYERS=8 \
      M3_BENCH_ONLY="$CONFIGS" "$B/cuda_model_decode_bench" -
  done
done
run sparse_decode_test 60 "$B/sparse_decode_test"
run "moe_route_test MatchesDotProducts*" 80 "$B/moe_route_test" --gtest_filter='MoeRoute.Matches*'
{
  echo "== summary"
  printf '%s\n' "${SUMMARY[@]}"
  grep -h "ms per step\|PASS\|FAIL\|FAILED\|exact" "$LOG" | grep -v "^\[ RUN\|^\[       OK" | tail -40
} | tee -a "$LOG"
