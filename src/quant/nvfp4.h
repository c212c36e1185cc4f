// NVFP4 weights (M3.1-Flash routed experts; ModelOpt re-quantisations).
//
// Packed codes: U8 [..., in/2]; element 2k is the LOW nibble of byte k, element 2k+1 the HIGH
// nibble; each nibble is an E2M1 code (bit 3 sign, {0,0.5,1,1.5,2,3,4,6}).
// Block scales: F8_E4M3 [..., in/16], one per 16 consecutive inputs of a row.
// One float32 global scale per tensor, with two opposite conventions:
//   compressed-tensors (`weight_packed`, `weight_scale`, `weight_global_scale`): the global scale
//     DIVIDES:     w = e2m1(code) * (e4m3(scale) / weight_global_scale)
//   NVIDIA ModelOpt (`weight`, `weight_scale`, `weight_scale_2`; `input_scale` ignored): it
//     MULTIPLIES:  w = e2m1(code) * (e4m3(scale) * weight_scale_2)
// The bracketed per-block factor is computed first in float32, then multiplied by the element
// (this fixes the rounding so every implementation can be bit-exact against this reference).
// See docs/formats/quant-formats.md.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace m3 {

inline constexpr int64_t kNvfp4BlockSize = 16;

enum class Nvfp4GlobalScale {
  kDivide,    // compressed-tensors `weight_global_scale`
  kMultiply,  // ModelOpt `weight_scale_2`
};

// E2M1 code of element k in a packed row (low nibble first).
inline uint8_t nvfp4_code_at(const uint8_t* packed_row, int64_t k) {
  const uint8_t byte = packed_row[k >> 1];
  return (k & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xF);
}

// The float32 factor applied to every element of one block.
float nvfp4_block_factor(uint8_t scale_e4m3, float global_scale, Nvfp4GlobalScale kind);

// Dequantises `rows` x `cols` (logical) elements from `rows` x `cols/2` packed bytes and
// `rows` x `cols/16` E4M3 scales into `out`. `cols` must be a positive multiple of 16.
Status dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, float global_scale,
                        Nvfp4GlobalScale kind, int64_t rows, int64_t cols, float* out);

struct Nvfp4Tensor {
  int64_t rows = 0;
  int64_t cols = 0;  // logical columns
  std::vector<uint8_t> packed;  // rows * cols/2
  std::vector<uint8_t> scales;  // rows * cols/16, F8_E4M3
  float global_scale = 1.0f;    // stored value under `kind`'s convention
  Nvfp4GlobalScale kind = Nvfp4GlobalScale::kDivide;
};

// Reference quantiser (the usual NVFP4 recipe). With A = max|x| over the tensor:
//   kDivide:   global_scale = 448*6 / A        (stored; divides)
//   kMultiply: global_scale = A / (448*6)      (stored; multiplies)
// (A == 0 stores 1.) Per block: scale = e4m3(block_amax / 6 expressed in the global unit), codes
// = e2m1 round-to-nearest-even of x / nvfp4_block_factor(scale) (0 where the factor is 0),
// saturating at 6. Non-finite input is an invalid_argument error naming the element.
Result<Nvfp4Tensor> quantize_nvfp4(const float* x, int64_t rows, int64_t cols,
                                   Nvfp4GlobalScale kind);

// The global scale the recipe above stores for a tensor whose max|x| is `amax`.
float nvfp4_global_scale_for_amax(float amax, Nvfp4GlobalScale kind);

// The same per-block recipe under a given global scale (stored value, `kind`'s convention; finite
// and positive). Blocks then depend only on their own 16 values, so any row / 16-aligned column
// window of a tensor quantises to the same window of the whole tensor's codes and scales (the
// dummy weights generate a rank's slice this way). Values above the range the global scale
// allows saturate at 6 x the largest block scale.
Result<Nvfp4Tensor> quantize_nvfp4_with_global_scale(const float* x, int64_t rows, int64_t cols,
                                                     Nvfp4GlobalScale kind, float global_scale);

}  // namespace m3
