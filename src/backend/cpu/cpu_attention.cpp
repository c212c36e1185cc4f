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

// Reads rows of one cached tensor ([P, S, heads, dim]) of a sequence by token position: float32
// rows in place, any other --kv-cache-dtype dequantised into the caller's scratch row (exact, see
// quant/kv_quant.h), so the float32 maths after it is the same for every dtype.
class CacheRows {
 public:
  CacheRows(const KvLayerView& c, const float* f32, const KvQuantStore& q, int64_t heads,
            int64_t dim, const int32_t* block_table, int64_t num_blocks)
      : c_(c), f32_(f32), q_(q), heads_(heads), dim_(dim), block_table_(block_table),
        num_blocks_(num_blocks) {}

  const float* row(int64_t pos, int64_t head, float* scratch) const {
    const int64_t blk = pos / c_.page_size;
    M3_CHECK(blk < num_blocks_, "[cpu.attention] position beyond the block table");
    const int64_t page = block_table_[blk];
    M3_CHECK(page >= 0 && page < c_.num_pages, "[cpu.attention] bad page id");
    const int64_t r = pos % c_.page_size;
    if (!c_.quantised()) return f32_ + ((page * c_.page_size + r) * heads_ + head) * dim_;
    kv_read_row(c_.dtype, kv_page_head(c_.dtype, q_, page, c_.page_size, heads_, head, dim_), r,
                dim_, scratch);
    return scratch;
  }

 private:
  const KvLayerView& c_;
  const float* f32_;
  const KvQuantStore& q_;
  int64_t heads_, dim_;
  const int32_t* block_table_;
  int64_t num_blocks_;
};

}  // namespace

void CpuBackend::indexer_topk(const IndexerTopkParams& p) {
  const KvLayerView& c = p.cache;
  M3_CHECK(c.has_index_keys(), "[cpu.indexer_topk] layer has no index-key cache");
  const int64_t dix = c.index_head_dim, bs = c.page_size;
  const CacheRows keys(c, c.idx_k, c.iq, 1, dix, p.block_table, p.num_blocks);
  pool_.parallel_for(p.t * p.num_index_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<float, int32_t>> cand;
    std::vector<float> scratch(static_cast<size_t>(dix));
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
          float s = cpu::dot(q, keys.row(j, 0, scratch.data()), dix);
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
  const CacheRows keys(c, c.k, c.kq, hkv, d, p.block_table, p.num_blocks);
  const CacheRows values(c, c.v, c.vq, hkv, d, p.block_table, p.num_blocks);

  // The blocks head n of token t attends to, ascending (the key order of the sum does not depend
  // on the selection order), deduplicated.
  auto head_blocks = [&](int64_t t, int64_t n, std::vector<int32_t>* blocks) {
    const int64_t qb = p.positions[t] / bs;
    blocks->clear();
    if (p.selected != nullptr) {
      const int32_t* sel = p.selected + (t * p.num_index_heads + n / sel_group) * p.top_k;
      for (int64_t i = 0; i < p.top_k; ++i)
        if (sel[i] >= 0 && sel[i] <= qb) blocks->push_back(sel[i]);
      std::sort(blocks->begin(), blocks->end());
      blocks->erase(std::unique(blocks->begin(), blocks->end()), blocks->end());
    } else {
      for (int64_t b = 0; b <= qb; ++b) blocks->push_back(static_cast<int32_t>(b));
    }
  };
  // The allowed key positions of token t over `blocks`, in order.
  auto key_positions = [&](int64_t t, const std::vector<int32_t>& blocks,
                           std::vector<int64_t>* key_pos) {
    const int64_t pos = p.positions[t];
    key_pos->clear();
    for (int32_t b : blocks) {
      const int64_t last = std::min(pos, (static_cast<int64_t>(b) + 1) * bs - 1);
      for (int64_t j = static_cast<int64_t>(b) * bs; j <= last; ++j) key_pos->push_back(j);
    }
  };
  // Softmax attention of query head tn over n keys whose rows krow(i) / vrow(i) give; float32,
  // max subtraction, keys in order.
  auto attend = [&](int64_t tn, size_t n, const auto& krow, const auto& vrow,
                    std::vector<float>* scores, std::vector<float>* acc) {
    const float* q = p.q + tn * d;
    float* o = p.out + tn * d;
    if (n == 0) {  // cannot happen with a forced local block; keep the output defined
      std::fill(o, o + d, 0.0f);
      return;
    }
    scores->resize(n);
    float mx = -kInf;
    for (size_t j = 0; j < n; ++j) {
      const float s = cpu::dot(q, krow(j), d) * p.scale;
      (*scores)[j] = s;
      mx = std::max(mx, s);
    }
    float sum = 0.0f;
    for (float& s : *scores) {
      s = std::exp(s - mx);
      sum += s;
    }
    std::fill(acc->begin(), acc->end(), 0.0f);
    for (size_t j = 0; j < n; ++j) {
      const float w = (*scores)[j] / sum;
      const float* v = vrow(j);
      for (int64_t i = 0; i < d; ++i) (*acc)[i] += w * v[i];
    }
    std::copy(acc->begin(), acc->end(), o);
  };

  if (!c.quantised()) {  // float32 rows are read in place: one task per (token, head)
    pool_.parallel_for(p.t * p.num_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<int32_t> blocks;
      std::vector<int64_t> key_pos;
      std::vector<float> scores, acc(static_cast<size_t>(d));
      for (int64_t tn = begin; tn < end; ++tn) {
        const int64_t t = tn / p.num_heads, n = tn % p.num_heads, g = n / group;
        head_blocks(t, n, &blocks);
        key_positions(t, blocks, &key_pos);
        attend(
            tn, key_pos.size(), [&](size_t j) { return keys.row(key_pos[j], g, nullptr); },
            [&](size_t j) { return values.row(key_pos[j], g, nullptr); }, &scores, &acc);
      }
    });
    return;
  }
  // Quantised rows are dequantised once per (token, KV head) into kbuf / vbuf and shared by the
  // group's query heads that attend to the same blocks (all of them when Hix == Hkv).
  pool_.parallel_for(p.t * hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> blocks, cached_blocks;
    std::vector<int64_t> key_pos;
    std::vector<float> kbuf, vbuf, scores, acc(static_cast<size_t>(d));
    for (int64_t tg = begin; tg < end; ++tg) {
      const int64_t t = tg / hkv, g = tg % hkv;
      cached_blocks.clear();
      bool cached = false;
      for (int64_t n = g * group; n < (g + 1) * group; ++n) {
        head_blocks(t, n, &blocks);
        if (!cached || blocks != cached_blocks) {
          key_positions(t, blocks, &key_pos);
          kbuf.resize(key_pos.size() * static_cast<size_t>(d));
          vbuf.resize(kbuf.size());
          for (size_t j = 0; j < key_pos.size(); ++j) {
            keys.row(key_pos[j], g, kbuf.data() + j * d);
            values.row(key_pos[j], g, vbuf.data() + j * d);
          }
          cached_blocks = blocks;
          cached = true;
        }
        attend(
            t * p.num_heads + n, key_pos.size(), [&](size_t j) { return kbuf.data() + j * d; },
            [&](size_t j) { return vbuf.data() + j * d; }, &scores, &acc);
      }
    }
  });
}

}  // namespace m3
