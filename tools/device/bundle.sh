#!/usr/bin/env bash
# Builds the CUDA op tests, the tiny-model GPU test, the decode benchmark, the CUPTI kernel tracer
# (tools/trace) and m3serve here (build-cuda/, sm_90a) and gathers what the GPU machine needs into
# .device/cuda/ (ignored by git), which the device call names in `carry`. Nothing is built on the
# GPU machine.
#   tools/device/bundle.sh            # then, through the device tool:
#   run: bash tools/device/run-all.sh   carry: [".device/cuda.tar.xz"]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build-cuda}
DEST=.device/cuda
BINS=(cuda_ops_test cuda_composite_ops_test kv_dtype_ops_test quant_gemv_test quant_gemv_mma_test sparse_decode_test dense_decode_test cuda_model_test
      cuda_decode_bench cuda_decode_step_bench
      prefill_gemm_test prefill_attention_test cuda_prefill_bench cuda_golden_test
      cuda_model_decode_bench cuda_sync_bench
      sampling_test sampling_bench cuda_real_model_test moe_route_test attention_inputs_test embed_bf16_test
      fp8_mma_probe stream_pattern_probe nccl_communicator_test cuda_tensor_parallel_test
      one_shot_all_reduce_test cuda_tp_bench dspark_f32_test
      dspark_real_test cuda_dspark_bench cuda_vision_tower_test cuda_vision_ttft_bench)
cmake -S . -B "$BUILD" -G Ninja -DM3_CUDA=ON >/dev/null
cmake --build "$BUILD" -j "${JOBS:-2}" --target "${BINS[@]}" m3_cuda_trace
# m3serve links every layer; others' work in progress may not compile: then bundle without it.
M3SERVE=yes
cmake --build "$BUILD" -j "${JOBS:-2}" --target m3serve >/tmp/m3serve-build.$$.log 2>&1 || M3SERVE=no
rm -rf "$DEST"
mkdir -p "$DEST"
for b in "${BINS[@]}"; do
  # Host debug info is dropped (size); the device line info stays in the fat binary.
  objcopy --strip-debug "$BUILD/cuda-tests/$b" "$DEST/$b"
done
if [ "$M3SERVE" = yes ]; then
  objcopy --strip-debug "$BUILD/bin/m3serve" "$DEST/m3serve"
else
  echo "m3serve did not build (see /tmp/m3serve-build.$$.log); bundling without it"
fi
# Shared libraries the GPU machine may lack: anything outside glibc/libstdc++/CUDA.
for b in "$DEST"/*; do
  ldd "$b" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libpthread*|libdl*|librt*|libcublas*|libcudart*|libcuda.so*|libnccl*) ;;  # the GPU machine has its own NCCL
      *) cp -n "$lib" "$DEST/" && echo "bundled $(basename "$lib") (needed by $(basename "$b"))" ;;
    esac
  done
done
# The kernel tracer (tools/device/trace-decode.sh) and the CUPTI it was linked against (the GPU
# machine may have none, or another version); after the loop above, which would only find it too.
objcopy --strip-debug "$BUILD/lib/libm3_cuda_trace.so" "$DEST/libm3_cuda_trace.so"
CUPTI=$(sed -n 's/^CUDA_cupti_LIBRARY:FILEPATH=//p' "$BUILD/CMakeCache.txt")
cp -L "$(dirname "$CUPTI")/libcupti.so.13" "$DEST/"
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src/backend/cuda tests/backend_cuda tools/bench tools/trace tools/device/bundle.sh tools/device/run-all.sh || echo '-dirty')"
  echo "built $(date -u +%FT%TZ) on $(hostname) with $(/usr/local/cuda/bin/nvcc --version | tail -1)"
  echo "m3serve bundled: $M3SERVE"
} >"$DEST/BUILD_INFO"
# The device call's working tree is limited to 64 MiB and the repository alone is ~46 MB: carry
# the binaries compressed (~4 MB instead of ~52 MB); run-all.sh unpacks them.
tar -C "$(dirname "$DEST")" -cf - "$(basename "$DEST")" | xz -9 -T2 >"$DEST.tar.xz"
du -sh "$DEST" "$DEST.tar.xz"
cat "$DEST/BUILD_INFO"
