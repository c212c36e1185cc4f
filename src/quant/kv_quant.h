// Storage formats of the paged KV cache (--kv-cache-dtype), and the exact conversions between
// them and float32. docs/kv-cache-dtype.md states the formats and their error model.
//
// A KV tensor of one layer (K, V or the index keys) is [P, S, heads, D]: pages of S tokens, each
// token a row of D elements per head. A "page-head" is the S rows of one head in one page.
//   float32   4 bytes per element (the CPU reference's `auto`).
//   bf16      2 bytes, round-to-nearest-even.
//   fp8_e4m3  1 byte: an E4M3 code per element, and one float32 scale per page-head:
//             x = e4m3(code) * scale.
//   fp4_e2m1  NVFP4: an E2M1 code per element (two per byte, the low nibble first), an E4M3 scale
//             per 16 consecutive elements of a row, and one float32 scale per page-head:
//             x = e2m1(code) * (e4m3(block_scale) * scale).
//
// The page-head scale is a power of two, the smallest with amax <= R * scale (R = 448 for fp8,
// 448 * 6 for fp4) over the rows written so far. Tokens are appended to a page one row at a time
// (row 0 starts the page afresh). A row whose amax needs a larger scale raises it by 2^k and
// re-encodes the rows already there: dividing an E4M3 code (fp8) or an E4M3 block scale (fp4) by
// 2^k is exact unless the result falls below E4M3's smallest normal 2^-6, so earlier rows change
// only where they are below 2^-6 of the new range (error in docs/kv-cache-dtype.md). Since the scale
// is a power of two, dequantisation is exact in float32, and FP4 dequantised to BF16 is exact too
// (a 2-bit by 4-bit significand product times a power of two).
//
// Everything here is header-only and M3_HOST_DEVICE so that CUDA kernels use the same definitions
// as the CPU reference.
#pragma once

#include <stdint.h>
#include <string.h>

#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"

namespace m3 {

enum class KvCacheDtype : uint8_t { kFloat32, kBF16, kFp8E4M3, kFp4E2M1 };

inline constexpr int64_t kKvFp4BlockSize = 16;

// "float32", "bf16", "fp8_e4m3", "fp4_e2m1" (SGLang's spelling of the flag's values).
const char* kv_cache_dtype_name(KvCacheDtype d);
// The names above, "auto" excluded (the caller resolves it); invalid_argument naming `s`.
Result<KvCacheDtype> parse_kv_cache_dtype(std::string_view s);

// Storage of one KV tensor of one layer in a quantised dtype (unused for float32).
struct KvQuantStore {
  uint8_t* codes = nullptr;         // [P, S, heads, kv_row_code_bytes(D)]
  uint8_t* block_scales = nullptr;  // fp4: [P, S, heads, D / 16] E4M3
  float* page_scales = nullptr;     // fp8, fp4: [P, heads]; 0 until a non-zero row is written
};

M3_HOST_DEVICE inline int64_t kv_row_code_bytes(KvCacheDtype d, int64_t dim) {
  switch (d) {
    case KvCacheDtype::kFloat32: return 4 * dim;
    case KvCacheDtype::kBF16: return 2 * dim;
    case KvCacheDtype::kFp8E4M3: return dim;
    case KvCacheDtype::kFp4E2M1: return dim / 2;
  }
  return 0;
}

M3_HOST_DEVICE inline int64_t kv_row_block_scale_bytes(KvCacheDtype d, int64_t dim) {
  return d == KvCacheDtype::kFp4E2M1 ? dim / kKvFp4BlockSize : 0;
}

M3_HOST_DEVICE inline bool kv_has_page_scale(KvCacheDtype d) {
  return d == KvCacheDtype::kFp8E4M3 || d == KvCacheDtype::kFp4E2M1;
}

// Storage bytes per element with the page-head scale spread over its S x D elements: exact in a
// double (every term is a multiple of a power of two).
double kv_bytes_per_element(KvCacheDtype d, int64_t page_size, int64_t dim);

// The largest |x| / scale a page-head scale allows: 448 (fp8), 448 * 6 (fp4).
M3_HOST_DEVICE inline float kv_scale_range(KvCacheDtype d) {
  return d == KvCacheDtype::kFp4E2M1 ? kE4M3Max * kE2M1Max : kE4M3Max;
}

// The smallest power of two s with amax <= kv_scale_range(d) * s (0 for amax == 0), at least 2^-100
// so that s and every code times s stay normal floats.
M3_HOST_DEVICE inline float kv_page_scale_for_amax(KvCacheDtype d, float amax) {
  if (!(amax > 0.0f)) return 0.0f;
  const float range = kv_scale_range(d);
  // A power of two at or below amax / range (the exponent bits of the quotient), then exact
  // comparisons: range * s is exact for a power of two s.
  float s = bits_to_f32(f32_to_bits(amax / range) & 0x7F800000u);
  const float lo = bits_to_f32(uint32_t(127 - 100) << 23);  // 2^-100
  if (s < lo) s = lo;
  while (amax > range * s) s *= 2.0f;
  while (s > lo && amax <= range * (s * 0.5f)) s *= 0.5f;
  return s;
}

M3_HOST_DEVICE inline float kv_abs_max(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = x[i] < 0.0f ? -x[i] : x[i];
    if (a > m) m = a;
  }
  return m;
}

// One row of `dim` elements into its codes (and fp4 block scales) under page-head scale `scale`
// (fp8 / fp4; ignored otherwise). fp4: block scale = e4m3(block amax / 6 / scale), codes =
// e2m1(x / (e4m3(block scale) * scale)), round-to-nearest-even and saturating, 0 where the factor
// is 0. Non-finite input saturates (fp8, fp4) or passes through (bf16); the model never writes any.
M3_HOST_DEVICE inline void kv_encode_row(KvCacheDtype d, const float* x, int64_t dim, float scale,
                                         uint8_t* codes, uint8_t* block_scales) {
  switch (d) {
    case KvCacheDtype::kFloat32:
      memcpy(codes, x, size_t(4 * dim));
      return;
    case KvCacheDtype::kBF16:
      for (int64_t i = 0; i < dim; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        memcpy(codes + 2 * i, &h, 2);
      }
      return;
    case KvCacheDtype::kFp8E4M3:
      for (int64_t i = 0; i < dim; ++i) codes[i] = scale > 0.0f ? f32_to_e4m3(x[i] / scale) : 0;
      return;
    case KvCacheDtype::kFp4E2M1:
      for (int64_t b = 0; b < dim / kKvFp4BlockSize; ++b) {
        const float* xb = x + b * kKvFp4BlockSize;
        const float bmax = kv_abs_max(xb, kKvFp4BlockSize);
        const uint8_t bs = scale > 0.0f ? f32_to_e4m3(bmax / kE2M1Max / scale) : uint8_t(0);
        block_scales[b] = bs;
        const float factor = e4m3_to_f32(bs) * scale;
        for (int64_t i = 0; i < kKvFp4BlockSize; i += 2) {
          const uint8_t lo = factor > 0.0f ? uint8_t(f32_to_e2m1(xb[i] / factor) & 0xF) : 0;
          const uint8_t hi = factor > 0.0f ? uint8_t(f32_to_e2m1(xb[i + 1] / factor) & 0xF) : 0;
          codes[(b * kKvFp4BlockSize + i) / 2] = uint8_t(lo | (hi << 4));
        }
      }
      return;
  }
}

// The float32 values of one stored row (exact: see the header comment).
M3_HOST_DEVICE inline void kv_decode_row(KvCacheDtype d, const uint8_t* codes,
                                         const uint8_t* block_scales, float scale, int64_t dim,
                                         float* out) {
  switch (d) {
    case KvCacheDtype::kFloat32:
      memcpy(out, codes, size_t(4 * dim));
      return;
    case KvCacheDtype::kBF16:
      for (int64_t i = 0; i < dim; ++i) {
        uint16_t h;
        memcpy(&h, codes + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      return;
    case KvCacheDtype::kFp8E4M3:
      for (int64_t i = 0; i < dim; ++i) out[i] = e4m3_to_f32(codes[i]) * scale;
      return;
    case KvCacheDtype::kFp4E2M1:
      for (int64_t b = 0; b < dim / kKvFp4BlockSize; ++b) {
        const float factor = e4m3_to_f32(block_scales[b]) * scale;
        for (int64_t i = 0; i < kKvFp4BlockSize; ++i) {
          const int64_t k = b * kKvFp4BlockSize + i;
          const uint8_t byte = codes[k / 2];
          out[k] = e2m1_to_f32((k & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xF)) * factor;
        }
      }
      return;
  }
}

// Re-expresses a stored row under a page-head scale `ratio` = 2^k times larger (k >= 1): fp8 codes
// and fp4 block scales are divided by 2^k (exact above E4M3's smallest normal, round-to-nearest-even
// below); fp4 element codes are unchanged.
M3_HOST_DEVICE inline void kv_rescale_row(KvCacheDtype d, int64_t dim, float ratio, uint8_t* codes,
                                          uint8_t* block_scales) {
  if (d == KvCacheDtype::kFp8E4M3) {
    for (int64_t i = 0; i < dim; ++i) codes[i] = f32_to_e4m3(e4m3_to_f32(codes[i]) / ratio);
  } else if (d == KvCacheDtype::kFp4E2M1) {
    for (int64_t b = 0; b < dim / kKvFp4BlockSize; ++b)
      block_scales[b] = f32_to_e4m3(e4m3_to_f32(block_scales[b]) / ratio);
  }
}

// The rows of one page-head: row r's codes at codes + r * code_stride (and its fp4 block scales
// at block_scales + r * block_scale_stride), the page-head's scale at *scale.
struct KvPageHead {
  uint8_t* codes = nullptr;
  int64_t code_stride = 0;
  uint8_t* block_scales = nullptr;
  int64_t block_scale_stride = 0;
  float* scale = nullptr;  // null for float32 / bf16
};

// Page-head `head` of page `page` in a [P, S, heads, dim] tensor stored as `d`.
M3_HOST_DEVICE inline KvPageHead kv_page_head(KvCacheDtype d, const KvQuantStore& st,
                                              int64_t page, int64_t page_size, int64_t heads,
                                              int64_t head, int64_t dim) {
  KvPageHead ph;
  const int64_t rb = kv_row_code_bytes(d, dim), sb = kv_row_block_scale_bytes(d, dim);
  ph.codes = st.codes + (page * page_size * heads + head) * rb;
  ph.code_stride = heads * rb;
  if (sb > 0) {
    ph.block_scales = st.block_scales + (page * page_size * heads + head) * sb;
    ph.block_scale_stride = heads * sb;
  }
  if (kv_has_page_scale(d)) ph.scale = st.page_scales + page * heads + head;
  return ph;
}

// Element i of row r of page-head (page, head) in a [P, S, heads, dim] store of a quantised dtype,
// as float32: the same value kv_decode_row gives (the same products in the same order), one
// element at a time for kernels whose threads each read a few elements of a row.
M3_HOST_DEVICE inline float kv_load_element(KvCacheDtype d, const KvQuantStore& st, int64_t page,
                                            int64_t page_size, int64_t heads, int64_t head,
                                            int64_t dim, int64_t r, int64_t i) {
  const int64_t row = (page * page_size + r) * heads + head;
  switch (d) {
    case KvCacheDtype::kFloat32: {
      float f;
      memcpy(&f, st.codes + row * 4 * dim + 4 * i, 4);
      return f;
    }
    case KvCacheDtype::kBF16: {
      uint16_t h;
      memcpy(&h, st.codes + row * 2 * dim + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case KvCacheDtype::kFp8E4M3:
      return e4m3_to_f32(st.codes[row * dim + i]) * st.page_scales[page * heads + head];
    case KvCacheDtype::kFp4E2M1: {
      const float factor = e4m3_to_f32(st.block_scales[row * (dim / kKvFp4BlockSize) +
                                                       i / kKvFp4BlockSize]) *
                           st.page_scales[page * heads + head];
      const uint8_t byte = st.codes[row * (dim / 2) + i / 2];
      return e2m1_to_f32((i & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xF)) * factor;
    }
  }
  return 0.0f;
}

// Writes token row `row` of a page-head. Row 0 starts the page (its scale is reset: whatever the
// page held belonged to an earlier owner); a later row keeps rows [0, row) and, when its amax
// needs a larger scale, raises the scale and re-encodes them first (kv_rescale_row). Rows of a
// page-head must be written by one thread at a time, in increasing order after row 0 (rewriting
// row r invalidates rows > r, as a rolled-back speculative step or a recomputation does).
M3_HOST_DEVICE inline void kv_append_row(KvCacheDtype d, const KvPageHead& ph, int64_t row,
                                         const float* x, int64_t dim) {
  uint8_t* codes = ph.codes + row * ph.code_stride;
  uint8_t* bs = ph.block_scales == nullptr ? nullptr : ph.block_scales + row * ph.block_scale_stride;
  if (!kv_has_page_scale(d)) {
    kv_encode_row(d, x, dim, 0.0f, codes, bs);
    return;
  }
  float s = row == 0 ? 0.0f : *ph.scale;
  const float need = kv_page_scale_for_amax(d, kv_abs_max(x, dim));
  if (need > s) {
    if (s > 0.0f) {
      for (int64_t r = 0; r < row; ++r)
        kv_rescale_row(d, dim, need / s, ph.codes + r * ph.code_stride,
                       ph.block_scales == nullptr ? nullptr
                                                  : ph.block_scales + r * ph.block_scale_stride);
    }
    s = need;
  }
  *ph.scale = s;
  kv_encode_row(d, x, dim, s, codes, bs);
}

// Row `row` of a page-head as float32.
M3_HOST_DEVICE inline void kv_read_row(KvCacheDtype d, const KvPageHead& ph, int64_t row,
                                       int64_t dim, float* out) {
  kv_decode_row(d, ph.codes + row * ph.code_stride,
                ph.block_scales == nullptr ? nullptr : ph.block_scales + row * ph.block_scale_stride,
                ph.scale == nullptr ? 0.0f : *ph.scale, dim, out);
}

}  // namespace m3
