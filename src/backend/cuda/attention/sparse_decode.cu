// Block-sparse paged decode attention (bf16 or quantised cache, float32 math), split over the
// selected blocks: one CTA per (selected block, KV group, sequence) — or per quarter / half of a
// block's keys for small batches (key splits) — loads its K and V rows of the group once into
// shared memory and serves all 16 query heads of the group (scores, softmax statistics and the
// unnormalised P·V); a combine kernel merges the partial states per head, launched as a
// programmatic dependent.
//
// Latency, not bandwidth, bounds this at batch 1-8 (1-8 MB per call), so the kernel is written
// for a short critical path: the queries are fetched before the selection / block-table chain,
// every K and V load of a thread is issued before the first shared-memory store, the inner loops
// read shared memory in 16-byte pieces (4-8 FMAs per load instead of 1-2), the softmax
// statistics come from registers, and the combine reads each partial state once with all of a
// thread's loads in flight. The arithmetic per score and per partial P·V is the same sequence
// of fmaf as the CPU-ordered loop (d, then key, ascending). Where SparseDecodeParams::mma asks
// for it the launcher runs the tensor-core split kernel instead, one CTA per selected block at
// every batch (sparse_decode_mma.cu: 2.0-2.5x faster at batch 8-128, and at batch 1 faster than
// this kernel with 4 key splits; H200).
//
// Both kernels read a quantised cache (fp8_e4m3 / fp4_e2m1) by dequantising each 8-element piece
// on load into the same bf16 shared-memory tiles (kv/kv_load.cuh; exact), so they compute what
// they compute on a bf16 cache holding the dequantised values.
#include "backend/cuda/attention/sparse_decode.h"

#include <string>

#include "backend/cuda/attention/decode_combine.cuh"
#include "backend/cuda/attention/sparse_decode_mma.h"
#include "backend/cuda/kv/kv_load.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/dynamic_smem.cuh"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kD = 128, kGroup = 16, kThreads = 128;
// 32-bit words per K row in shared memory: 64 + 4 keeps rows 16-byte aligned, and the 8 lanes of
// a quarter-warp reading rows s .. s+7 at the same column hit banks 4s + c: conflict-free.
constexpr int kKPitch = kD / 2 + 4;

// SPLITS CTAs share one selected block, each with kS / SPLITS of its keys (small batches: 64
// CTAs of 128 keys leave most of the GPU idle at batch 1; 4 splits give 256 shorter ones). The
// partial states are indexed by slot · SPLITS + part.
template <int SPLITS>
struct Smem {
  static constexpr int kKeys = kS / SPLITS;
  uint32_t k[kKeys][kKPitch];  // bf16 pairs
  uint32_t v[kKeys][kD / 2];   // bf16 pairs, read along D (conflict-free without padding)
  float q[kGroup][kD];
  float pt[kKeys][kGroup];     // exp(score - max), key-major: one 16-byte load gives 4 heads
  float red[kThreads / 32][kGroup];  // per-warp maxima / sums of the softmax statistics
};

__device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// DT: the cache's dtype (kBF16, or fp8_e4m3 / fp4_e2m1 through kv_fetch8 / kv_dequant8_bf16).
template <int SPLITS, KvCacheDtype DT>
__global__ void __launch_bounds__(kThreads) sparse_decode_split_kernel(SparseDecodeParams p) {
  constexpr bool kQuant = DT != KvCacheDtype::kBF16;
  constexpr int kKeys = kS / SPLITS;
  constexpr int kHeadsPerThread = kGroup * kKeys / kThreads;  // scores: 4, 8 or 16 heads
  constexpr int kWarpsPerHeads = kKeys / 32;  // warps sharing one head set in the scores
  constexpr int kPieces = kKeys * (kD / 8) / kThreads;  // 16-byte K (and V) loads per thread
  constexpr int kBatch = kPieces < 8 ? kPieces : 8;     // loads in flight per round
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<SPLITS>& sm = *reinterpret_cast<Smem<SPLITS>*>(smem_raw);
  const int slot = blockIdx.x / SPLITS, part = blockIdx.x % SPLITS, g = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const KvCacheView& c = p.cache;
  const int64_t hkv = c.num_kv_heads;
  // The position is an input of the step (no kernel writes it): read before the wait for the
  // previous kernel (launched with p.pdl; a no-op without). The group's 16 queries (4 KB, two
  // 16-byte pieces per thread) do not depend on the selection: their loads go out right after
  // the wait, under the selection -> block table chain below.
  const int64_t pos = p.positions[b];
  pdl_wait();
  // The combine's CTAs may be scheduled from here on (they wait in pdl_wait()), not from this
  // kernel's start: the combine lets the o_proj GEMV start at once, and that GEMV requests its
  // first weight stages before its wait; launched as a programmatic dependent (pdl), this kernel
  // would start under the indexer, and those requests would queue in front of its loads.
  pdl_launch_dependents();
  const uint4* qg = reinterpret_cast<const uint4*>(p.q + (b * p.num_heads + g * kGroup) * kD);
  uint4 qr[kGroup * kD / 8 / kThreads];
#pragma unroll
  for (int j = 0; j < kGroup * kD / 8 / kThreads; ++j) qr[j] = __ldg(qg + tid + j * kThreads);
  const int64_t qb = pos / kS;
  // No selection: slot j is block j (max_blocks <= top_k, checked by the launcher).
  const int32_t* sel = p.selected != nullptr ? p.selected + (b * hkv + g) * p.top_k : nullptr;
  const int32_t blk = sel != nullptr ? sel[slot] : slot;
  const int64_t key0 = int64_t{blk} * kS + part * kKeys;  // position of this CTA's first key
  bool skip = blk < 0 || blk > qb || key0 > pos;  // key0 > pos: every key of the part is future
  // Duplicates count once (the first slot). No early exit: the loads go out together.
  if (sel != nullptr)
    for (int i = 0; i < slot; ++i) skip |= sel[i] == blk;
  const int64_t row = b * (p.block_table_stride < 0 ? p.max_blocks : p.block_table_stride);
  const int64_t page = skip ? -1 : p.block_tables[row + blk];
  // This part's partial state of head 0 (head h at + h · slots): its (max, sum) at
  // ml_partial + state·2, its o row at o_partial + state·kD.
  const int64_t slots = p.top_k * SPLITS;
  const int64_t state = (b * p.num_heads + g * kGroup) * slots + int64_t{slot} * SPLITS + part;
  if (skip || page < 0 || page >= c.num_pages) {
    if (tid < kGroup) {
      p.ml_partial[(state + tid * slots) * 2] = -INFINITY;
      p.ml_partial[(state + tid * slots) * 2 + 1] = 0.0f;
    }
    return;
  }
  if constexpr (!kQuant) {
    // This part's K and V rows of group g (256 B each, 16-byte pieces), kBatch loads of each in
    // flight per thread before any store.
    const int64_t first = (page * kS + part * kKeys) * hkv + g;  // the part's first row
    const uint4* kg = reinterpret_cast<const uint4*>(c.k + first * kD);
    const uint4* vg = reinterpret_cast<const uint4*>(c.v + first * kD);
    const int64_t row_stride = hkv * kD / 8;  // uint4 per token row
#pragma unroll
    for (int j0 = 0; j0 < kPieces; j0 += kBatch) {
      uint4 kr[kBatch], vr[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = tid + (j0 + j) * kThreads, s = i / (kD / 8), piece = i % (kD / 8);
        kr[j] = __ldg(kg + s * row_stride + piece);
        // V rows past the query's position are zeroed: a page's unwritten tail may hold NaN bit
        // patterns, and their weight 0 would still give 0 · NaN = NaN.
        vr[j] = key0 + s <= pos ? __ldg(vg + s * row_stride + piece) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = tid + (j0 + j) * kThreads, s = i / (kD / 8), piece = i % (kD / 8);
        *reinterpret_cast<uint4*>(&sm.k[s][piece * 4]) = kr[j];
        *reinterpret_cast<uint4*>(&sm.v[s][piece * 4]) = vr[j];
      }
    }
  } else {
    // All of the thread's K and V fetches (a quarter or half of the bf16 bytes) in flight before
    // the first dequantisation; V rows past the position zeroed as above.
    const float kscale = kv_page_scale(c.kq, page, hkv, g);
    const float vscale = kv_page_scale(c.vq, page, hkv, g);
    KvRaw8 kraw[kPieces], vraw[kPieces];
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
      const int i = tid + j * kThreads, s = i / (kD / 8), piece = i % (kD / 8);
      const int64_t r = (page * kS + part * kKeys + s) * hkv + g;
      kraw[j] = kv_fetch8<DT>(c.kq, r, kD, piece * 8);
      vraw[j] = key0 + s <= pos ? kv_fetch8<DT>(c.vq, r, kD, piece * 8) : KvRaw8{};
    }
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
      const int i = tid + j * kThreads, s = i / (kD / 8), piece = i % (kD / 8);
      *reinterpret_cast<uint4*>(&sm.k[s][piece * 4]) = kv_dequant8_bf16<DT>(kraw[j], kscale);
      *reinterpret_cast<uint4*>(&sm.v[s][piece * 4]) =
          key0 + s <= pos ? kv_dequant8_bf16<DT>(vraw[j], vscale) : make_uint4(0, 0, 0, 0);
    }
  }
#pragma unroll
  for (int j = 0; j < kGroup * kD / 8 / kThreads; ++j) {
    const int i = (tid + j * kThreads) * 8;  // 8 bf16 of row i / kD
    float* dst = &sm.q[i / kD][i % kD];
    *reinterpret_cast<float4*>(dst) =
        make_float4(lo(qr[j].x), hi(qr[j].x), lo(qr[j].y), hi(qr[j].y));
    *reinterpret_cast<float4*>(dst + 4) =
        make_float4(lo(qr[j].z), hi(qr[j].z), lo(qr[j].w), hi(qr[j].w));
  }
  __syncthreads();

  // Scores: thread (s, hq) owns key s of the part for heads h0 .. h0 + H' - 1; warp w holds keys
  // 32·(w % kWarpsPerHeads) + lane. Per 8 dims: one 16-byte K load, two 16-byte (broadcast) query
  // loads per head.
  const int s = tid % kKeys, h0 = (tid / kKeys) * kHeadsPerThread;
  float acc[kHeadsPerThread];
#pragma unroll
  for (int h = 0; h < kHeadsPerThread; ++h) acc[h] = 0.0f;
#pragma unroll 2
  for (int d8 = 0; d8 < kD / 8; ++d8) {
    const uint4 kw = *reinterpret_cast<const uint4*>(&sm.k[s][d8 * 4]);
    const float kf[8] = {lo(kw.x), hi(kw.x), lo(kw.y), hi(kw.y),
                         lo(kw.z), hi(kw.z), lo(kw.w), hi(kw.w)};
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h) {
      const float4 qa = *reinterpret_cast<const float4*>(&sm.q[h0 + h][d8 * 8]);
      const float4 qc = *reinterpret_cast<const float4*>(&sm.q[h0 + h][d8 * 8 + 4]);
      float a = acc[h];
      a = fmaf(qa.x, kf[0], a), a = fmaf(qa.y, kf[1], a), a = fmaf(qa.z, kf[2], a);
      a = fmaf(qa.w, kf[3], a), a = fmaf(qc.x, kf[4], a), a = fmaf(qc.y, kf[5], a);
      a = fmaf(qc.z, kf[6], a), a = fmaf(qc.w, kf[7], a);
      acc[h] = a;
    }
  }
  // Softmax statistics from the registers: the maximum over the part's keys (its first key,
  // key0 <= pos, is always valid: the maximum is finite), then exp and the sum of exp.
  const bool valid = key0 + s <= pos;
#pragma unroll
  for (int h = 0; h < kHeadsPerThread; ++h) {
    acc[h] = valid ? acc[h] * p.scale : -INFINITY;
    const float m = warp_max(acc[h]);
    if (lane == 0) sm.red[warp][h0 + h] = m;
  }
  __syncthreads();
  const int w0 = warp - warp % kWarpsPerHeads;  // first warp of this head set
  float mh[kHeadsPerThread];
#pragma unroll
  for (int h = 0; h < kHeadsPerThread; ++h) {
    mh[h] = sm.red[w0][h0 + h];
#pragma unroll
    for (int w = 1; w < kWarpsPerHeads; ++w) mh[h] = fmaxf(mh[h], sm.red[w0 + w][h0 + h]);
    acc[h] = expf(acc[h] - mh[h]);  // invalid keys: exp(-inf) = 0
  }
#pragma unroll
  for (int h = 0; h < kHeadsPerThread; h += 4)
    *reinterpret_cast<float4*>(&sm.pt[s][h0 + h]) =
        make_float4(acc[h], acc[h + 1], acc[h + 2], acc[h + 3]);
  __syncthreads();  // every maximum read before red is reused for the sums
#pragma unroll
  for (int h = 0; h < kHeadsPerThread; ++h) {
    const float l = warp_sum(acc[h]);
    if (lane == 0) sm.red[warp][h0 + h] = l;
  }
  __syncthreads();
  if (warp % kWarpsPerHeads == 0 && lane < kHeadsPerThread) {
    float l = sm.red[warp][h0 + lane];
#pragma unroll
    for (int w = 1; w < kWarpsPerHeads; ++w) l += sm.red[warp + w][h0 + lane];
    float m = mh[0];
#pragma unroll
    for (int h = 1; h < kHeadsPerThread; ++h) m = lane == h ? mh[h] : m;
    p.ml_partial[(state + (h0 + lane) * slots) * 2] = m;
    p.ml_partial[(state + (h0 + lane) * slots) * 2 + 1] = l;
  }

  // Unnormalised P·V: thread (dq, hq) owns dims 4·dq .. 4·dq+3 of heads 4·hq .. 4·hq+3; per key
  // one 8-byte V load and one 16-byte (broadcast) load of the four heads' weights.
  {
    const int dq = lane, hq = warp * 4;
    float a[4][4] = {};
#pragma unroll 4
    for (int t = 0; t < kKeys; ++t) {
      const uint2 vw = *reinterpret_cast<const uint2*>(&sm.v[t][dq * 2]);
      const float vf[4] = {lo(vw.x), hi(vw.x), lo(vw.y), hi(vw.y)};
      const float4 pw = *reinterpret_cast<const float4*>(&sm.pt[t][hq]);
      const float pj[4] = {pw.x, pw.y, pw.z, pw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[j][e] = fmaf(pj[j], vf[e], a[j][e]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<float4*>(p.o_partial + (state + (hq + j) * slots) * kD + 4 * dq) =
          make_float4(a[j][0], a[j][1], a[j][2], a[j][3]);
  }
}

// One CTA per (head, sequence) merges the top_k · splits partial states
// (decode_combine::combine_head).
__global__ void __launch_bounds__(kThreads) sparse_decode_combine_kernel(SparseDecodeParams p,
                                                                         int64_t slots) {
  pdl_launch_dependents();  // a following PDL GEMV (o_proj) may start streaming its weights
  pdl_wait();               // launched as a programmatic dependent of the split kernel
  const int64_t bh = blockIdx.x;  // b·H + h
  const int lane = threadIdx.x & 31;
  const float2* ml = reinterpret_cast<const float2*>(p.ml_partial + bh * slots * 2);
  const float4* o = reinterpret_cast<const float4*>(p.o_partial + bh * slots * kD);
  decode_combine::combine_head(
      slots, [ml](int64_t i) { return ml[i]; },
      [o, lane](int64_t i) { return o[i * (kD / 4) + lane]; }, p.out + bh * kD);
}

template <int SPLITS, KvCacheDtype DT>
Status launch_split_dtype(const SparseDecodeParams& p, dim3 grid, CUstream_st* stream) {
  constexpr int kSmem = static_cast<int>(sizeof(Smem<SPLITS>));
  constexpr auto kernel = sparse_decode_split_kernel<SPLITS, DT>;
  M3_CUDA_RETURN_IF_ERROR(allow_dynamic_smem_once<kernel>(kSmem));
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, kernel, grid, dim3(kThreads), kSmem, stream, p));
  return Status::ok();
}

template <int SPLITS>
Status launch_split(const SparseDecodeParams& p, dim3 grid, CUstream_st* stream) {
  switch (p.cache.dtype) {
    case KvCacheDtype::kFp8E4M3:
      return launch_split_dtype<SPLITS, KvCacheDtype::kFp8E4M3>(p, grid, stream);
    case KvCacheDtype::kFp4E2M1:
      return launch_split_dtype<SPLITS, KvCacheDtype::kFp4E2M1>(p, grid, stream);
    default:
      return launch_split_dtype<SPLITS, KvCacheDtype::kBF16>(p, grid, stream);
  }
}

int sm_count() {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 1;
    }
    return n;
  }();
  return sms;
}

}  // namespace

bool sparse_decode_clusters(const SparseDecodeParams& p) {
  if (!p.mma || p.force_key_splits || !(p.cluster_combine || p.force_cluster_combine))
    return false;
  const int64_t ctas = p.top_k * p.cache.num_kv_heads * p.batch;
  return (p.force_cluster_combine || ctas <= sm_count()) && sparse_decode_mma_cluster_fits(p);
}

Status launch_sparse_decode(const SparseDecodeParams& p, CUstream_st* stream) {
  if (p.batch == 0) return Status::ok();
  const KvCacheView& c = p.cache;
  if (c.head_dim != kD || c.page_size != kS || c.num_kv_heads * kGroup != p.num_heads ||
      p.top_k <= 0 || p.top_k > 65535 || p.batch > 65535)
    return invalid_argument("[cuda.sparse_decode] needs D = 128, page 128, 16 query heads per KV "
                            "head, top_k in [1, 65535] (dense prefill rows select every block), "
                            "batch <= 65535; got D " + std::to_string(c.head_dim) +
                            ", page " + std::to_string(c.page_size) + ", H " +
                            std::to_string(p.num_heads) + ", Hkv " +
                            std::to_string(c.num_kv_heads));
  if (p.selected == nullptr && p.block_scores == nullptr && p.max_blocks > p.top_k)
    return invalid_argument("[cuda.sparse_decode] no selection (every block) needs max_blocks <= "
                            "top_k; got " + std::to_string(p.max_blocks) + " > " +
                            std::to_string(p.top_k));
  const auto misaligned = [](const void* ptr, uintptr_t a) {
    return (reinterpret_cast<uintptr_t>(ptr) & (a - 1)) != 0;
  };
  if (misaligned(p.q, 16) || misaligned(c.k, 16) || misaligned(c.v, 16) ||
      misaligned(p.o_partial, 16) || misaligned(p.ml_partial, 8))
    return invalid_argument("[cuda.sparse_decode] q, cache.k, cache.v and o_partial must be "
                            "16-byte aligned, ml_partial 8-byte aligned (16-byte loads)");
  if (c.quantised()) {
    if (const char* why = kv_quant_view_problem(c, true, false))
      return invalid_argument(std::string("[cuda.sparse_decode] ") + why);
  }
  // With mma, one CTA per selected block on the tensor cores at every batch: at batch 1 (64
  // CTAs) it takes 6.5-6.9 us with its combine against 8.8-9.0 us for 4 key splits on FMAs (256
  // CTAs, 4x the partial states to combine; H200, graph-timed, 1K-32K). Without: key splits up
  // to max_key_splits (the partial buffers' capacity), while the grid stays within about one
  // wave: 4 CTAs per SM (a 4-split CTA holds 27 KB of shared memory and a 2-split one 46 KB, so
  // 4+ of either fit an SM). Batch 1 (64 blocks · groups): 4 splits, 256 CTAs; batch 2: 4
  // splits, 512; batch 4: 2 splits, 512; batch 8: none, 512.
  const int sms = sm_count();
  int splits = 1;
  const int64_t ctas = p.top_k * c.num_kv_heads * p.batch;
  if (p.force_key_splits) {
    if (p.max_key_splits != 1 && p.max_key_splits != 2 && p.max_key_splits != 4)
      return invalid_argument("[cuda.sparse_decode] key splits must be 1, 2 or 4");
    splits = static_cast<int>(p.max_key_splits);
  } else if (p.mma) {
    splits = 1;
  } else if (p.max_key_splits >= 4 && ctas * 4 <= 4 * sms) {
    splits = 4;
  } else if (p.max_key_splits >= 2 && ctas * 2 <= 4 * sms) {
    splits = 2;
  }
  const bool clusters = splits == 1 && sparse_decode_clusters(p);
  if (p.block_scores != nullptr && (!clusters || p.max_blocks > kClusterSelectMax))
    return invalid_argument("[cuda.sparse_decode] block_scores need the clustered split kernel "
                            "(sparse_decode_clusters) and max_blocks <= 1024, got max_blocks " +
                            std::to_string(p.max_blocks));
  if (clusters) return launch_sparse_decode_mma_cluster(p, stream);  // merges: no combine
  dim3 grid(static_cast<unsigned>(p.top_k * splits), static_cast<unsigned>(c.num_kv_heads),
            static_cast<unsigned>(p.batch));
  if (splits == 4) {
    M3_RETURN_IF_ERROR(launch_split<4>(p, grid, stream));
  } else if (splits == 2) {
    M3_RETURN_IF_ERROR(launch_split<2>(p, grid, stream));
  } else if (p.mma) {
    M3_RETURN_IF_ERROR(launch_sparse_decode_mma(p, stream));
  } else {
    M3_RETURN_IF_ERROR(launch_split<1>(p, grid, stream));
  }
  // Programmatic dependent launch: the combine's launch and CTA start overlap the split
  // kernel's tail (it reads nothing before pdl_wait()).
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.dependent_launch, sparse_decode_combine_kernel,
                                        dim3(static_cast<unsigned>(p.batch * p.num_heads)),
                                        dim3(kThreads), 0, stream, p, p.top_k * splits));
  return Status::ok();
}

}  // namespace m3::cuda
