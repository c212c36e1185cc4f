#!/usr/bin/env bash
# Runs on the GPU machine: the CUDA-graph timeline of batch-1 decode through CudaM3Model::forward
# (M3.1-Flash shapes, GPU dummy weights) without Nsight Systems, through the CUPTI tracer
# libm3_cuda_trace.so (tools/trace) injected by the driver: each kernel node's start, duration and
# gap to the previous one. Needs .device/cuda (tools/device/bundle.sh; carry .device/cuda.tar.xz).
# Usage: trace-decode.sh [B,C=1,4096] [layers=4] [last kernels=150]
# Files back in $OUT: trace.csv (every kernel / memcpy / memset of the run, start order) and
# trace.log (the bench's output, then the last kernels one per line, per-name totals, totals).
#
# The bench is `cuda_model_decode_bench -` (no results file; the tuning from the environment, see
# the bench). With M3_BENCH_LAYERS set it
# loads one model and runs 3 warm-up steps (the first eager, then captured; graph replays from
# the second) and 15 timed steps per config, then exits with no GPU work after them: the last
# kernels of the run are graph replays of the last config's last timed steps (a step launches
# more than 10 kernels even at 1 layer, so 150 stay within the 15 timed steps; the summary's
# first line says how many came from a graph). The untraced step time is printed first: CUPTI's
# per-kernel timestamps may slow the replay, and the difference bounds how much it inflates the
# gaps.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
[ -f "$B/libm3_cuda_trace.so" ] || { echo "no $B/libm3_cuda_trace.so: rerun tools/device/bundle.sh" >&2; exit 1; }
export M3_BENCH_ONLY=${1:-1,4096} M3_BENCH_LAYERS=${2:-4}
echo "untraced: $("$B/cuda_model_decode_bench" - 2>&1 | grep 'ms per step')"
CUDA_INJECTION64_PATH="$PWD/$B/libm3_cuda_trace.so" M3_TRACE_OUT="$OUT/trace.csv" M3_TRACE_LAST=${3:-150} \
  "$B/cuda_model_decode_bench" - >"$OUT/trace.log" 2>&1
echo "exit status $?"
echo "traced:   $(grep 'ms per step' "$OUT/trace.log")"
grep '^cuda_trace: ' "$OUT/trace.log" | head -3
# The summary's tail: per-name table (largest total first) and the window's totals; the
# per-kernel lines above it are in trace.log.
sed -n '/^cuda_trace: per kernel name/,$p' "$OUT/trace.log" | grep -v '^cuda_trace: window span' | head -50
grep '^cuda_trace: window span' "$OUT/trace.log"
ls -la "$OUT"
