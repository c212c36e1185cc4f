#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "backend/cuda/runtime/cuda_check.h"

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
  const bool tiled = p.kernel == PrefillAttentionKernel::kTiled;
  const bool mma = p.kernel == PrefillAttentionKernel::kTensorCore || tiled;
  if (mma && p.dense) {  // no selection, no split scratch: one launch for the whole chunk
    return tiled ? launch_prefill_attention_tiled(p, nullptr, 0, stream)
                 : launch_prefill_attention_mma(p, nullptr, 0, stream);
  }
  const bool gemm_indexer = !p.dense && p.indexer == PrefillIndexerKernel::kGemmScores;
  const bool fused_indexer = !p.dense && p.indexer == PrefillIndexerKernel::kFusedMaxPool;
  if (gemm_indexer && p.gemm == nullptr)
    return invalid_argument("[cuda.prefill_attention] the kGemmScores indexer needs a PrefillGemm");
  const int64_t per_token =
      (mma ? 0 : p.num_heads * top_k * (d + 2) * 4) + hkv * top_k * 4 +
      (p.dense ? 0 : p.num_index_heads * p.num_blocks * 4) +
      (gemm_indexer ? p.num_index_heads * p.num_blocks * p.cache.page_size * 4 : 0);
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
  Scoped s_keys{alloc}, s_scores{alloc};
  std::vector<int32_t> host_pos;
  if (gemm_indexer) {
    const int64_t dix = p.cache.index_head_dim, ps = p.cache.page_size;
    M3_ASSIGN_OR_RETURN(s_keys.p, alloc->allocate(p.num_blocks * ps * dix * 2));
    M3_ASSIGN_OR_RETURN(s_scores.p,
                        alloc->allocate(chunk * p.num_index_heads * p.num_blocks * ps * 4));
    M3_RETURN_IF_ERROR(launch_gather_index_keys(p.cache, p.block_table, p.num_blocks,
                                                static_cast<uint16_t*>(s_keys.p), stream));
    host_pos.resize(static_cast<size_t>(p.t));
    M3_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_pos.data(), p.positions, p.t * 4,
                                            cudaMemcpyDeviceToHost, stream));
    M3_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
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
      if (gemm_indexer) {
        // Token scores for the blocks this sub-chunk can see, then the block max-pool.
        const int64_t ps = p.cache.page_size, dix = p.cache.index_head_dim;
        int64_t max_pos = 0;
        for (int64_t i = t0; i < t0 + n; ++i)
          max_pos = std::max<int64_t>(max_pos, host_pos[static_cast<size_t>(i)]);
        const int64_t nb_sub = std::min(p.num_blocks, max_pos / ps + 1);
        PrefillLinearParams lp;
        lp.x = p.iq + t0 * p.num_index_heads * dix;
        lp.ldx = dix;
        lp.m = n * p.num_index_heads;
        lp.w.format = QuantFormat::kBf16;
        lp.w.w = static_cast<const uint8_t*>(s_keys.p);
        lp.w.n = nb_sub * ps;
        lp.w.k = dix;
        lp.y = s_scores.p;
        lp.ldy = nb_sub * ps;
        lp.out = PrefillOut::kF32;
        M3_RETURN_IF_ERROR(p.gemm->linear(lp, stream));
        M3_RETURN_IF_ERROR(launch_index_maxpool(
            static_cast<const float*>(s_scores.p), nb_sub * ps, nb_sub, p.positions + t0,
            p.block_table, p.cache.num_pages, n, p.num_index_heads, p.num_blocks,
            static_cast<float*>(s_sc.p), stream));
        ip.scores_ready = true;
      } else if (fused_indexer) {
        M3_RETURN_IF_ERROR(launch_index_block_scores_fused(
            ip.iq, p.cache, ip.positions, p.block_table, n, p.num_index_heads, p.num_blocks,
            ip.block_scores, stream));
        ip.scores_ready = true;
      }
      M3_RETURN_IF_ERROR(launch_indexer_decode(ip, stream));
    }
    if (mma) {
      PrefillAttentionParams sub = p;
      sub.q = p.q + t0 * p.num_heads * d;
      sub.positions = p.positions + t0;
      sub.t = n;
      sub.out = p.out + t0 * p.num_heads * d;
      M3_RETURN_IF_ERROR(tiled ? launch_prefill_attention_tiled(sub, sel, top_k, stream)
                               : launch_prefill_attention_mma(sub, sel, top_k, stream));
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
