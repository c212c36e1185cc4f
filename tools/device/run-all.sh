#!/usr/bin/env bash
# Runs on the GPU machine (through the device tool), builds nothing: every CUDA op test against
# the CPU backend and the decode benchmarks at the real shapes (the real-shape kernel tests
# first, then the benchmark, then the composite ops and the tiny model end to end, the golden
# fixtures when present), then compute-sanitizer on the op tests (last: the device
# call's time limit may cut it); prints a short table last. Needs .device/cuda from
# tools/device/bundle.sh (carry: [".device/cuda.tar.xz"]).
# Files back in $OUT (at most 8): run-all.log (everything), tests.log, bench.log, bench.tsv,
# step.log, step.tsv, sanitizer.log (7; table-before-sanitizer.txt stays only when the
# call's limit cut the sanitizer).
# Usage: run-all.sh [all|tests|bench|decode|prefill|prefill-bench|parallel|dspark]. Everything at once can outlast one device command
# (10 minutes) when a kernel misbehaves: 'tests' (op tests, m3serve --device cuda, goldens,
# sanitizer) and 'bench' (decode, decode step, prefill) fit one command each; 'decode' is the
# decode path's tests (GEMV, attention/indexer, sampling, real-shape model) and benchmarks only;
# 'prefill' the prefill kernels', the vision tower's and sampling's tests, 'prefill-bench' their
# benchmarks (with the image time-to-first-token benchmark);
# 'parallel' the GPU ranks' tests (--tp 2 on one GPU through the host; NCCL where 2+ GPUs; with
# m3serve bundled and 2+ GPUs, serve-multi-node.sh: two processes as two nodes);
# 'dspark' the DSpark draft's GPU tests (docs/dspark.md, "CUDA").
# A call carries the repository and the bundle, 64 MiB in all: bundle the part's targets only,
# e.g. `tools/device/bundle.sh dspark_f32_test dspark_real_test cuda_dspark_bench m3serve` for
# 'dspark'; a test missing from the bundle is listed as NOT BUNDLED in the table.
set -uo pipefail
PART=${1:-all}
case "$PART" in all | tests | bench | decode | prefill | prefill-bench | parallel | dspark) ;;
  *) echo "usage: run-all.sh [all|tests|bench|decode|prefill|prefill-bench|parallel|dspark]" >&2; exit 2 ;; esac
# want P...: this run includes part P (decode = the decode-path tests and benchmarks only, ~5.5 min on an H200).
want() {
  [ "$PART" = all ] && return 0
  local x
  for x in "$@"; do [ "$PART" = "$x" ] && return 0; done
  return 1
}
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
LOG=$OUT/run-all.log
SUMMARY=()
note() { echo "$*" | tee -a "$LOG"; }

note "== $(date -u +%FT%TZ) $(hostname)"
cat "$B/BUILD_INFO" >>"$LOG" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem \
  --format=csv >>"$LOG" 2>&1
if [ -x "$B/m3serve" ]; then "$B/m3serve" version >>"$LOG" 2>&1; else note "m3serve not bundled"; fi

run_test() {  # name limit [gtest filter]
  local t=$1 limit=$2 filter=${3:-} t0=$SECONDS
  if [ ! -x "$B/$t" ]; then  # a bundle of some targets only (bundle.sh TARGET...): said, not run
    SUMMARY+=("$(printf '%-26s NOT BUNDLED' "$t${filter:+ [$filter]}")")
    note "test $t: not in this bundle"
    return
  fi
  local start
  start=$(wc -l 2>/dev/null <"$OUT/tests.log" || echo 0)
  echo "== $t${filter:+ [$filter]}" >>"$OUT/tests.log"
  timeout "$limit" "$B/$t" ${filter:+"--gtest_filter=$filter"} >>"$OUT/tests.log" 2>&1
  local rc=$?
  local failed
  failed=$(tail -n +"$((start + 1))" "$OUT/tests.log" | grep -c '^\[  FAILED  \]' || true)
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss  failed-lines=%s' "$t${filter:+ [$filter]}" "$rc" "$((SECONDS - t0))" "$failed")")
  note "test $t${filter:+ [$filter]} rc=$rc ($((SECONDS - t0))s)"
}
want tests && run_test cuda_ops_test 40
if want tests decode; then
  run_test quant_gemv_test 90
  run_test quant_gemv_mma_test 240  # ~170 s on an H200 (150 cut it)
  run_test sparse_decode_test 60
  run_test dense_decode_test 60
  run_test moe_route_test 240  # bf16 and float32 weights; router_logits up to 16384 rows
  run_test attention_inputs_test 90
  run_test embed_bf16_test 30
fi
want tests decode prefill && run_test sampling_test 90
# The DSpark draft on the GPU: the float32 draft on the CUDA backend against the CPU draft, and
# m3-tiny's greedy speculative output on the CUDA backend equal to ordinary decoding.
want tests dspark && run_test dspark_f32_test 120
want tests dspark && run_test dspark_real_test 180
# `m3serve serve --device cuda --speculative-algorithm DSPARK` on a real-shape model (the GPU
# draft wired through make_engine): a chat completion and m3serve bench at concurrency 1 and 8.
# Only in the dspark part (its two files would pass the 8-file budget of 'all').
if [ "$PART" = dspark ] && [ -x "$B/m3serve" ]; then
  t0=$SECONDS
  SERVE_ARGS="--speculative-algorithm DSPARK" CONCURRENCY="1 8" timeout 300 tools/device/serve-smoke.sh >/dev/null 2>&1
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' 'serve DSPARK (GPU draft)' "$?" "$((SECONDS - t0))")")
  tail -5 "$OUT/serve-smoke.log" >>"$LOG" 2>/dev/null
fi
# Forced acceptance 3 / 5 / 7 against plain decode at M3.1-Flash shapes, batch 1, 4, 16.
if want bench dspark; then
  t0=$SECONDS
  { echo "== cuda_dspark_bench"; timeout 240 "$B/cuda_dspark_bench" "$OUT/bench.tsv"; } >>"$OUT/bench.log" 2>&1
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' cuda_dspark_bench "$?" "$((SECONDS - t0))")")
  sed -n '/^== cuda_dspark_bench$/,$p' "$OUT/bench.log" >>"$LOG"
fi

run_bench() {
  local t0=$SECONDS
  # Main rows and the composed estimate with GEMV kDequantSplitK; kMmaRing and kMmaDirect beside them.
  timeout 120 "$B/cuda_decode_bench" "$OUT/bench.tsv" 3 >"$OUT/bench.log" 2>&1
  local rc=$?
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' cuda_decode_bench "$rc" "$((SECONDS - t0))")")
  cat "$OUT/bench.log" >>"$LOG"
}
want bench decode && run_bench
# launch_sample's two kernels (one CTA per row, rows over many CTAs) at batch 1-8.
if want bench decode prefill-bench; then
  t0=$SECONDS
  { echo "== sampling_bench"; timeout 60 "$B/sampling_bench" "$OUT/bench.tsv"; } >>"$OUT/bench.log" 2>&1
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' sampling_bench "$?" "$((SECONDS - t0))")")
  sed -n '/^== sampling_bench$/,$p' "$OUT/bench.log" >>"$LOG"
fi
# A whole decode step on the CUDA-core GEMVs (2 layers + head + sampling, CUDA graph); per-layer
# time extrapolated to 60 layers; rows appended to step.tsv.
if want bench decode; then
  t0=$SECONDS
  timeout 150 "$B/cuda_decode_step_bench" 2 "$OUT/step.tsv" >>"$OUT/step.log" 2>&1
  rc=$?
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' "decode step (CUDA cores)" "$rc" "$((SECONDS - t0))")")
  # The same step through CudaM3Model::forward (what serving runs): the default tuning, then both
  # CudaM3Tuning thresholds at 0 (one CTA per norm row, the router as three launches).
  for arm in "" "M3_BENCH_NORM_CLUSTER_ROWS=0 M3_BENCH_FUSED_ROUTER_ROWS=0"; do
    t0=$SECONDS
    timeout 150 env $arm "$B/cuda_model_decode_bench" - >>"$OUT/step.log" 2>&1
    rc=$?
    SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' "model decode (${arm:-default tuning})" "$rc" "$((SECONDS - t0))")")
  done
  # MiniMax-M3's layer mix (layers 0-2 full attention: dense decode over the whole context).
  t0=$SECONDS
  timeout 150 env M3_BENCH_MODEL=m3 M3_BENCH_ONLY="1,4096;1,32768;8,32768" \
    "$B/cuda_model_decode_bench" - >>"$OUT/step.log" 2>&1
  rc=$?
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' "model decode (MiniMax-M3)" "$rc" "$((SECONDS - t0))")")
  # FP8 mma precision and the NVFP4 consumer step's issue ceiling (weights in shared memory).
  t0=$SECONDS
  timeout 60 "$B/fp8_mma_probe" >>"$OUT/step.log" 2>&1
  rc=$?
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' fp8_mma_probe "$rc" "$((SECONDS - t0))")")
  cat "$OUT/step.log" >>"$LOG"
fi
if want tests; then
  run_test cuda_composite_ops_test 40
  run_test kv_dtype_ops_test 40  # --kv-cache-dtype: quantised KV write, indexer, attention
  run_test kv_quant_cache_test 40  # the real-shape path's quantised appends and staging pages
  run_test kv_quant_decode_test 60  # its decode kernels over codes = over dequantised bf16
  run_test cuda_model_test 40
fi
want tests parallel && run_test nccl_communicator_test 120  # one rank per GPU; the watchdog needs two
want tests decode && run_test cuda_real_model_test 240  # M3.1-Flash's layers, then M3's mix
want tests decode && run_test cuda_real_model_kv_quant_test 120  # the same over fp8 / fp4 KV
want tests parallel && run_test one_shot_all_reduce_test 120  # and the fused all-reduce + norm
want tests parallel && run_test cuda_tensor_parallel_test 420  # --tp 2 and --ep 2 (CPU ranks beside)
# GPU ranks over two nodes: two m3serve processes on loopback, one GPU each (--tp 2 --nnodes 2):
# a completion equal to one process's, then node 1 killed mid-stream (503s, node 0's non-zero
# exit within --dist-timeout), node 0 killed, a clean stop. Only in the parallel part, where 2+
# GPUs are; its files stay in a folder of its own (the 8-file budget), its log joins run-all.log.
if [ "$PART" = parallel ] && [ -x "$B/m3serve" ]; then
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    t0=$SECONDS
    MN_OUT=$(mktemp -d)
    OUT=$MN_OUT BIN_DIR=$B timeout 540 tools/device/serve-multi-node.sh >/dev/null 2>&1
    SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' 'serve --nnodes 2 (GPUs)' "$?" "$((SECONDS - t0))")")
    cat "$MN_OUT/serve-multi-node.log" >>"$LOG" 2>/dev/null
  else
    SUMMARY+=("$(printf '%-26s SKIPPED (one GPU)' 'serve --nnodes 2 (GPUs)')")
  fi
fi
want tests parallel && run_test cuda_dp_attention_test 420  # --tp 2/4 --dp 2 against the CPU ranks
# Prefill: tensor-core GEMMs (dequantise + cuBLASLt) and chunk attention against the
# CPU ops, then prefill tokens/s at 8K and 32K, appended to bench.log with its TSV (the file
# count stays within 8).
if want tests prefill; then
  # The grouped expert GEMM alone first, both main loops: a kernel fault leaves the CUDA context
  # unusable for the rest of a process, and these cases say where in the tile a result is wrong.
  run_test prefill_gemm_test 120 '*GroupedExpertGemm*'
  run_test prefill_gemm_test 240  # + the grouped expert GEMMs' T=8K real-shape layers
  # The wgmma main loop (grouped_expert_gemm_wgmma.cu) must have become HGMMA instructions.
  CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  if [ -x "$CUOBJDUMP" ]; then
    note "HGMMA instructions in prefill_gemm_test: $("$CUOBJDUMP" -sass "$B/prefill_gemm_test" | grep -c HGMMA)"
  else
    note "cuobjdump not found: HGMMA count not checked"
  fi
  run_test prefill_attention_test 360  # the float64 CPU reference of 18 chunks takes ~3-4 min
  # The vision tower on the GPU against the CPU tower (small config, then the real shapes:
  # ~1 GB of dummy weights generated on the host and the 32-layer CPU tower, ~1 min).
  run_test cuda_vision_tower_test 240
fi
if want bench prefill-bench; then
  t0=$SECONDS
  echo "== cuda_prefill_bench" >>"$OUT/bench.log"
  timeout 150 "$B/cuda_prefill_bench" /tmp/prefill.tsv >/tmp/prefill.log 2>&1
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' cuda_prefill_bench "$?" "$((SECONDS - t0))")")
  { cat /tmp/prefill.log; echo "== prefill tsv"; cat /tmp/prefill.tsv 2>/dev/null; } |
    tee -a "$OUT/bench.log" >>"$LOG"
  t0=$SECONDS
  echo "== cuda_prefill_bench --attention" >>"$OUT/bench.log"
  timeout 90 "$B/cuda_prefill_bench" --attention >/tmp/prefill_attn.log 2>&1
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' cuda_prefill_bench_attn "$?" "$((SECONDS - t0))")")
  tee -a "$OUT/bench.log" </tmp/prefill_attn.log >>"$LOG"
  # The routed experts alone, dequant+cuBLASLt vs the grouped in-loop kernels (mma.sync, wgmma),
  # T = 512 .. 32K.
  t0=$SECONDS
  timeout 180 "$B/cuda_prefill_bench" - --experts >/tmp/prefill_experts.log 2>&1
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' cuda_prefill_bench-experts "$?" "$((SECONDS - t0))")")
  { echo "== cuda_prefill_bench --experts"; cat /tmp/prefill_experts.log; } |
    tee -a "$OUT/bench.log" >>"$LOG"
  # Time to first token of a 1024 x 1024 image + 100 text tokens: the GPU vision tower, then the
  # image + text prefill (3 and up to 24 layers, extrapolated to 60); a row in bench.tsv.
  t0=$SECONDS
  echo "== cuda_vision_ttft_bench" >>"$OUT/bench.log"
  timeout 240 "$B/cuda_vision_ttft_bench" "$OUT/bench.tsv" >/tmp/vision_ttft.log 2>&1
  SUMMARY+=("$(printf '%-26s rc=%-3s %4ss' cuda_vision_ttft_bench "$?" "$((SECONDS - t0))")")
  tee -a "$OUT/bench.log" </tmp/vision_ttft.log >>"$LOG"
fi

# m3serve --device cuda: the bundled model's greedy tokens on the GPU equal the CPU's,
# and --load-format dummy runs the built-in MiniMax-M3.1-Flash config (1 layer, real shapes).
if want tests && [ -x "$B/m3serve" ]; then
  t0=$SECONDS
  gen=(generate --model-path models/m3-tiny --prompt-ids 4066,1,2,3,4,5 --max-tokens 16)
  # stdout only (the token ids): --device cuda says on stderr which path it took.
  cpu_out=$(timeout 60 "$B/m3serve" "${gen[@]}" --device cpu 2>>"$LOG")
  gpu_out=$(timeout 60 "$B/m3serve" "${gen[@]}" --device cuda 2>>"$LOG")
  note "m3serve generate m3-tiny --device cpu:  $cpu_out"
  note "m3serve generate m3-tiny --device cuda: $gpu_out"
  same=no
  [ -n "$gpu_out" ] && [ "$cpu_out" = "$gpu_out" ] && same=yes
  timeout 150 "$B/m3serve" score --load-format dummy --num-layers 1 --device cuda \
    --prompt-ids 1,2,3 2>&1 | cut -c1-160 >>"$LOG"
  dummy_rc=${PIPESTATUS[0]}
  SUMMARY+=("$(printf '%-26s same-as-cpu=%s dummy-rc=%s %4ss' 'm3serve --device cuda' "$same" \
    "$dummy_rc" "$((SECONDS - t0))")")
fi

# Golden fixtures (tests/fixtures/golden, from tools/reference): run end to end when present.
# cuda_golden_test runs them and the bundled m3-tiny's greedy cases through CudaBackend (same
# argmax / greedy checks as the CPU golden tests); it reads the fixtures from this directory.
if ! want tests; then
  :
elif compgen -G "tests/fixtures/golden/*" >/dev/null; then
  run_test cuda_golden_test 120
else
  note "golden fixtures: none in tests/fixtures/golden"
fi

print_table() {
  echo
  echo "== worst elements (|gpu - cpu| / bound; <= 1 passes)"
  grep -E '^\[ .* \] ' "$OUT/tests.log" 2>/dev/null |
    grep -v -E '^\[ (RUN|       OK|  FAILED|  PASSED|----------|==========)' | cut -c1-150
  echo
  echo "== benchmark"
  cat "$OUT/bench.log" 2>/dev/null
  echo
  echo "== decode step"
  cat "$OUT"/step.log 2>/dev/null
  echo
  echo "== summary"
  printf '%s\n' "${SUMMARY[@]}"
}
print_table >"$OUT/table-before-sanitizer.txt"

# compute-sanitizer on the op tests (small shapes only, to fit the time budget).
if ! want tests; then
  :
elif command -v compute-sanitizer >/dev/null; then
  t0=$SECONDS
  : >"$OUT/sanitizer.log"
  san() {  # tool limit test filter: runs one sanitizer pass, prints its exit status
    timeout "$2" compute-sanitizer --tool "$1" --error-exitcode 9 "$B/$3" --gtest_filter="$4" \
      >>"$OUT/sanitizer.log" 2>&1
    echo $?
  }
  rc1=$(san memcheck 30 cuda_ops_test \
    'CudaRmsNorm.*:CudaRope.*:CudaSwigluOai.*:CudaRouterTopk.*:*CudaLinear.*/1:CudaCachingAllocator.*')
  rc2=$(san memcheck 30 cuda_composite_ops_test '*/0')
  rc3=$(san racecheck 20 cuda_composite_ops_test '*CudaPagedAttention*/0:*CudaIndexerTopk*/0')
  # GEMV kMmaDirect and the MXFP8 repack (small shapes), and the fused router.
  rc4=$(san memcheck 90 quant_gemv_mma_test 'QuantGemvDirect.*:QuantGemvMmaArgs.*')
  # GEMV kMmaRing on one NVFP4 row (staged activations, block scales on the mma's outputs, a
  # partial last stage; the zeros after each staged chunk), memcheck and racecheck.
  v5one='Shapes/QuantGemvMma.DenseMatchesCpuOnDequantisedWeights/17:Shapes/QuantGemvMma.DenseMatchesCpuOnDequantisedWeights/18'
  rc11=$(san memcheck 90 quant_gemv_mma_test "$v5one")
  rc12=$(san racecheck 90 quant_gemv_mma_test "$v5one")
  rc5=$(san memcheck 60 moe_route_test 'MoeRoute.GraphReplays')
  # The norm's cluster kernel (distributed shared memory) and one-CTA kernel, and the decode
  # attention's split + combine (every-block cases: small), memcheck and racecheck.
  rc6=$(san memcheck 60 sparse_decode_test 'AddRmsNorm.*:SparseDecode.EveryBlock*')
  rc7=$(san racecheck 60 sparse_decode_test 'AddRmsNorm.FusedDelta*')
  # The decode attention chain under PDL (scoring with its keys before the wait, the top-k over
  # several CTAs per row, both split kernels) and the spread top-k at other head counts.
  rc13=$(san memcheck 60 attention_inputs_test 'AttentionInputs.IndexerChain*')
  rc14=$(san racecheck 60 attention_inputs_test 'AttentionInputs.IndexerChain*')
  rc15=$(san racecheck 90 sparse_decode_test 'SparseDecode.IndexerHeadCounts*')
  # The grouped expert GEMM's wgmma loop (NVFP4 row-major store, MXFP8 mma-layout SwiGLU; 3 and 5
  # stages). Its operands are read by the async proxy (wgmma), which racecheck may not model: a
  # hazard it reports there is to be read against the ordering argument in
  # grouped_expert_gemm_wgmma.cu before it is believed.
  gw='Shapes/GroupedExpertGemm.MatchesCpuPerElement/8:Shapes/GroupedExpertGemm.MatchesCpuPerElement/17'
  rc16=$(san memcheck 90 prefill_gemm_test "$gw")
  rc17=$(san racecheck 90 prefill_gemm_test "$gw")
  # The vision tower's kernels and GEMMs (small config: several images, padded keys).
  rc18=$(san memcheck 120 cuda_vision_tower_test 'CudaVisionTower.Small*:CudaVisionTower.Refuses*')
  SUMMARY+=("$(printf '%-26s memcheck=%s/%s/%s/%s/%s/%s/%s/%s/%s racecheck=%s/%s/%s/%s/%s/%s %ss' compute-sanitizer "$rc1" "$rc2" "$rc4" "$rc5" "$rc6" "$rc11" "$rc13" "$rc16" "$rc18" "$rc3" "$rc7" "$rc12" "$rc14" "$rc15" "$rc17" "$((SECONDS - t0))")")
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer.log" >>"$LOG"
else
  SUMMARY+=("compute-sanitizer not found")
fi
rm -f "$OUT/table-before-sanitizer.txt"
print_table | tee -a "$LOG"
