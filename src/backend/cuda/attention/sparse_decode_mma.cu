// Block-sparse paged decode attention on the tensor cores (mma.sync m16n8k16, bf16 in, float32
// accumulate): the split kernel for one CTA per (selected block, KV group, sequence), the case
// of batches >= 8 where the grid fills the GPU without key splits (sparse_decode.cu launches it
// when SparseDecodeParams::mma is set; its combine merges the partial states unchanged).
//
// Why (measured on the H200): the float32-FMA split kernel does 2 x 16 x 128 x 128
// FMAs per CTA for 64 KB of keys and values; at batch 32-128 it ran at 16-18 TFLOP/s and 1.3-1.4
// TB/s (B=128, 4K: 466 us per layer for 673 MB), bound by its arithmetic and shared-memory loads,
// not by HBM. Here the same work is 32 + 32 mma per warp.
//
// One CTA of 4 warps; warp w owns keys 32w .. 32w + 31 of the block. Its K and V rows (256 B
// each) go to shared memory by cp.async (K and V as separate groups: the scores start while V is
// in flight); S = Q·K^T (rows = the group's 16 query heads, 4 key tiles x 8 dim steps, K
// fragments by ldmatrix), keys past the query's position masked, the block's maximum per head
// across the 4 warps, P = exp(S - m) rounded to bf16 straight from the accumulators into the A
// fragments of O = P·V (V fragments by ldmatrix.trans). The sum l of each head uses the same
// rounded P, so the combined output is the exact weighted mean of V with every weight perturbed
// by at most 2^-8 relatively (what sparse_prefill_mma.cu does; the tests add 2^-7·Σ w|v - o|).
// The 4 warps' O fragments are added in warp order through shared memory (deterministic).
// Fragment layouts: mma_bf16.cuh.
//
// A quantised cache (fp8_e4m3 / fp4_e2m1) fills the same bf16 tiles: each lane fetches its K and
// V pieces into registers at once, dequantises the K pieces (exact: kv/kv_load.cuh) into sm.k
// before the scores and the V pieces into sm.v after them (their loads in flight under the
// scores, as the cp.async group of V is), so the output is the bf16 kernel's on a bf16 cache
// holding the dequantised values.
#include "backend/cuda/attention/sparse_decode_mma.h"

#include <cuda_bf16.h>

#include "backend/cuda/attention/decode_combine.cuh"
#include "backend/cuda/attention/mma_bf16.cuh"
#include "backend/cuda/indexer/block_rank.cuh"
#include "backend/cuda/kv/kv_load.cuh"
#include "backend/cuda/runtime/cluster.cuh"
#include "backend/cuda/runtime/cp_async.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/dynamic_smem.cuh"
#include "backend/cuda/runtime/pdl.cuh"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kD = 128, kGroup = 16, kWarps = 4, kThreads = 32 * kWarps;
constexpr int kWarpKeys = kS / kWarps;  // 32
// bf16 per K / V row in shared memory: 272 bytes, so the 8 rows of an ldmatrix hit banks 4r .. 4r
// + 3: conflict-free.
constexpr int kPitch = kD + 8;
constexpr int kOPitch = kD + 8;  // floats per head row of a warp's O in the cross-warp sum

template <bool CLUSTER>
struct Smem {
  uint16_t k[kS][kPitch];  // reused for the warps' O fragments once the scores are done
  uint16_t v[kS][kPitch];
  float red_m[kWarps][kGroup];
  float red_l[kWarps][kGroup];
  // CLUSTER: what the cluster's CTAs (slot s) push into the CTA of head h: its partial state
  // for that head (rows s of recv_o, recv_ml).
  float recv_o[CLUSTER ? kGroup : 1][kD];
  float2 recv_ml[CLUSTER ? kGroup : 1];
  // CLUSTER with block_scores: the row's candidate scores, and the selection (slot -> block)
  // that the cluster's CTAs push into every CTA.
  float cand[CLUSTER ? kClusterSelectMax : 1];
  int32_t sel[CLUSTER ? kGroup : 1];
};
static_assert(sizeof(uint16_t) * kS * kPitch >= sizeof(float) * kWarps * kGroup * kOPitch,
              "the warps' O fragments fit where K was");
static_assert(decode_combine::kD == kD && decode_combine::kThreads == kThreads,
              "one CTA of this kernel merges one head with decode_combine::combine_head");

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Two floats rounded to bf16 (nearest even) as one A register; *lo_r / *hi_r get the rounded
// values back as floats (for the sums l).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi, float* lo_r, float* hi_r) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  *lo_r = __low2float(v);
  *hi_r = __high2float(v);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The indexer's top-k of row (b, KV group g) computed by the cluster (SparseDecodeParams::
// block_scores) with the top-k kernel's rule (indexer/block_rank.cuh): CTA `slot` ranks
// candidates slot, slot + kGroup, ... against all n; a candidate of rank r < min(top_k, n) is
// pushed into sel[r] of every CTA of the cluster, the slots from min(top_k, n) on are -1. Waits
// for phase 0 (every CTA started) before its pushes, then one more phase makes them visible.
template <typename SM>
__device__ __forceinline__ void select_in_cluster(const SparseDecodeParams& p, SM& sm, int64_t b,
                                                  int g, int slot, int64_t pos) {
  const int tid = threadIdx.x;
  const int64_t qb = min(pos / kS, p.max_blocks - 1);
  const int64_t n = qb + 1, k = min(p.top_k, n);
  const float* sc = p.block_scores + (b * p.cache.num_kv_heads + g) * p.max_blocks;
  const int64_t local0 = block_rank::local_first(qb, p.local_blocks);
  for (int64_t i = tid; i < n; i += kThreads)
    sm.cand[i] = block_rank::candidate_key(sc, i, local0, p.init_blocks);
  if (tid >= k && tid < kGroup) sm.sel[tid] = -1;  // never pushed: ranks < k only
  __syncthreads();
  // This CTA ranks candidates slot, slot + kGroup, ... (all in one pass).
  const int m = n > slot ? static_cast<int>((n - slot + kGroup - 1) / kGroup) : 0;
  const int P = block_rank::lanes_per_candidate(m, kThreads);
  const int part = tid % P, c = tid / P;
  const bool live = c < m;
  const int64_t i = slot + int64_t{kGroup} * c;
  const float v = live ? sm.cand[i] : 0.0f;
  const int rank = block_rank::rank_of(sm.cand, n, i, v, live, part, P);
  cluster_wait();  // phase 0: every CTA has started
  if (live && part == 0 && rank < k) {
    const float id = __int_as_float(block_rank::selected_id(v, i));
    for (int r = 0; r < kGroup; ++r)
      st_shared_cluster(reinterpret_cast<const float*>(&sm.sel[rank]), r, id);
  }
  cluster_arrive_release();
  cluster_wait();
}

// Phase 1 of the cluster barrier (every CTA's pushes are visible), then CTA `slot` merges head
// g·kGroup + slot of sequence b from the kGroup states it received, in slot order.
template <typename SM>
__device__ __forceinline__ void merge_in_cluster(const SparseDecodeParams& p, SM& sm, int64_t b,
                                                 int g, int slot) {
  cluster_arrive_release();
  cluster_wait();
  const int lane = threadIdx.x & 31;
  decode_combine::combine_head(
      kGroup, [&sm](int64_t i) { return sm.recv_ml[i]; },
      [&sm, lane](int64_t i) { return *reinterpret_cast<const float4*>(&sm.recv_o[i][4 * lane]); },
      p.out + (b * p.num_heads + g * kGroup + slot) * kD);
}

// CLUSTER (top_k == kGroup): the top_k CTAs of a (KV group, sequence) form one thread-block
// cluster; CTA s pushes its partial state of head h into CTA h's shared memory (distributed
// shared memory) instead of global memory, and after one cluster barrier CTA h merges head h
// with the combine kernel's code (decode_combine.cuh): the same bits, without the combine's
// launch and its round trip through memory. DT: the cache's dtype (kBF16 by cp.async; fp8_e4m3 /
// fp4_e2m1 by register fetches and kv_dequant8_bf16).
template <bool CLUSTER, KvCacheDtype DT>
__global__ void __launch_bounds__(kThreads) sparse_decode_mma_kernel(SparseDecodeParams p) {
  constexpr bool kQuant = DT != KvCacheDtype::kBF16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<CLUSTER>& sm = *reinterpret_cast<Smem<CLUSTER>*>(smem_raw);
  // Phase 0 of the cluster barrier: this CTA has started, so its shared memory may be written
  // by the others once they have waited for the phase.
  if constexpr (CLUSTER) cluster_arrive_relaxed();
  if (CLUSTER && p.dependents_at_start) pdl_launch_dependents();
  const int slot = blockIdx.x, g = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gi = lane >> 2, ci = lane & 3;
  const KvCacheView& c = p.cache;
  const int64_t hkv = c.num_kv_heads;
  const int64_t pos = p.positions[b];  // an input of the step: read before the wait
  pdl_wait();
  pdl_launch_dependents();  // not before the wait unless dependents_at_start: see
                            // sparse_decode_split_kernel
  // The group's Q fragments for the 8 dim steps (rows = heads), requested before the selection
  // -> block table chain below.
  const uint32_t* qrow =
      reinterpret_cast<const uint32_t*>(p.q + (b * p.num_heads + g * kGroup) * kD);
  uint32_t qa[8][4];
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const int d2 = ks * 8 + ci;  // (16 ks + 2c) / 2: 32-bit pairs
    qa[ks][0] = __ldg(qrow + gi * (kD / 2) + d2);
    qa[ks][1] = __ldg(qrow + (gi + 8) * (kD / 2) + d2);
    qa[ks][2] = __ldg(qrow + gi * (kD / 2) + d2 + 4);
    qa[ks][3] = __ldg(qrow + (gi + 8) * (kD / 2) + d2 + 4);
  }
  const int64_t qb = pos / kS;
  // The selection and skip rules of the FMA kernel (sparse_decode.cu) with one split.
  const int32_t* sel = p.selected != nullptr ? p.selected + (b * hkv + g) * p.top_k : nullptr;
  bool phase0_waited = false;  // CLUSTER: phase 0 (every CTA started) is waited for once
  if constexpr (CLUSTER) {
    if (p.block_scores != nullptr) {
      select_in_cluster(p, sm, b, g, slot, pos);
      sel = sm.sel;
      phase0_waited = true;
    }
  }
  const int32_t blk = sel != nullptr ? sel[slot] : slot;
  const int64_t key0 = int64_t{blk} * kS;
  bool skip = blk < 0 || blk > qb;
  if (sel != nullptr)
    for (int i = 0; i < slot; ++i) skip |= sel[i] == blk;
  const int64_t row = b * (p.block_table_stride < 0 ? p.max_blocks : p.block_table_stride);
  const int64_t page = skip ? -1 : p.block_tables[row + blk];
  const int64_t slots = p.top_k;
  const int64_t state = (b * p.num_heads + g * kGroup) * slots + slot;
  if (skip || page < 0 || page >= c.num_pages) {
    if constexpr (CLUSTER) {
      if (!phase0_waited) cluster_wait();  // phase 0
      if (tid < kGroup)
        st_shared_cluster_u2(&sm.recv_ml[slot], tid,
                             make_uint2(__float_as_uint(-INFINITY), __float_as_uint(0.0f)));
      merge_in_cluster(p, sm, b, g, slot);
      return;
    }
    if (tid < kGroup) {
      p.ml_partial[(state + tid * slots) * 2] = -INFINITY;
      p.ml_partial[(state + tid * slots) * 2 + 1] = 0.0f;
    }
    return;
  }

  // This warp's 32 K rows, then its 32 V rows (V rows past the position zero-filled: a page's
  // unwritten tail may hold NaN bit patterns, and 0 · NaN = NaN).
  const int kw0 = warp * kWarpKeys;
  constexpr int kLanePieces = kWarpKeys * (kD / 8) / 32;  // 16 of K, 16 of V
  [[maybe_unused]] KvRaw8 vraw[kLanePieces];  // quantised: the V pieces until after the scores
  [[maybe_unused]] float vscale = 0.0f;
  if constexpr (kQuant) {
    const float kscale = kv_page_scale(c.kq, page, hkv, g);
    vscale = kv_page_scale(c.vq, page, hkv, g);
    KvRaw8 kraw[kLanePieces];
#pragma unroll
    for (int j = 0; j < kLanePieces; ++j) {
      const int i = lane + 32 * j, s = kw0 + i / (kD / 8), piece = i % (kD / 8);
      kraw[j] = kv_fetch8<DT>(c.kq, (page * kS + s) * hkv + g, kD, piece * 8);
    }
#pragma unroll
    for (int j = 0; j < kLanePieces; ++j) {
      const int i = lane + 32 * j, s = kw0 + i / (kD / 8), piece = i % (kD / 8);
      vraw[j] = key0 + s <= pos ? kv_fetch8<DT>(c.vq, (page * kS + s) * hkv + g, kD, piece * 8)
                                : KvRaw8{};
    }
#pragma unroll
    for (int j = 0; j < kLanePieces; ++j) {
      const int i = lane + 32 * j, s = kw0 + i / (kD / 8), piece = i % (kD / 8);
      *reinterpret_cast<uint4*>(&sm.k[s][piece * 8]) = kv_dequant8_bf16<DT>(kraw[j], kscale);
    }
    __syncwarp();  // every lane's K pieces stored
  } else {
    const int64_t row_stride = hkv * kD;  // bf16 per token row of the page
    const uint16_t* kg = c.k + (page * kS * hkv + g) * kD;
    const uint16_t* vg = c.v + (page * kS * hkv + g) * kD;
#pragma unroll
    for (int j = 0; j < kLanePieces; ++j) {
      const int i = lane + 32 * j, s = kw0 + i / (kD / 8), piece = i % (kD / 8);
      cp_async16(smem_u32(&sm.k[s][piece * 8]), kg + s * row_stride + piece * 8, 16);
    }
    cp_async_commit();
#pragma unroll
    for (int j = 0; j < kLanePieces; ++j) {
      const int i = lane + 32 * j, s = kw0 + i / (kD / 8), piece = i % (kD / 8);
      const bool in = key0 + s <= pos;
      cp_async16(smem_u32(&sm.v[s][piece * 8]), vg + (in ? s * row_stride + piece * 8 : 0),
                 in ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this lane's K copies landed
    __syncwarp();        // ... and every lane's
  }

  // S = Q·K^T for the warp's 4 key tiles: one ldmatrix.x4 gives b0, b1 of two dim steps.
  float sacc[4][4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sacc[nt][e] = 0.0f;
    const int n0 = kw0 + 8 * nt;
#pragma unroll
    for (int ks = 0; ks < 8; ks += 2) {
      uint32_t r[4];
      ldsm_x4(smem_u32(&sm.k[n0 + (lane & 7)][16 * ks + 8 * (lane >> 3)]), r);
      mma_bf16(sacc[nt], qa[ks], r[0], r[1]);
      mma_bf16(sacc[nt], qa[ks + 1], r[2], r[3]);
    }
  }
  // Scale, mask keys past the position, and the maximum per head (rows g and g + 8) over the
  // block: the lane's 8 keys, its quad, then the 4 warps. The block's first key is valid (blk <=
  // qb), so the maximum is finite.
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = kw0 + 8 * nt + 2 * ci + (e & 1);
      sacc[nt][e] = key0 + key <= pos ? sacc[nt][e] * p.scale : -INFINITY;
      mx[e >> 1] = fmaxf(mx[e >> 1], sacc[nt][e]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
  if (ci == 0) sm.red_m[warp][gi] = mx[0], sm.red_m[warp][gi + 8] = mx[1];
  __syncthreads();  // also: every warp is done with its K rows (the area is reused below)
  float m[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = sm.red_m[0][gi + 8 * h];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) m[h] = fmaxf(m[h], sm.red_m[w][gi + 8 * h]);
  }
  // P = exp(S - m) in bf16, as the A fragments of the warp's two 16-key steps; l from the same
  // rounded values (masked keys: exp(-inf) = 0).
  uint32_t pa[2][4];
  float l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float* s = sacc[2 * j + half];
      float r0, r1, r2, r3;
      pa[j][2 * half] = pack_bf16(expf(s[0] - m[0]), expf(s[1] - m[0]), &r0, &r1);
      pa[j][2 * half + 1] = pack_bf16(expf(s[2] - m[1]), expf(s[3] - m[1]), &r2, &r3);
      l[0] += r0 + r1;
      l[1] += r2 + r3;
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  if (ci == 0) sm.red_l[warp][gi] = l[0], sm.red_l[warp][gi + 8] = l[1];

  // O = P·V over the warp's 32 keys: one ldmatrix.x4.trans gives b0, b1 of two dim tiles.
  if constexpr (kQuant) {
#pragma unroll
    for (int j = 0; j < kLanePieces; ++j) {
      const int i = lane + 32 * j, s = kw0 + i / (kD / 8), piece = i % (kD / 8);
      *reinterpret_cast<uint4*>(&sm.v[s][piece * 8]) =
          key0 + s <= pos ? kv_dequant8_bf16<DT>(vraw[j], vscale) : make_uint4(0, 0, 0, 0);
    }
  } else {
    cp_async_wait<0>();
  }
  __syncwarp();
  float oacc[16][4];
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) oacc[nt][e] = 0.0f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int k0 = kw0 + 16 * j;
#pragma unroll
    for (int np = 0; np < 8; ++np) {
      uint32_t r[4];
      ldsm_x4_trans(
          smem_u32(&sm.v[k0 + (lane & 7) + 8 * ((lane >> 3) & 1)][16 * np + 8 * (lane >> 4)]),
          r);
      mma_bf16(oacc[2 * np], pa[j], r[0], r[1]);
      mma_bf16(oacc[2 * np + 1], pa[j], r[2], r[3]);
    }
  }
  // The warps' O added in warp order through shared memory (where K was), then stored with the
  // statistics: the partial state of this (slot, head) as the FMA kernel writes it.
  float* osum = reinterpret_cast<float*>(&sm.k[0][0]);  // [kWarps][kGroup][kOPitch]
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    const int d = 8 * nt + 2 * ci;
    *reinterpret_cast<float2*>(&osum[(warp * kGroup + gi) * kOPitch + d]) =
        make_float2(oacc[nt][0], oacc[nt][1]);
    *reinterpret_cast<float2*>(&osum[(warp * kGroup + gi + 8) * kOPitch + d]) =
        make_float2(oacc[nt][2], oacc[nt][3]);
  }
  __syncthreads();
  if constexpr (CLUSTER)
    if (!phase0_waited) cluster_wait();  // phase 0: every CTA of the cluster has started
#pragma unroll
  for (int i = tid; i < kGroup * kD / 4; i += kThreads) {
    const int h = i / (kD / 4), d = 4 * (i % (kD / 4));
    float4 o = *reinterpret_cast<const float4*>(&osum[h * kOPitch + d]);
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(&osum[(w * kGroup + h) * kOPitch + d]);
      o.x += x.x, o.y += x.y, o.z += x.z, o.w += x.w;
    }
    if constexpr (CLUSTER)
      st_shared_cluster_f4(&sm.recv_o[slot][d], h, o);
    else
      *reinterpret_cast<float4*>(p.o_partial + (state + h * slots) * kD + d) = o;
  }
  if (tid < kGroup) {
    float mm = sm.red_m[0][tid], ll = sm.red_l[0][tid];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) mm = fmaxf(mm, sm.red_m[w][tid]), ll += sm.red_l[w][tid];
    if constexpr (CLUSTER) {
      st_shared_cluster_u2(&sm.recv_ml[slot], tid,
                           make_uint2(__float_as_uint(mm), __float_as_uint(ll)));
    } else {
      p.ml_partial[(state + tid * slots) * 2] = mm;
      p.ml_partial[(state + tid * slots) * 2 + 1] = ll;
    }
  }
  if constexpr (CLUSTER) merge_in_cluster(p, sm, b, g, slot);
}

template <KvCacheDtype DT>
Status launch_split(const SparseDecodeParams& p, CUstream_st* stream) {
  constexpr int kSmem = static_cast<int>(sizeof(Smem<false>));
  constexpr auto kernel = sparse_decode_mma_kernel<false, DT>;
  M3_CUDA_RETURN_IF_ERROR(allow_dynamic_smem_once<kernel>(kSmem));
  const dim3 grid(static_cast<unsigned>(p.top_k), static_cast<unsigned>(p.cache.num_kv_heads),
                  static_cast<unsigned>(p.batch));
  M3_CUDA_RETURN_IF_ERROR(
      launch_kernel(p.pdl, kernel, grid, dim3(kThreads), kSmem, stream, p));
  return Status::ok();
}

// Once per process and dtype: whether the 16-CTA cluster (non-portable size) is schedulable.
template <KvCacheDtype DT>
bool cluster_schedulable() {
  static const bool schedulable = [] {
    constexpr int kSmem = static_cast<int>(sizeof(Smem<true>));
    auto* kernel = sparse_decode_mma_kernel<true, DT>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) !=
            cudaSuccess ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
            cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(kGroup, 1, 1);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmem;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kGroup;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return clusters > 0;
  }();
  return schedulable;
}

template <KvCacheDtype DT>
Status launch_cluster(const SparseDecodeParams& p, CUstream_st* stream) {
  constexpr int kSmem = static_cast<int>(sizeof(Smem<true>));
  const dim3 grid(static_cast<unsigned>(p.top_k), static_cast<unsigned>(p.cache.num_kv_heads),
                  static_cast<unsigned>(p.batch));
  constexpr auto kernel = sparse_decode_mma_kernel<true, DT>;
  M3_CUDA_RETURN_IF_ERROR(launch_cluster_kernel(p.pdl, kernel, grid, dim3(kThreads), kSmem,
                                                kGroup, stream, p));
  return Status::ok();
}

}  // namespace

// The launcher (sparse_decode.cu) has checked the cache: bf16, fp8_e4m3 or fp4_e2m1.
Status launch_sparse_decode_mma(const SparseDecodeParams& p, CUstream_st* stream) {
  switch (p.cache.dtype) {
    case KvCacheDtype::kFp8E4M3: return launch_split<KvCacheDtype::kFp8E4M3>(p, stream);
    case KvCacheDtype::kFp4E2M1: return launch_split<KvCacheDtype::kFp4E2M1>(p, stream);
    default: return launch_split<KvCacheDtype::kBF16>(p, stream);
  }
}

bool sparse_decode_mma_cluster_fits(const SparseDecodeParams& p) {
  if (p.top_k != kGroup) return false;
  switch (p.cache.dtype) {
    case KvCacheDtype::kFp8E4M3: return cluster_schedulable<KvCacheDtype::kFp8E4M3>();
    case KvCacheDtype::kFp4E2M1: return cluster_schedulable<KvCacheDtype::kFp4E2M1>();
    default: return cluster_schedulable<KvCacheDtype::kBF16>();
  }
}

Status launch_sparse_decode_mma_cluster(const SparseDecodeParams& p, CUstream_st* stream) {
  switch (p.cache.dtype) {
    case KvCacheDtype::kFp8E4M3: return launch_cluster<KvCacheDtype::kFp8E4M3>(p, stream);
    case KvCacheDtype::kFp4E2M1: return launch_cluster<KvCacheDtype::kFp4E2M1>(p, stream);
    default: return launch_cluster<KvCacheDtype::kBF16>(p, stream);
  }
}

}  // namespace m3::cuda
