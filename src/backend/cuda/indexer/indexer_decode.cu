// Lightning indexer for decode (bf16 or quantised index-key cache, float32 scores): one CTA per
// (block, sequence) loads the page's 128 index keys once and scores them against the Hix query
// heads, max-pooling to one score per (head, block); then one to 16 CTAs per (sequence, head)
// force the local and init blocks and pick the top_k blocks (descending score, ties to the lower
// id). A quantised cache (fp8_e4m3 / fp4_e2m1) is dequantised on load into the same bf16 tile,
// exactly (kv/kv_load.cuh), so the scores are those of a bf16 cache holding the dequantised keys.
//
// At batch 1-8 both kernels are latency-bound (32-2048 small CTAs): the score kernel issues the
// query and all key loads before it needs them (with keys_before_wait, the keys of earlier
// positions before its PDL wait) and reads shared memory in 16-byte pieces; the top-k spreads
// each row's candidates over CTAs and each candidate's rank count over up to 32 lanes, and is
// launched as a programmatic dependent of the score kernel (its launch overlaps the scoring's
// tail).
#include <algorithm>
#include <string>

#include "backend/cuda/attention/sparse_decode.h"
#include "backend/cuda/indexer/block_rank.cuh"
#include "backend/cuda/kv/kv_load.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kDix = 128, kMaxHix = 8, kThreads = 128, kTopkThreads = 1024;
// 32-bit words per key row in shared memory: 64 + 4 keeps rows 16-byte aligned, and the 8 lanes
// of a quarter-warp reading rows s .. s+7 at the same column hit banks 4s + c: conflict-free.
constexpr int kPitch = kDix / 2 + 4;
// Candidate blocks up to which the top-k is a rank count (contexts to 128K tokens); beyond, the
// slot-by-slot selection.
constexpr int kRankMax = 1024;

__device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// One CTA per (block, sequence); thread s scores key s against the index heads (HMAX: 4 or 8,
// the first num_index_heads used). All 16 of a thread's 16-byte key loads are issued before the
// first shared-memory store (one memory latency, not one per unrolled group), and the dot
// products read shared memory in 16-byte pieces; each score is the same fmaf sequence over d
// ascending as before. DT: the cache's dtype (kBF16, or fp8_e4m3 / fp4_e2m1 read through
// kv_fetch8 / kv_dequant8_bf16 into the same tile).
template <int HMAX, KvCacheDtype DT>
__global__ void __launch_bounds__(kThreads) indexer_score_kernel(IndexerDecodeParams p) {
  constexpr bool kQuant = DT != KvCacheDtype::kBF16;
  __shared__ __align__(16) uint32_t ks[kS][kPitch];
  __shared__ __align__(16) float qs[HMAX][kDix];
  __shared__ float red[HMAX][kThreads / 32];
  pdl_launch_dependents();  // the top-k CTAs may be scheduled now; they wait in pdl_wait()
  const int64_t blk = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t hix = p.num_index_heads;
  // The position and the table entry (read unconditionally: blk < max_blocks, in bounds) are
  // inputs of the step, read in parallel and before the wait for the previous kernel (launched
  // with p.pdl; a no-op without); the index queries, which that kernel writes, right after it:
  // all three loads are in flight together.
  const int64_t pos = p.positions[b];
  const int64_t row = b * (p.block_table_stride < 0 ? p.max_blocks : p.block_table_stride);
  const int32_t entry = p.block_tables[row + blk];
  const int64_t page = blk <= pos / kS ? entry : -1;
  const bool has_page = page >= 0 && page < p.cache.num_pages;
  // Thread tid loads pieces tid + j·kThreads: key row 8j + tid / 16, 8 elements each.
  constexpr int kPieces = kS * kDix / 8 / kThreads;  // 16
  const uint4* src =
      kQuant ? nullptr
             : reinterpret_cast<const uint4*>(p.cache.idx_k + (has_page ? page : 0) * kS * kDix);
  uint4 kr[kPieces];
  // keys_before_wait: every key before the row's position was written before the previous kernel
  // started (decode: earlier steps), so the page's keys go out before the wait, except the
  // position's own row, which the previous kernel (the attention inputs) writes: those 16 pieces
  // are loaded again after the wait, through L2 (no L1 line of that row was read before it).
  // Not for a quantised cache: writing the position's row may raise the page scale and re-encode
  // the page's earlier rows.
  [[maybe_unused]] const int own_row = blk == pos / kS ? static_cast<int>(pos % kS) : -1;
  if (!kQuant && p.keys_before_wait && has_page) {
#pragma unroll
    for (int j = 0; j < kPieces; ++j) kr[j] = __ldg(src + tid + j * kThreads);
  }
  pdl_wait();
  uint4 qr = make_uint4(0, 0, 0, 0);
  if (tid < hix * kDix / 8) qr = __ldg(reinterpret_cast<const uint4*>(p.iq + b * hix * kDix) + tid);
  float* out = p.block_scores + b * hix * p.max_blocks + blk;
  if (!has_page) {
    if (tid < hix) out[tid * p.max_blocks] = -INFINITY;
    return;
  }
  if constexpr (kQuant) {
    // Every fetch of the thread (and the page scale) in flight before the first dequantisation.
    const float scale = kv_page_scale(p.cache.iq, page, 1, 0);
    KvRaw8 raw[kPieces];
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
      const int i = tid + j * kThreads;
      raw[j] = kv_fetch8<DT>(p.cache.iq, page * kS + i / (kDix / 8), kDix, (i % (kDix / 8)) * 8);
    }
#pragma unroll
    for (int j = 0; j < kPieces; ++j) kr[j] = kv_dequant8_bf16<DT>(raw[j], scale);
  } else if (!p.keys_before_wait) {
#pragma unroll
    for (int j = 0; j < kPieces; ++j) kr[j] = __ldg(src + tid + j * kThreads);
  } else if (own_row >= 0) {
#pragma unroll
    for (int j = 0; j < kPieces; ++j)
      if ((tid + j * kThreads) / (kDix / 8) == own_row) kr[j] = __ldcg(src + tid + j * kThreads);
  }
  if (tid < hix * kDix / 8) {
    const uint32_t w[4] = {qr.x, qr.y, qr.z, qr.w};
    float* dst = &qs[tid / (kDix / 8)][(tid % (kDix / 8)) * 8];
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[2 * e] = lo(w[e]), dst[2 * e + 1] = hi(w[e]);
  }
#pragma unroll
  for (int j = 0; j < kPieces; ++j) {
    const int i = tid + j * kThreads, s = i / (kDix / 8), w = (i % (kDix / 8)) * 4;
    *reinterpret_cast<uint4*>(&ks[s][w]) = kr[j];
  }
  __syncthreads();
  float acc[HMAX];
#pragma unroll
  for (int h = 0; h < HMAX; ++h) acc[h] = 0.0f;
#pragma unroll 2
  for (int d8 = 0; d8 < kDix / 8; ++d8) {
    const uint4 kw = *reinterpret_cast<const uint4*>(&ks[tid][d8 * 4]);
    const float kf[8] = {lo(kw.x), hi(kw.x), lo(kw.y), hi(kw.y),
                         lo(kw.z), hi(kw.z), lo(kw.w), hi(kw.w)};
#pragma unroll
    for (int h = 0; h < HMAX; ++h) {
      if (h >= hix) break;
      const float4 qa = *reinterpret_cast<const float4*>(&qs[h][d8 * 8]);
      const float4 qc = *reinterpret_cast<const float4*>(&qs[h][d8 * 8 + 4]);
      float a = acc[h];
      a = fmaf(qa.x, kf[0], a), a = fmaf(qa.y, kf[1], a), a = fmaf(qa.z, kf[2], a);
      a = fmaf(qa.w, kf[3], a), a = fmaf(qc.x, kf[4], a), a = fmaf(qc.y, kf[5], a);
      a = fmaf(qc.z, kf[6], a), a = fmaf(qc.w, kf[7], a);
      acc[h] = a;
    }
  }
  const bool valid = blk * kS + tid <= pos;
#pragma unroll
  for (int h = 0; h < HMAX; ++h) {
    if (h >= hix) break;
    const float m = warp_max(valid ? acc[h] : -INFINITY);
    if (lane == 0) red[h][warp] = m;
  }
  __syncthreads();
  if (tid < hix) {
    float m = red[tid][0];
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, red[tid][w]);
    out[tid * p.max_blocks] = m;
  }
}

// Candidates per CTA of the rank count: a (sequence, index head) row of n candidates is spread
// over gridDim.y = ceil(max_blocks / kRankPerCta) CTAs (at most kRankMax / kRankPerCta), each
// ranking its share of the candidates against all n. One CTA ranking 256 candidates (32K tokens)
// issues 64 comparisons per thread on one SM (~6.5 us with its launch, against ~2.6 us for 32).
constexpr int kRankPerCta = 64;
constexpr int64_t kRowsWithoutSpread = 128;

// kTopkThreads per CTA, grid (sequence · index head, parts). `dependent`: launched as a
// programmatic dependent of the score kernel: the positions (written before that kernel started)
// are read before pdl_wait(), the scores after it.
__global__ void __launch_bounds__(kTopkThreads) indexer_topk_kernel(IndexerDecodeParams p,
                                                                    bool dependent) {
  pdl_launch_dependents();  // a PDL attention split may be scheduled; it waits for this grid
  const int64_t bh = blockIdx.x, b = bh / p.num_index_heads;
  const int part_id = blockIdx.y, parts = gridDim.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  float* sc = p.block_scores + bh * p.max_blocks;
  const int64_t qb = min(static_cast<int64_t>(p.positions[b] / kS), p.max_blocks - 1);
  if (dependent) pdl_wait();
  int32_t* out = p.selected + bh * p.top_k;
  const int64_t k = min(p.top_k, qb + 1);
  const int64_t n = qb + 1;  // candidate blocks 0 .. qb
  if (n <= kRankMax) {
    // Up to kRankMax candidates: each block's rank by block_rank.cuh's rule (n^2 comparisons from
    // shared memory, one pass, no barrier per slot); rank r < k goes to slot r, each written once.
    __shared__ float s_sc[kRankMax];
    const int64_t local0 = block_rank::local_first(qb, p.local_blocks);
    for (int64_t i = tid; i < n; i += blockDim.x)
      s_sc[i] = block_rank::candidate_key(sc, i, local0, p.init_blocks);
    __syncthreads();
    // This CTA ranks candidates c0 .. c1 - 1 (an even share of the n; none for some CTAs of a
    // short row), P adjacent lanes per candidate. n = 32 (4K tokens): one CTA, one comparison
    // per thread; n = 256: 4 CTAs, 16 per thread.
    const int64_t share = (n + parts - 1) / parts;
    const int64_t c0 = min(n, part_id * share), c1 = min(n, c0 + share);
    const int P = block_rank::lanes_per_candidate(c1 - c0, static_cast<int>(blockDim.x));
    const int part = tid % P;
    for (int64_t base = c0; base < c1; base += blockDim.x / P) {  // block-uniform
      const int64_t i = base + tid / P;
      const bool live = i < c1;
      const float v = live ? s_sc[i] : 0.0f;
      const int rank = block_rank::rank_of(s_sc, n, i, v, live, part, P);
      if (live && part == 0 && rank < k) out[rank] = block_rank::selected_id(v, i);
    }
    if (part_id == 0)
      for (int64_t slot = k + tid; slot < p.top_k; slot += blockDim.x) out[slot] = -1;
    return;
  }
  if (part_id != 0) return;  // the slot-by-slot selection runs in one CTA per row
  if (tid == 0) {
    for (int64_t i = 0; i < p.local_blocks; ++i) sc[qb - i > 0 ? qb - i : 0] = INFINITY;
    for (int64_t i = 0; i < min(p.init_blocks, qb + 1); ++i) sc[i] = INFINITY;
  }
  __syncthreads();
  __shared__ float s_best[32];
  __shared__ int s_id[32];
  for (int64_t slot = 0; slot < p.top_k; ++slot) {
    if (slot >= k) {
      if (tid == 0) out[slot] = -1;
      continue;
    }
    float best = -INFINITY;
    int best_b = 0x7fffffff;
    for (int bb = tid; bb <= qb; bb += blockDim.x) {
      const float v = sc[bb];
      if (v > best || (v == best && bb < best_b)) best = v, best_b = bb;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_b, o);
      if (ob > best || (ob == best && oi < best_b)) best = ob, best_b = oi;
    }
    if (lane == 0) s_best[warp] = best, s_id[warp] = best_b;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < nw; ++w)
        if (s_best[w] > best || (s_best[w] == best && s_id[w] < best_b))
          best = s_best[w], best_b = s_id[w];
      const bool valid = best_b != 0x7fffffff && best != -INFINITY;
      out[slot] = valid ? best_b : -1;
      if (valid) sc[best_b] = __int_as_float(0x7fc00000);  // NaN: never wins again
    }
    __syncthreads();
  }
}

template <KvCacheDtype DT>
Status launch_scores(const IndexerDecodeParams& p, CUstream_st* stream) {
  dim3 grid(static_cast<unsigned>(p.max_blocks), static_cast<unsigned>(p.batch));
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(
      p.pdl, p.num_index_heads <= 4 ? indexer_score_kernel<4, DT> : indexer_score_kernel<8, DT>,
      grid, dim3(kThreads), 0, stream, p));
  return Status::ok();
}

}  // namespace

Status launch_indexer_decode(const IndexerDecodeParams& p, CUstream_st* stream) {
  if (p.batch == 0) return Status::ok();
  const KvCacheView& c = p.cache;
  if (c.index_head_dim != kDix || c.page_size != kS || p.num_index_heads <= 0 ||
      p.num_index_heads > kMaxHix || !c.has_index_keys() || p.max_blocks <= 0)
    return invalid_argument("[cuda.indexer_decode] needs Dix = 128, page 128, 1..8 index heads "
                            "and an index-key cache");
  if (!p.scores_ready) {
    if (((reinterpret_cast<uintptr_t>(p.iq) |
          reinterpret_cast<uintptr_t>(c.quantised() ? nullptr : c.idx_k)) & 15) != 0)
      return invalid_argument("[cuda.indexer_decode] iq and a bf16 cache's idx_k must be 16-byte "
                              "aligned (16-byte loads)");
    if (c.quantised()) {
      if (const char* why = kv_quant_view_problem(c, false, true))
        return invalid_argument(std::string("[cuda.indexer_decode] ") + why);
    }
    switch (c.dtype) {
      case KvCacheDtype::kFp8E4M3:
        M3_RETURN_IF_ERROR(launch_scores<KvCacheDtype::kFp8E4M3>(p, stream));
        break;
      case KvCacheDtype::kFp4E2M1:
        M3_RETURN_IF_ERROR(launch_scores<KvCacheDtype::kFp4E2M1>(p, stream));
        break;
      default:
        M3_RETURN_IF_ERROR(launch_scores<KvCacheDtype::kBF16>(p, stream));
        break;
    }
  }
  if (p.skip_topk) return Status::ok();  // the clustered split attention selects
  // After the score kernel, a programmatic dependent launch (its launch and CTA start overlap
  // the scoring's tail). With scores_ready the previous kernel is the caller's: a plain launch.
  const bool dependent = !p.scores_ready && p.dependent_launch;
  // Rows spread over several CTAs only while the rows alone leave the GPU mostly idle (decode at
  // small batches; not the prefill's tokens · heads rows, where it would only repeat the loads).
  const int64_t rows = p.batch * p.num_index_heads;
  const int64_t parts =
      rows >= kRowsWithoutSpread || !p.spread_rank
          ? 1
          : std::min<int64_t>(kRankMax / kRankPerCta, (p.max_blocks + kRankPerCta - 1) / kRankPerCta);
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(dependent, indexer_topk_kernel,
                                        dim3(static_cast<unsigned>(p.batch * p.num_index_heads),
                                             static_cast<unsigned>(parts)),
                                        dim3(kTopkThreads), 0, stream, p, dependent));
  return Status::ok();
}

}  // namespace m3::cuda
