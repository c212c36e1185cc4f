#!/usr/bin/env bash
# Builds the CUDA op tests, the GPU tests and benchmarks, the CUPTI kernel tracer (tools/trace)
# and m3serve here (build-cuda/, sm_90a) and gathers what the GPU machine needs into .device/cuda
# (ignored by git), carried compressed as .device/cuda.tar.xz. Nothing is built on the GPU machine.
#   tools/device/bundle.sh [TARGET...]   # all of them, or only the named ones (e.g. m3serve)
#   run: bash tools/device/run-all.sh    carry: [".device/cuda.tar.xz"]
# A device call carries the repository's tracked files and the archive, 64 MiB in all: with the
# repository at ~58 MiB the whole bundle (~20 MB) does not fit, so name the targets a call needs
# (m3serve alone is ~4.7 MB, about what one call has room for). The script prints the archive's
# size against what is left.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build-cuda}
DEST=.device/cuda
ALL_BINS=(cuda_ops_test cuda_composite_ops_test kv_dtype_ops_test kv_quant_cache_test
      kv_quant_decode_test cuda_real_model_kv_quant_test quant_gemv_test quant_gemv_mma_test sparse_decode_test dense_decode_test cuda_model_test
      cuda_decode_bench cuda_decode_step_bench
      prefill_gemm_test prefill_attention_test cuda_prefill_bench cuda_golden_test
      cuda_model_decode_bench cuda_sync_bench
      sampling_test sampling_bench cuda_real_model_test moe_route_test attention_inputs_test embed_bf16_test
      fp8_mma_probe stream_pattern_probe nccl_communicator_test cuda_tensor_parallel_test
      cuda_dp_attention_test
      one_shot_all_reduce_test cuda_tp_bench dspark_f32_test
      dspark_real_test cuda_dspark_bench cuda_vision_tower_test cuda_vision_ttft_bench)
WANT_M3SERVE=yes TRACE=yes
BINS=("${ALL_BINS[@]}")
if [ $# -gt 0 ]; then
  BINS=() WANT_M3SERVE=no TRACE=no
  for t in "$@"; do
    case "$t" in
      m3serve) WANT_M3SERVE=yes ;;
      m3_cuda_trace) TRACE=yes ;;
      *) [[ " ${ALL_BINS[*]} " == *" $t "* ]] || { echo "bundle.sh: unknown target $t" >&2; exit 2; }
         BINS+=("$t") ;;
    esac
  done
fi
cmake -S . -B "$BUILD" -G Ninja -DM3_CUDA=ON >/dev/null
TARGETS=("${BINS[@]}")
[ "$TRACE" = yes ] && TARGETS+=(m3_cuda_trace)
[ ${#TARGETS[@]} -gt 0 ] && cmake --build "$BUILD" -j "${JOBS:-2}" --target "${TARGETS[@]}"
# m3serve links every layer; others' work in progress may not compile: then bundle without it.
M3SERVE=no
if [ "$WANT_M3SERVE" = yes ]; then
  M3SERVE=yes
  cmake --build "$BUILD" -j "${JOBS:-2}" --target m3serve >/tmp/m3serve-build.$$.log 2>&1 || M3SERVE=no
fi
rm -rf "$DEST"
mkdir -p "$DEST"
for b in "${BINS[@]}"; do
  # Host symbols and debug info are dropped (size); the device code and its line info stay in
  # the fat binary.
  strip --strip-all -o "$DEST/$b" "$BUILD/cuda-tests/$b"
done
if [ "$M3SERVE" = yes ]; then
  strip --strip-all -o "$DEST/m3serve" "$BUILD/bin/m3serve"
elif [ "$WANT_M3SERVE" = yes ]; then
  echo "m3serve did not build (see /tmp/m3serve-build.$$.log); bundling without it"
fi
# Shared libraries the GPU machine lacks. It has (Ubuntu 24.04) glibc, libstdc++, CUDA and NCCL
# (its own NCCL is the one to use), and the TLS, compression, Kerberos and curl families
# (libcurl.so.4 there is newer, the same ABI); everything else goes along.
for b in "$DEST"/*; do
  ldd "$b" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libpthread*|libdl*|librt*|libcublas*|libcudart*|libcuda.so*|libnccl*) ;;
      libssl*|libcrypto*|libz.so*|libzstd*|libgnutls*|libnettle*|libhogweed*|libgmp*|libtasn1*|libp11-kit*|libffi*) ;;
      libgssapi_krb5*|libkrb5*|libk5crypto*|libcom_err*|libkeyutils*|libresolv*) ;;
      libcurl*|libunistring*|libidn2*|libpsl*|libnghttp2*|libssh2*|librtmp*|libldap*|liblber*|libsasl2*|libbrotli*|libpcre2-8*) ;;
      *) [ -f "$DEST/$(basename "$lib")" ] || { strip --strip-all -o "$DEST/$(basename "$lib")" "$lib" &&
           echo "bundled $(basename "$lib") (needed by $(basename "$b"))"; } ;;
    esac
  done
done
# The kernel tracer (tools/device/trace-decode.sh) and the CUPTI it was linked against (the GPU
# machine may have none, or another version); after the loop above, which would only find it too.
if [ "$TRACE" = yes ]; then
  objcopy --strip-debug "$BUILD/lib/libm3_cuda_trace.so" "$DEST/libm3_cuda_trace.so"
  CUPTI=$(sed -n 's/^CUDA_cupti_LIBRARY:FILEPATH=//p' "$BUILD/CMakeCache.txt")
  cp -L "$(dirname "$CUPTI")/libcupti.so.13" "$DEST/"
fi
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src/backend/cuda tests/backend_cuda tools/bench tools/trace tools/device/bundle.sh tools/device/run-all.sh || echo '-dirty')"
  echo "built $(date -u +%FT%TZ) on $(hostname) with $(/usr/local/cuda/bin/nvcc --version | tail -1)"
  echo "m3serve bundled: $M3SERVE"
} >"$DEST/BUILD_INFO"
# Compressed for the carry (xz -9e: about a quarter of the stripped size); bundle-env.sh unpacks.
tar -C "$(dirname "$DEST")" -cf - "$(basename "$DEST")" | xz -9e -T2 >"$DEST.tar.xz"
du -sh "$DEST" "$DEST.tar.xz"
cat "$DEST/BUILD_INFO"
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
archive=$(stat -c %s "$DEST.tar.xz")
left=$(( 64 * 1024 * 1024 - tree - archive ))
echo "carry: tracked files $(( tree / 1048576 )) MiB + archive $(( archive / 1048576 )) MiB of 64 MiB" \
  "($(( left / 1048576 )) MiB left)"
[ "$left" -gt 65536 ] || echo "bundle.sh: too large for one device call; name fewer targets" >&2
