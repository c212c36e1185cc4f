#!/usr/bin/env bash
# Runs on the GPU machine: why the routed experts' grouped GEMM runs at the speed it does.
# Nsight Compute on the register-weights loop (PrefillMoeKernel::kGroupedWgmmaRegisterWeights:
# its gate|up and down launches inside `cuda_prefill_bench - --experts`): speed of light, warp
# stall reasons, scheduler and instruction statistics, memory workload and the utilisation of
# the tensor, ALU, FMA, FP16 and LSU pipes, which say whether the NVFP4 conversion fills the issue
# slots, the warps wait on the wgmma pipeline or on the token copies, or L2 bounds it.
#   TOKENS=8192 bash tools/device/profile-expert-gemm.sh    ($OUT set; carry .device/cuda.tar.xz
#   from `tools/device/bundle.sh cuda_prefill_bench`)
# Writes $OUT/expert-gemm-ncu.txt and prints the lines that matter.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats
          --section InstructionStats --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section Occupancy)
metrics=""
for m in sm__pipe_tensor_op_hmma_cycles_active sm__inst_executed_pipe_alu \
         sm__inst_executed_pipe_fma sm__inst_executed_pipe_fp16 sm__inst_executed_pipe_lsu; do
  metrics+="${metrics:+,}$m.avg.pct_of_peak_sustained_active"
done
timeout "${LIMIT:-200}" ncu --clock-control none -k "regex:grouped_expert_gemm_wgmma_rs" --launch-skip 0 \
  --launch-count 2 "${SECTIONS[@]}" --metrics "$metrics" --print-details all \
  "$B/cuda_prefill_bench" - --experts "${TOKENS:-8192}" >"$OUT/expert-gemm-ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "grouped_expert|Duration|Throughput|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|Stall|pipe_|Registers|Achieved Occ|No Eligible|Eligible Warps|L2 Hit|Mem Busy|Max Bandwidth" \
  "$OUT/expert-gemm-ncu.txt" | head -100
