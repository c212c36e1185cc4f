// Lightning-indexer block selection and paged (dense or block-sparse) GQA attention on the CPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace m3 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Address of cache row `pos` (a token position of the sequence) in a [P, S, row] buffer.
inline const float* cache_row(const float* base, const KvLayerView& c, const int32_t* block_table,
                              int64_t num_blocks, int64_t pos, int64_t row_elems) {
  int64_t blk = pos / c.page_size;
  M3_CHECK(blk < num_blocks, "[cpu.attention] position beyond the block table");
  int64_t page = block_table[blk];
  M3_CHECK(page >= 0 && page < c.num_pages, "[cpu.attention] bad page id");
  return base + (page * c.page_size + pos % c.page_size) * row_elems;
}

}  // namespace

void CpuBackend::indexer_topk(const IndexerTopkParams& p) {
  const KvLayerView& c = p.cache;
  M3_CHECK(c.idx_k != nullptr, "[cpu.indexer_topk] layer has no index-key cache");
  const int64_t dix = c.index_head_dim, bs = c.page_size;
  pool_.parallel_for(p.t * p.num_index_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<float, int32_t>> cand;
    for (int64_t th = begin; th < end; ++th) {
      int64_t t = th / p.num_index_heads, h = th % p.num_index_heads;
      const float* q = p.iq + th * dix;
      int64_t pos = p.positions[t];
      int64_t qb = pos / bs;
      cand.assign(static_cast<size_t>(qb + 1), {-kInf, 0});
      for (int64_t b = 0; b <= qb; ++b) {
        float best = -kInf;
        int64_t last = std::min(pos, (b + 1) * bs - 1);
        for (int64_t j = b * bs; j <= last; ++j) {
          float s = cpu::dot(q, cache_row(c.idx_k, c, p.block_table, p.num_blocks, j, dix), dix);
          best = std::max(best, s);
        }
        cand[b] = {best, static_cast<int32_t>(b)};
      }
      for (int64_t i = 0; i < p.local_blocks; ++i) cand[std::max<int64_t>(0, qb - i)].first = kInf;
      for (int64_t b = 0; b < std::min(p.init_blocks, qb + 1); ++b) cand[b].first = kInf;
      int64_t k = std::min<int64_t>(p.top_k, qb + 1);
      // Descending score, ties to the lower block id (HF's torch.topk leaves ties unspecified).
      auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      };
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), better);
      int32_t* out = p.selected + th * p.top_k;
      for (int64_t i = 0; i < p.top_k; ++i) {
        out[i] = (i < k && cand[i].first != -kInf) ? cand[i].second : -1;
      }
      (void)h;
    }
  });
}

void CpuBackend::paged_attention(const PagedAttentionParams& p) {
  const KvLayerView& c = p.cache;
  const int64_t hkv = c.num_kv_heads, d = c.head_dim, bs = c.page_size;
  M3_CHECK(p.num_heads % hkv == 0, "[cpu.paged_attention] heads not a multiple of kv heads");
  const int64_t group = p.num_heads / hkv;
  int64_t sel_group = 1;
  if (p.selected != nullptr) {
    M3_CHECK(p.num_index_heads > 0 && p.num_heads % p.num_index_heads == 0,
             "[cpu.paged_attention] heads not a multiple of index heads");
    sel_group = p.num_heads / p.num_index_heads;
  }
  const int64_t kv_row = hkv * d;
  pool_.parallel_for(p.t * p.num_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> blocks;
    std::vector<float> scores;
    std::vector<const float*> vrows;
    std::vector<float> acc(static_cast<size_t>(d));
    for (int64_t tn = begin; tn < end; ++tn) {
      int64_t t = tn / p.num_heads, n = tn % p.num_heads;
      int64_t g = n / group;
      int64_t pos = p.positions[t];
      int64_t qb = pos / bs;
      blocks.clear();
      if (p.selected != nullptr) {
        const int32_t* sel = p.selected + (t * p.num_index_heads + n / sel_group) * p.top_k;
        for (int64_t i = 0; i < p.top_k; ++i)
          if (sel[i] >= 0 && sel[i] <= qb) blocks.push_back(sel[i]);
        // Ascending block order: the key order of the sum does not depend on the selection order.
        std::sort(blocks.begin(), blocks.end());
        blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
      } else {
        for (int64_t b = 0; b <= qb; ++b) blocks.push_back(static_cast<int32_t>(b));
      }
      const float* q = p.q + tn * d;
      scores.clear();
      vrows.clear();
      float mx = -kInf;
      for (int32_t b : blocks) {
        int64_t last = std::min(pos, (static_cast<int64_t>(b) + 1) * bs - 1);
        for (int64_t j = static_cast<int64_t>(b) * bs; j <= last; ++j) {
          const float* krow = cache_row(c.k, c, p.block_table, p.num_blocks, j, kv_row) + g * d;
          float s = cpu::dot(q, krow, d) * p.scale;
          scores.push_back(s);
          vrows.push_back(cache_row(c.v, c, p.block_table, p.num_blocks, j, kv_row) + g * d);
          mx = std::max(mx, s);
        }
      }
      float* o = p.out + tn * d;
      if (scores.empty()) {  // cannot happen with a forced local block; keep the output defined
        std::fill(o, o + d, 0.0f);
        continue;
      }
      float sum = 0.0f;
      for (float& s : scores) {
        s = std::exp(s - mx);
        sum += s;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t j = 0; j < scores.size(); ++j) {
        float w = scores[j] / sum;
        const float* v = vrows[j];
        for (int64_t i = 0; i < d; ++i) acc[i] += w * v[i];
      }
      std::copy(acc.begin(), acc.end(), o);
    }
  });
}

}  // namespace m3
