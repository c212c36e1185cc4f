// Dequantising loads from a quantised paged KV cache (KvCacheView with dtype fp8_e4m3 or
// fp4_e2m1; quant/kv_quant.h holds the formats) for the attention and indexer kernels: 8
// consecutive elements of a row as 8 bf16 in a uint4, the same bits a bf16 cache would hold there
// for the kernels' shared-memory tiles.
//
// Exact: an fp8 element is e4m3 · 2^k (4 significant bits) and an fp4 element e2m1 · e4m3 · 2^k
// (2 · 4 = at most 6 significant bits), with the page-head scale 2^k in [2^-100, 2^127], so the
// float32 products have no rounding and bf16's 8-bit significand holds them: the bf16 value is
// kv_decode_row's float32 value. A kernel that reads a quantised cache through these loads
// therefore computes exactly what it computes on a bf16 cache filled with the dequantised values
// (launch_kv_dequantise_pages), which is how the tests check it. CUDA translation units only.
//
// Two forms: kv_load8_bf16 (the dtype at run time), and kv_fetch8 / kv_dequant8_bf16 (the dtype a
// template argument) for kernels that issue all of a thread's fetches before the first
// dequantisation, so that the loads are in flight together as their bf16 loads are.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention/sparse_decode.h"
#include "core/dtype.h"
#include "quant/kv_quant.h"

namespace m3::cuda {

// The page-head scale of (page, head) in a store of `heads` heads.
__device__ __forceinline__ float kv_page_scale(const KvQuantStore& st, int64_t page, int64_t heads,
                                               int64_t head) {
  return st.page_scales[page * heads + head];
}

// Two exact float32 values as a bf16 pair (low half = first): their low 16 bits are zero.
__device__ __forceinline__ uint32_t kv_pack_bf16x2(float lo, float hi) {
  return (__float_as_uint(hi) & 0xFFFF0000u) | (__float_as_uint(lo) >> 16);
}

// The stored bytes of 8 consecutive elements of a row: fp8 the 8 codes (w.x, w.y); fp4 the 8
// nibbles (w.x) and the E4M3 scale of their 16-element block (bs).
struct KvRaw8 {
  uint2 w;
  uint32_t bs;
};

// Elements e .. e + 7 (e a multiple of 8) of the row with flat index `row` = (page · S + s) ·
// heads + head of a [P, S, heads, dim] store in dtype D (fp8_e4m3 or fp4_e2m1). fp8 reads 8
// bytes (8-byte aligned), fp4 4 bytes and one block scale.
template <KvCacheDtype D>
__device__ __forceinline__ KvRaw8 kv_fetch8(const KvQuantStore& st, int64_t row, int64_t dim,
                                            int64_t e) {
  static_assert(D == KvCacheDtype::kFp8E4M3 || D == KvCacheDtype::kFp4E2M1, "a quantised dtype");
  KvRaw8 r{};
  if constexpr (D == KvCacheDtype::kFp8E4M3) {
    r.w = __ldg(reinterpret_cast<const uint2*>(st.codes + row * dim + e));
  } else {
    r.w.x = __ldg(reinterpret_cast<const uint32_t*>(st.codes + row * (dim / 2) + e / 2));
    r.bs = __ldg(st.block_scales + row * (dim / kKvFp4BlockSize) + e / kKvFp4BlockSize);
  }
  return r;
}

// Two E4M3 codes (the low byte first) as floats, exactly (the hardware conversion to f16x2).
__device__ __forceinline__ __half2 kv_e4m3x2_to_half2(uint32_t two) {
  return __half2(
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu), __NV_E4M3));
}

// E2M1 nibbles (s, e1 e0, m), one in the low half of each byte, as the E4M3 bytes (s, 0 0 e1 e0,
// m 0 0): that E4M3 value is the E2M1 value times 2^-6, subnormals (e = 0) included, so the fp8
// hardware conversion decodes fp4 too.
__device__ __forceinline__ uint32_t kv_e2m1_nibbles_as_e4m3(uint32_t x) {
  return ((x & 0x08080808u) << 4) | ((x & 0x07070707u) << 2);
}

// The 8 elements of `r` (fetched from a store of dtype D) under page-head scale `scale`
// (kv_page_scale) as 8 bf16: kv_decode_row's products (fp8: e4m3 · scale; fp4: e2m1 · (e4m3 ·
// scale)), exact, so any evaluation order gives the same bits.
template <KvCacheDtype D>
__device__ __forceinline__ uint4 kv_dequant8_bf16(const KvRaw8& r, float scale) {
  uint32_t words[2];  // 4 E4M3 codes each, element order
  float factor;
  __half2 mul;  // exact in f16: 1 (fp8), 2^6 (fp4: back from the E4M3 encoding to E2M1 values)
  if constexpr (D == KvCacheDtype::kFp8E4M3) {
    words[0] = r.w.x, words[1] = r.w.y;
    factor = scale;
    mul = __float2half2_rn(1.0f);
  } else {
    // Byte j of w holds elements 2j (low nibble) and 2j + 1: one nibble per byte, in order.
    const uint32_t lo = r.w.x & 0x0F0F0F0Fu, hi = (r.w.x >> 4) & 0x0F0F0F0Fu;
    words[0] = kv_e2m1_nibbles_as_e4m3(__byte_perm(lo, hi, 0x5140));
    words[1] = kv_e2m1_nibbles_as_e4m3(__byte_perm(lo, hi, 0x7362));
    factor = __half2float(__half(
                 __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(r.bs), __NV_E4M3))) *
             scale;
    mul = __float2half2_rn(64.0f);
  }
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      __half2 h = kv_e4m3x2_to_half2(words[i] >> (16 * j));
      if constexpr (D == KvCacheDtype::kFp4E2M1) h = __hmul2(h, mul);
      const float2 v = __half22float2(h);
      out[2 * i + j] = kv_pack_bf16x2(v.x * factor, v.y * factor);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Elements e .. e + 7 (e a multiple of 8) of flat row `row` of a [P, S, heads, dim] store in
// dtype d (fp8_e4m3 or fp4_e2m1), under the page-head scale `scale` (kv_page_scale).
__device__ __forceinline__ uint4 kv_load8_bf16(KvCacheDtype d, const KvQuantStore& st, int64_t row,
                                               int64_t dim, int64_t e, float scale) {
  if (d == KvCacheDtype::kFp8E4M3)
    return kv_dequant8_bf16<KvCacheDtype::kFp8E4M3>(
        kv_fetch8<KvCacheDtype::kFp8E4M3>(st, row, dim, e), scale);
  return kv_dequant8_bf16<KvCacheDtype::kFp4E2M1>(
      kv_fetch8<KvCacheDtype::kFp4E2M1>(st, row, dim, e), scale);
}

// Why the kernels cannot read a quantised view through these loads (nullptr: they can): the
// dtype must be fp8_e4m3 or fp4_e2m1 and each store read (K and V where `kv`, the index keys
// where `index_keys`) needs codes (8-byte aligned: fp8 fetches 8 bytes), page scales and, for
// fp4, block scales.
inline const char* kv_quant_view_problem(const KvCacheView& c, bool kv, bool index_keys) {
  if (c.dtype != KvCacheDtype::kFp8E4M3 && c.dtype != KvCacheDtype::kFp4E2M1)
    return "a quantised cache must be fp8_e4m3 or fp4_e2m1";
  const bool fp4 = c.dtype == KvCacheDtype::kFp4E2M1;
  const auto bad = [fp4](const KvQuantStore& st) {
    return st.codes == nullptr || (reinterpret_cast<uintptr_t>(st.codes) & 7) != 0 ||
           st.page_scales == nullptr || (fp4 && st.block_scales == nullptr);
  };
  if (kv && (bad(c.kq) || bad(c.vq)))
    return "the quantised K and V need codes (8-byte aligned), page scales and, for fp4, block "
           "scales";
  if (index_keys && bad(c.iq))
    return "the quantised index keys need codes (8-byte aligned), page scales and, for fp4, "
           "block scales";
  return nullptr;
}

}  // namespace m3::cuda
