#include "model/minimax_m3/dspark/dspark_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "core/status.h"

namespace m3::minimax_m3::dspark {

void block_attention(const BlockAttentionParams& p) {
  const KvLayerView& c = p.cache;
  const int64_t hkv = c.num_kv_heads, d = c.head_dim, s = c.page_size, kv_row = hkv * d;
  M3_CHECK(p.num_heads % hkv == 0, "[dspark.attention] heads not a multiple of kv heads");
  const int64_t group = p.num_heads / hkv;
  std::vector<float> scores;
  std::vector<const float*> vrows;
  std::vector<float> acc(static_cast<size_t>(d));
  for (int64_t k = 0; k < p.block; ++k) {
    const int64_t q_pos = p.anchor_pos + k;
    const int64_t first = std::max<int64_t>(0, q_pos - p.window + 1);
    for (int64_t n = 0; n < p.num_heads; ++n) {
      const int64_t g = n / group;
      const float* q = p.q + (k * p.num_heads + n) * d;
      scores.clear();
      vrows.clear();
      float mx = -std::numeric_limits<float>::infinity();
      auto key = [&](const float* krow, const float* vrow) {
        const float sc = cpu::dot(q, krow, d) * p.scale;
        scores.push_back(sc);
        vrows.push_back(vrow);
        mx = std::max(mx, sc);
      };
      for (int64_t j = first; j < p.anchor_pos; ++j) {
        const int64_t b = j / s;
        M3_CHECK(b < p.num_blocks && p.block_table[b] >= 0,
                 "[dspark.attention] context position " + std::to_string(j) + " is not held");
        const int64_t off = (static_cast<int64_t>(p.block_table[b]) * s + j % s) * kv_row + g * d;
        key(c.k + off, c.v + off);
      }
      for (int64_t j = 0; j < p.block; ++j)
        key(p.block_k + j * kv_row + g * d, p.block_v + j * kv_row + g * d);
      float sum = 0.0f;
      for (float& x : scores) {
        x = std::exp(x - mx);
        sum += x;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t j = 0; j < scores.size(); ++j) {
        const float w = scores[j] / sum;
        for (int64_t i = 0; i < d; ++i) acc[static_cast<size_t>(i)] += w * vrows[j][i];
      }
      std::copy(acc.begin(), acc.end(), p.out + (k * p.num_heads + n) * d);
    }
  }
}

}  // namespace m3::minimax_m3::dspark
