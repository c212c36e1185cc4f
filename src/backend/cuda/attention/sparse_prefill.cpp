#include <algorithm>
#include <string>

#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/runtime/caching_allocator.h"

namespace m3::cuda {
namespace {

struct Scoped {
  CachingAllocator* a = nullptr;
  void* p = nullptr;
  ~Scoped() {
    if (p != nullptr) a->free(p);
  }
};

}  // namespace

Status launch_prefill_attention(const PrefillAttentionParams& p, CachingAllocator* alloc,
                                CUstream_st* stream, int64_t scratch_bytes) {
  if (p.t == 0) return Status::ok();
  const int64_t hkv = p.cache.num_kv_heads, d = p.cache.head_dim;
  if (hkv <= 0 || d <= 0 || p.num_blocks <= 0)
    return invalid_argument("[cuda.prefill_attention] empty cache view or block table");
  if (!p.dense && p.num_index_heads != hkv)
    return invalid_argument("[cuda.prefill_attention] sparse attention needs one index head per "
                            "KV head (Hix " + std::to_string(p.num_index_heads) + ", Hkv " +
                            std::to_string(hkv) + ")");
  // Dense rows select every causal block: top_k = num_blocks.
  const int64_t top_k = p.dense ? p.num_blocks : p.top_k;
  const bool mma = p.variant == 1;
  if (mma && p.dense) {  // no selection, no split scratch: one launch for the whole chunk
    PrefillAttentionParams whole = p;
    return launch_prefill_attention_mma(whole, nullptr, 0, stream);
  }
  const int64_t per_token =
      (mma ? 0 : p.num_heads * top_k * (d + 2) * 4) + hkv * top_k * 4 +
      (p.dense ? 0 : p.num_index_heads * p.num_blocks * 4);
  const int64_t chunk =
      std::clamp<int64_t>(scratch_bytes / per_token, 1, std::min<int64_t>(p.t, 65535));
  Scoped s_op{alloc}, s_ml{alloc}, s_sc{alloc}, s_sel{alloc};
  if (!mma) {
    M3_ASSIGN_OR_RETURN(s_op.p, alloc->allocate(chunk * p.num_heads * top_k * d * 4));
    M3_ASSIGN_OR_RETURN(s_ml.p, alloc->allocate(chunk * p.num_heads * top_k * 2 * 4));
  }
  if (!p.dense) {
    M3_ASSIGN_OR_RETURN(s_sc.p, alloc->allocate(chunk * p.num_index_heads * p.num_blocks * 4));
  }
  int32_t* selected = p.selected;
  if (selected == nullptr || p.dense) {
    M3_ASSIGN_OR_RETURN(s_sel.p, alloc->allocate(chunk * hkv * top_k * 4));
  }
  for (int64_t t0 = 0; t0 < p.t; t0 += chunk) {
    const int64_t n = std::min(chunk, p.t - t0);
    int32_t* sel = (p.selected != nullptr && !p.dense)
                       ? p.selected + t0 * hkv * top_k
                       : static_cast<int32_t*>(s_sel.p);
    if (p.dense) {
      M3_RETURN_IF_ERROR(launch_dense_selection(p.positions + t0, n, hkv, p.cache.page_size,
                                                top_k, sel, stream));
    } else {
      IndexerDecodeParams ip;
      ip.iq = p.iq + t0 * p.num_index_heads * p.cache.index_head_dim;
      ip.cache = p.cache;
      ip.positions = p.positions + t0;
      ip.block_tables = p.block_table;
      ip.block_table_stride = 0;
      ip.batch = n;
      ip.num_index_heads = p.num_index_heads;
      ip.max_blocks = p.num_blocks;
      ip.top_k = top_k;
      ip.local_blocks = p.local_blocks;
      ip.init_blocks = p.init_blocks;
      ip.block_scores = static_cast<float*>(s_sc.p);
      ip.selected = sel;
      M3_RETURN_IF_ERROR(launch_indexer_decode(ip, stream));
    }
    if (mma) {
      PrefillAttentionParams sub = p;
      sub.q = p.q + t0 * p.num_heads * d;
      sub.positions = p.positions + t0;
      sub.t = n;
      sub.out = p.out + t0 * p.num_heads * d;
      M3_RETURN_IF_ERROR(launch_prefill_attention_mma(sub, sel, top_k, stream));
      continue;
    }
    SparseDecodeParams ap;
    ap.q = p.q + t0 * p.num_heads * d;
    ap.cache = p.cache;
    ap.positions = p.positions + t0;
    ap.block_tables = p.block_table;
    ap.block_table_stride = 0;
    ap.selected = sel;
    ap.batch = n;
    ap.num_heads = p.num_heads;
    ap.max_blocks = p.num_blocks;
    ap.top_k = top_k;
    ap.scale = p.scale;
    ap.o_partial = static_cast<float*>(s_op.p);
    ap.ml_partial = static_cast<float*>(s_ml.p);
    ap.out = p.out + t0 * p.num_heads * d;
    M3_RETURN_IF_ERROR(launch_sparse_decode(ap, stream));
  }
  return Status::ok();
}

}  // namespace m3::cuda
