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

// The gate|up [2·inter, hidden] and down [hidden, inter] matrices of `experts` experts, and their
// codes, scales and globals concatenated over the experts as the grouped GEMV reads them.
struct ExpertSet {
  std::vector<QMatrix> up, down;
  std::vector<uint8_t> up_w, up_s, down_w, down_s;
  std::vector<float> up_g, down_g;
};
inline ExpertSet make_experts(QuantFormat f, int64_t experts, int64_t inter, int64_t hidden,
                              uint32_t seed_up, uint32_t seed_down) {
  ExpertSet x;
  for (int64_t e = 0; e < experts; ++e) {
    x.up.push_back(make_matrix(f, 2 * inter, hidden, seed_up + uint32_t(e)));
    x.down.push_back(make_matrix(f, hidden, inter, seed_down + uint32_t(e)));
    const QMatrix &u = x.up.back(), &d = x.down.back();
    x.up_w.insert(x.up_w.end(), u.data.begin(), u.data.end());
    x.up_s.insert(x.up_s.end(), u.scale.begin(), u.scale.end());
    x.down_w.insert(x.down_w.end(), d.data.begin(), d.data.end());
    x.down_s.insert(x.down_s.end(), d.scale.begin(), d.scale.end());
    x.up_g.push_back(u.global);
    x.down_g.push_back(d.global);
  }
  return x;
}

// CPU gate|up + SwiGLU-OAI (alpha 1.702, limit 7) of one routed row x [hidden] through w, with
// the bound of a GPU result stored as bf16: the GEMV's summation bound sum_factor·Σ|x||w| on gate
// and up, propagated through SwiGLU's derivative (see cuda_composite_ops_test.cpp), plus the
// bf16 rounding (unit roundoff 2^-8). want, bound: [inter].
inline void swiglu_row_reference(const float* x, const QMatrix& w, int64_t inter, int64_t hidden,
                                 double sum_factor, float* want, double* bound) {
  std::vector<float> gu(2 * inter), mg(2 * inter);
  const auto ax = abs_of(std::vector<float>(x, x + hidden)), aw = abs_of(w.deq);
  cpu()->linear({x, w.deq.data(), gu.data(), 1, 2 * inter, hidden, false});
  cpu()->linear({ax.data(), aw.data(), mg.data(), 1, 2 * inter, hidden, false});
  cpu()->swiglu_oai({gu.data(), want, 1, inter, 1.702f, 7.0f});
  for (int64_t i = 0; i < inter; ++i) {
    const double gc = std::min<double>(gu[i], 7.0);
    const double uc = std::clamp<double>(gu[inter + i], -7.0, 7.0);
    const double da = std::abs(uc + 1) * (1 + 1.702 * std::abs(gc) / 4) * sum_factor * mg[i] +
                      std::abs(gc) * sum_factor * mg[inter + i] + 32 * kU * std::abs(want[i]);
    bound[i] = 2 * da + std::ldexp(std::abs(want[i]) + da, -8) + 1e-30;
  }
}

// CPU down product of routed rows act [rows, inter], row r through expert ids[r]'s down matrix,
// with the bound sum_factor·Σ|a||w| per output. want, bound: [rows, hidden].
inline void down_rows_reference(const std::vector<float>& act, const std::vector<int32_t>& ids,
                                const ExpertSet& ex, int64_t inter, int64_t hidden,
                                double sum_factor, std::vector<float>* want,
                                std::vector<double>* bound) {
  const int64_t rows = static_cast<int64_t>(ids.size());
  want->assign(rows * hidden, 0.0f);
  bound->assign(rows * hidden, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const QMatrix& w = ex.down[ids[r]];
    const float* ar = act.data() + r * inter;
    const auto aa = abs_of(std::vector<float>(ar, ar + inter)), aw = abs_of(w.deq);
    std::vector<float> mg(hidden);
    cpu()->linear({ar, w.deq.data(), want->data() + r * hidden, 1, hidden, inter, false});
    cpu()->linear({aa.data(), aw.data(), mg.data(), 1, hidden, inter, false});
    for (int64_t j = 0; j < hidden; ++j) (*bound)[r * hidden + j] = sum_factor * mg[j] + 1e-30;
  }
}

// Device copies of an ExpertSet.
struct DevExperts {
  Dev<uint8_t> up_w, up_s, down_w, down_s;
  Dev<float> up_g, down_g;
  explicit DevExperts(const ExpertSet& x)
      : up_w(x.up_w), up_s(x.up_s), down_w(x.down_w), down_s(x.down_s), up_g(x.up_g),
        down_g(x.down_g) {}
};

// Routed rows (row = token · top_k + slot -> expert id) grouped on the device by
// launch_group_by_expert.
struct DevRouting {
  int64_t rows, experts;
  Dev<int32_t> ids, offs, sorted, active;
  DevRouting(const std::vector<int32_t>& h, int64_t num_experts)
      : rows(static_cast<int64_t>(h.size())),
        experts(num_experts),
        ids(h),
        offs(std::vector<int32_t>(num_experts + 1)),
        sorted(std::vector<int32_t>(h.size())),
        active(std::vector<int32_t>(std::min<int64_t>(num_experts, rows))) {
    const cuda::GroupByExpertParams gp{ids.ptr(),    rows,         experts,
                                       offs.ptr(),   sorted.ptr(), active.ptr()};
    EXPECT_TRUE(cuda::launch_group_by_expert(gp, stream()).is_ok());
  }
};

// The grouped GEMV through the experts' gate|up (`up`: N = 2·inter, K = hidden) or down
// (N = hidden, K = inter) matrices for the routed rows; the caller sets the activations
// (x / xh, x_row_div), the variant and the epilogue.
inline cuda::QuantGemvParams grouped_params(QuantFormat f, DevExperts& d, DevRouting& r, bool up,
                                            int64_t inter, int64_t hidden) {
  cuda::QuantGemvParams p;
  p.format = f;
  p.w = up ? d.up_w.ptr() : d.down_w.ptr();
  p.w_scale = up ? d.up_s.ptr() : d.down_s.ptr();
  p.w_global = up ? d.up_g.ptr() : d.down_g.ptr();
  p.num_groups = r.experts;
  p.group_offsets = r.offs.ptr();
  p.sorted_rows = r.sorted.ptr();
  p.active_groups = r.active.ptr();
  p.num_slots = std::min(r.experts, r.rows);
  p.num_rows = r.rows;
  p.n = up ? 2 * inter : hidden;
  p.k = up ? hidden : inter;
  p.ldx = p.k;
  return p;
}

}  // namespace m3::cuda_test
