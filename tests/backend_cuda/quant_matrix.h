// A random quantised weight matrix (MXFP8 / NVFP4 / BF16) with its reference-dequantised float
// copy, for the GEMV tests. Included inside namespace m3::cuda_test (after cuda_test_util.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/gemm/quant_gemv.h"
#include "cuda_test_util.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace m3::cuda_test {

using cuda::QuantFormat;

// One quantised matrix [n, k] with its dequantised float copy.
struct QMatrix {
  std::vector<uint8_t> data, scale;
  float global = 1.0f;  // NVFP4 multiplier (1 / weight_global_scale)
  std::vector<float> deq;
};

// spread > 0: every 16-element block is multiplied by 2^-j, j uniform in [0, spread], so block
// scales range over many binades (E4M3 subnormal scales, f16 subnormal products).
inline QMatrix make_matrix(QuantFormat f, int64_t n, int64_t k, uint32_t seed, int spread = 0) {
  auto w = randn(n * k, seed, 0.02f);
  if (spread > 0) {
    std::mt19937 rng(seed ^ 0x5bd1e995u);
    std::uniform_int_distribution<int> d(0, spread);
    for (size_t b = 0; b < w.size(); b += 16) {
      const float s = std::ldexp(1.0f, -d(rng));
      for (size_t i = b; i < std::min(w.size(), b + 16); ++i) w[i] *= s;
    }
  }
  QMatrix m;
  m.deq.resize(w.size());
  if (f == QuantFormat::kBf16) {
    m.data.resize(w.size() * 2);
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t b = f32_to_bf16(w[i]);
      std::memcpy(m.data.data() + 2 * i, &b, 2);
      m.deq[i] = bf16_to_f32(b);
    }
    m.scale.assign(16, 0);  // unused
  } else if (f == QuantFormat::kMxfp8) {
    auto q = quantize_mxfp8(w.data(), n, k);
    EXPECT_TRUE(q.is_ok());
    m.data = q->codes;
    m.scale = q->scales;
    EXPECT_TRUE(dequantize_mxfp8(m.data.data(), m.scale.data(), n, k, m.deq.data()).is_ok());
  } else {
    auto q = quantize_nvfp4(w.data(), n, k, Nvfp4GlobalScale::kDivide);
    EXPECT_TRUE(q.is_ok());
    m.data = q->packed;
    m.scale = q->scales;
    m.global = 1.0f / q->global_scale;
    EXPECT_TRUE(dequantize_nvfp4(m.data.data(), m.scale.data(), q->global_scale,
                                 Nvfp4GlobalScale::kDivide, n, k, m.deq.data())
                    .is_ok());
  }
  return m;
}

}  // namespace m3::cuda_test
