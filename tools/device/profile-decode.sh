#!/usr/bin/env bash
# Runs on the GPU machine: a per-kernel profile of batch-1 decode through CudaM3Model::forward
# (M3.1-Flash shapes, GPU dummy weights). With Nsight Systems: the CUDA-graph timeline per node
# (start, duration, stream), so gaps and overlap show; otherwise Nsight Compute's isolated
# duration of each kernel. Needs .device/cuda (tools/device/bundle.sh; carry .device/cuda.tar.xz).
# Usage: profile-decode.sh [B,C=1,4096] [layers=2]
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
export M3_BENCH_ONLY=${1:-1,4096} M3_BENCH_LAYERS=${2:-2}
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  "$NSYS" profile -o "$OUT/decode" --force-overwrite true --trace cuda --cuda-graph-trace node \
    "$B/cuda_model_decode_bench" - >"$OUT/profile.log" 2>&1
  "$NSYS" stats --report cuda_gpu_trace --format csv --output "$OUT/trace" "$OUT/decode.nsys-rep" \
    >>"$OUT/profile.log" 2>&1
  rm -f "$OUT"/decode.nsys-rep "$OUT"/decode.sqlite
else
  # Warm caches and unlocked clocks, as in the graph; the first ~600 launches are weight
  # generation and warm-up steps.
  ncu --graph-profiling node --cache-control none --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --launch-skip "${SKIP:-600}" \
    --launch-count "${COUNT:-300}" "$B/cuda_model_decode_bench" - >"$OUT/ncu.csv" \
    2>"$OUT/profile.log"
fi
tail -3 "$OUT/profile.log"
ls -la "$OUT"
