// Sigmoid top-k routing and routed-expert compute on the CPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace m3 {

void CpuBackend::router_topk(const RouterTopkParams& p) {
  M3_CHECK(p.top_k > 0 && p.top_k <= p.num_experts, "[cpu.router_topk] bad top_k");
  pool_.parallel_for(p.m, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> sig(static_cast<size_t>(p.num_experts));
    std::vector<int32_t> order(static_cast<size_t>(p.num_experts));
    for (int64_t r = begin; r < end; ++r) {
      const float* l = p.logits + r * p.num_experts;
      for (int64_t e = 0; e < p.num_experts; ++e) sig[e] = 1.0f / (1.0f + std::exp(-l[e]));
      auto choice = [&](int32_t e) { return p.bias ? sig[e] + p.bias[e] : sig[e]; };
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + p.top_k, order.end(),
                        [&](int32_t a, int32_t b) {
                          float ca = choice(a), cb = choice(b);
                          return ca != cb ? ca > cb : a < b;
                        });
      float denom = 0.0f;
      for (int64_t i = 0; i < p.top_k; ++i) denom += sig[order[i]];
      std::sort(order.begin(), order.begin() + p.top_k);
      for (int64_t i = 0; i < p.top_k; ++i) {
        p.topk_ids[r * p.top_k + i] = order[i];
        p.topk_weights[r * p.top_k + i] = (sig[order[i]] / denom) * p.scaling;
      }
    }
  });
}

void CpuBackend::moe_experts(const MoeExpertsParams& p) {
  const int64_t hd = p.hidden, inter = p.inter, kk = p.top_k;
  // Rows routed to each expert, as (token, slot) pairs in token order.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(p.num_experts));
  for (int64_t r = 0; r < p.m * kk; ++r) {
    int32_t e = p.topk_ids[r];
    M3_CHECK(e >= 0 && e < p.num_experts, "[cpu.moe_experts] expert id out of range");
    rows[e].push_back(r);
  }
  // Per (token, slot) expert output; combined afterwards in slot order so that the sum order of a
  // token never depends on the other tokens.
  std::vector<float> contrib(static_cast<size_t>(p.m * kk * hd));
  std::vector<float> xin, gate_up, act, yout;
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const std::vector<int64_t>& rs = rows[e];
    if (rs.empty()) continue;
    int64_t n = static_cast<int64_t>(rs.size());
    xin.resize(static_cast<size_t>(n * hd));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(xin.data() + i * hd, p.x + (rs[i] / kk) * hd, sizeof(float) * hd);
    gate_up.resize(static_cast<size_t>(n * 2 * inter));
    act.resize(static_cast<size_t>(n * inter));
    yout.resize(static_cast<size_t>(n * hd));
    linear({xin.data(), p.w13[e], gate_up.data(), n, 2 * inter, hd, false});
    swiglu_oai({gate_up.data(), act.data(), n, inter, p.alpha, p.limit});
    linear({act.data(), p.w2[e], yout.data(), n, hd, inter, false});
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(contrib.data() + rs[i] * hd, yout.data() + i * hd, sizeof(float) * hd);
  }
  pool_.parallel_for(p.m, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = p.out + t * hd;
      for (int64_t s = 0; s < kk; ++s) {
        float w = p.topk_weights[t * kk + s];
        const float* c = contrib.data() + (t * kk + s) * hd;
        if (s == 0) {
          for (int64_t i = 0; i < hd; ++i) o[i] = c[i] * w;
        } else {
          for (int64_t i = 0; i < hd; ++i) o[i] += c[i] * w;
        }
      }
    }
  });
}

}  // namespace m3
