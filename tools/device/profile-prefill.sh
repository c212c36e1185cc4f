#!/usr/bin/env bash
# Runs on the GPU machine: why a prefill kernel runs at the speed it does. Nsight Compute: speed
# of light, warp stall reasons, scheduler and instruction statistics, compute and memory
# workload, occupancy, and the utilisation of the tensor, ALU, FMA, FP16 and LSU pipes, which
# say whether a conversion or the softmax fills the issue slots, the warps wait on the tensor
# pipe, on copies or at barriers, or L2 bounds the kernel.
#   bash tools/device/profile-prefill.sh experts     the routed experts' register-weights loop
#       (PrefillMoeKernel::kGroupedWgmmaRegisterWeights): its gate|up and down launches inside
#       `cuda_prefill_bench - --experts $TOKENS` (TOKENS default 8192)
#   bash tools/device/profile-prefill.sh attention   inside `cuda_prefill_bench --attention $TOKENS`
#       (default 32768): the fused indexer (kFusedMaxPool), then kTiled's staged kernel with the
#       random index queries and with the correlated ones (its launches in that bench: 2 before
#       the timed ones of each regime, 18 a regime)
# ($OUT set; carry .device/cuda.tar.xz from `tools/device/bundle.sh cuda_prefill_bench`.)
# Writes $OUT/prefill-ncu-<what>*.txt and prints the lines that matter.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
what=${1:-experts}
. tools/device/bundle-env.sh
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats
          --section InstructionStats --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section Occupancy)
metrics=""
for m in sm__pipe_tensor_op_hmma_cycles_active sm__inst_executed_pipe_alu \
         sm__inst_executed_pipe_fma sm__inst_executed_pipe_fp16 sm__inst_executed_pipe_lsu \
         sm__inst_executed_pipe_xu; do
  metrics+="${metrics:+,}$m.avg.pct_of_peak_sustained_active"
done
prof() {  # name kernel-regex launch-skip launch-count -- bench arguments
  local name=$1 re=$2 skip=$3 count=$4
  shift 5
  timeout "${LIMIT:-200}" ncu --clock-control none -k "regex:$re" --launch-skip "$skip" \
    --launch-count "$count" "${SECTIONS[@]}" --metrics "$metrics" --print-details all \
    "$B/cuda_prefill_bench" "$@" >"$OUT/prefill-ncu-$name.txt" 2>&1
  echo "== $name: ncu rc=$?"
  grep -E "^  [a-z_].*\(|Duration|Throughput|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|Stall|pipe_|Registers|Achieved Occ|Theoretical Occ|Block Limit|No Eligible|Eligible Warps|L2 Hit|Mem Busy|Max Bandwidth" \
    "$OUT/prefill-ncu-$name.txt" | head -80
}
case "$what" in
  experts)
    prof experts grouped_expert_gemm_wgmma_rs 0 2 -- - --experts "${TOKENS:-8192}" ;;
  attention)
    t=${TOKENS:-32768}
    prof attention-indexer index_block_scores_fused 1 1 -- --attention "$t"
    prof attention-tiled-random prefill_attention_tiled_kernel 2 1 -- --attention "$t"
    prof attention-tiled-correlated prefill_attention_tiled_kernel 20 1 -- --attention "$t" ;;
  *) echo "profile-prefill.sh: experts or attention, not '$what'" >&2; exit 2 ;;
esac
