#!/usr/bin/env bash
# Runs on the GPU machine: why a batch-1 GEMV runs at the speed it does. Nsight Compute on one
# launch each of the NVFP4 expert gate|up (kMmaRing, mma layout, 1 token), the MXFP8 qkv at one
# row on kDequantSplitK and on kMmaRing: speed of light, warp stall reasons, instruction mix and the
# utilisation of each execution pipe (ALU, FMA, tensor, LSU, ...), which says whether the
# dequantisation saturates a pipe or the warps wait on latency. Writes $OUT/pipes-*.txt.
# Needs .device/cuda (tools/device/bundle.sh; carry .device/cuda.tar.xz).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
# Only the pipe metrics this ncu knows (an unknown name fails the whole run).
ncu --query-metrics >"$OUT/metrics.txt" 2>&1
metrics=""
for m in sm__inst_executed_pipe_alu sm__inst_executed_pipe_fma sm__inst_executed_pipe_fmaheavy \
         sm__inst_executed_pipe_fmalite sm__inst_executed_pipe_fp16 sm__inst_executed_pipe_lsu \
         sm__inst_executed_pipe_uniform sm__inst_executed_pipe_xu sm__inst_executed_pipe_cbu \
         sm__inst_executed_pipe_adu sm__pipe_tensor_op_hmma_cycles_active \
         sm__pipe_alu_cycles_active sm__pipe_fma_cycles_active sm__pipe_shared_cycles_active \
         sm__pipe_fmaheavy_cycles_active sm__pipe_fp16_cycles_active; do
  grep -q "^$m " "$OUT/metrics.txt" && metrics+="${metrics:+,}$m.avg.pct_of_peak_sustained_active"
done
echo "pipe metrics: $metrics"
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats
          --section InstructionStats --section ComputeWorkloadAnalysis --section Occupancy)
prof() {  # name kernel-regex env... -- args
  local name=$1 re=$2
  shift 2
  env "$@" ncu -k "regex:$re" --launch-skip 3 --launch-count 1 "${SECTIONS[@]}" \
    --metrics "$metrics" --print-details all "$B/cuda_decode_bench" - "${V:-5}" \
    >"$OUT/pipes-$name.txt" 2>&1
  echo "== $name"; grep -E "Duration|DRAM Throughput|Executed Ipc A|pipe_|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Occ" "$OUT/pipes-$name.txt" | head -30
}
prof experts-up quant_gemv_mma_kernel M3_BENCH_STREAM_ONLY=2 M3_BENCH_MOE_PART=up
V=3 prof qkv-v3 quant_gemv_kernel_v3 M3_BENCH_STREAM_ONLY=1
prof qkv-v5 quant_gemv_mma_kernel M3_BENCH_STREAM_ONLY=1
