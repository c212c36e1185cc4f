// MXFP8 weights (MiniMax-M3-MXFP8 and the M3.1-Flash attention/dense/shared-expert linears).
//
// Layout (row-major, blocks along the last = input dimension):
//   X.weight            F8_E4M3 [..., in]      element codes
//   X.weight_scale_inv  U8      [..., in/32]   one E8M0 exponent per 32 consecutive inputs
//   w[r, k] = e4m3(weight[r, k]) * 2^(scale_inv[r, k/32] - 127)
// Despite its DeepSeek-inherited name, the scale MULTIPLIES. The product is exact in float32
// (a 4-bit significand times a power of two that stays inside f32 range).
// See docs/formats/quant-formats.md.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace m3 {

inline constexpr int64_t kMxfp8BlockSize = 32;

// Dequantises `rows` x `cols` codes with `rows` x `cols/32` scales into `out` (rows*cols floats).
// `cols` must be a positive multiple of 32 (invalid_argument otherwise). Pointers need no alignment.
Status dequantize_mxfp8(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                        float* out);

struct Mxfp8Tensor {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> codes;   // rows * cols, F8_E4M3
  std::vector<uint8_t> scales;  // rows * cols/32, E8M0
};

// Reference quantiser. Per block: the smallest power of two 2^e with amax <= 448 * 2^e (so no
// element saturates), e clamped to the E8M0 range [-127, 127]; an all-zero block gets e = 0.
// Elements are rounded to nearest-even E4M3 after division by 2^e (exact). Non-finite input is an
// invalid_argument error naming the element.
Result<Mxfp8Tensor> quantize_mxfp8(const float* x, int64_t rows, int64_t cols);

}  // namespace m3
