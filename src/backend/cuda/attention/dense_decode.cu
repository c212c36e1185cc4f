// Dense paged decode attention split over the context (dense_decode.h). A CTA of 128 threads
// serves the 16 query heads of one KV group of one sequence over a contiguous run of blocks: per
// block it stages the group's 128 K and V rows in shared memory (every load of a thread issued
// before the first store), thread s scores key s for all 16 heads, and the block's maxima update
// the running maxima; the P·V accumulators (thread (lane, warp) owns dims 4·lane .. 4·lane+3 of
// heads 4·warp .. 4·warp+3) are rescaled by exp(m_old - m_new) before the block's keys are added.
// A quantised cache (fp8_e4m3 / fp4_e2m1) is dequantised on load into the same bf16 tiles, exactly
// (kv/kv_load.cuh): the output is the bf16 kernel's on a bf16 cache of the dequantised values.
#include "backend/cuda/attention/dense_decode.h"

#include <algorithm>
#include <string>

#include "backend/cuda/attention/decode_combine.cuh"
#include "backend/cuda/kv/kv_load.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/dynamic_smem.cuh"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/reduce.cuh"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kD = 128, kGroup = 16, kThreads = 128, kWarps = kThreads / 32;
// 32-bit words per K row in shared memory: 64 + 4 keeps rows 16-byte aligned, and the 8 lanes of
// a quarter-warp reading rows s .. s+7 at the same column hit banks 4s + c: conflict-free.
constexpr int kKPitch = kD / 2 + 4;

struct Smem {
  uint32_t k[kS][kKPitch];  // bf16 pairs
  uint32_t v[kS][kD / 2];   // bf16 pairs, read along D
  float q[kGroup][kD];
  float pt[kS][kGroup];     // exp(score - running max), key-major
  float red[kWarps][kGroup];
  float m[kGroup], l[kGroup], alpha[kGroup];  // running max, running sum, this block's rescale
};

__device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// DT: the cache's dtype (kBF16, or fp8_e4m3 / fp4_e2m1 through kv_fetch8 / kv_dequant8_bf16).
template <KvCacheDtype DT>
__global__ void __launch_bounds__(kThreads) dense_decode_split_kernel(DenseDecodeParams p,
                                                                      int64_t splits) {
  constexpr bool kQuant = DT != KvCacheDtype::kBF16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int64_t split = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const KvCacheView& c = p.cache;
  const int64_t hkv = c.num_kv_heads;
  const int64_t pos = p.positions[b];  // a step input: read before the wait
  pdl_wait();
  pdl_launch_dependents();
  // This split's blocks: the row's qb + 1 blocks cut into `splits` contiguous runs.
  const int64_t nblk = pos < 0 ? 0 : (pos / kS + 1 < p.max_blocks ? pos / kS + 1 : p.max_blocks);
  const int64_t per = (nblk + splits - 1) / splits;
  const int64_t b0 = split * per, b1 = b0 + per < nblk ? b0 + per : nblk;
  const int64_t row = b * p.max_blocks;
  {
    const uint4* qg = reinterpret_cast<const uint4*>(p.q + (b * p.num_heads + g * kGroup) * kD);
#pragma unroll
    for (int j = 0; j < kGroup * kD / 8 / kThreads; ++j) {
      const uint4 w = __ldg(qg + tid + j * kThreads);
      const int i = (tid + j * kThreads) * 8;
      float* dst = &sm.q[i / kD][i % kD];
      *reinterpret_cast<float4*>(dst) = make_float4(lo(w.x), hi(w.x), lo(w.y), hi(w.y));
      *reinterpret_cast<float4*>(dst + 4) = make_float4(lo(w.z), hi(w.z), lo(w.w), hi(w.w));
    }
  }
  if (tid < kGroup) {
    sm.m[tid] = -INFINITY;
    sm.l[tid] = 0.0f;
  }
  float a[4][4] = {};  // unnormalised P·V of heads 4·warp + j, dims 4·lane + e
  const int64_t row_stride = hkv * kD / 8;  // uint4 per token row
  constexpr int kPieces = kS * (kD / 8) / kThreads;  // 16-byte K (and V) loads per thread: 16
  constexpr int kBatch = 8;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t page = p.block_tables[row + blk];
    if (page < 0 || page >= c.num_pages) continue;  // uniform over the CTA
    const int64_t key0 = blk * kS;
    __syncthreads();  // the previous block's K / V / pt reads are done (and q, m, l are set)
    if constexpr (!kQuant) {
      const uint4* kg = reinterpret_cast<const uint4*>(c.k + (page * kS * hkv + g) * kD);
      const uint4* vg = reinterpret_cast<const uint4*>(c.v + (page * kS * hkv + g) * kD);
#pragma unroll
      for (int j0 = 0; j0 < kPieces; j0 += kBatch) {
        uint4 kr[kBatch], vr[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int i = tid + (j0 + j) * kThreads, s = i / (kD / 8), piece = i % (kD / 8);
          kr[j] = __ldg(kg + s * row_stride + piece);
          // V rows past the position are zeroed: an unwritten page tail may hold NaN patterns.
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
      // All 16 K and 16 V fetches of the thread (a quarter or half of the bf16 bytes) in flight
      // before the first dequantisation.
      const float kscale = kv_page_scale(c.kq, page, hkv, g);
      const float vscale = kv_page_scale(c.vq, page, hkv, g);
      KvRaw8 kraw[kPieces], vraw[kPieces];
#pragma unroll
      for (int j = 0; j < kPieces; ++j) {
        const int i = tid + j * kThreads, s = i / (kD / 8), piece = i % (kD / 8);
        const int64_t r = (page * kS + s) * hkv + g;
        kraw[j] = kv_fetch8<DT>(c.kq, r, kD, piece * 8);
        vraw[j] = key0 + s <= pos ? kv_fetch8<DT>(c.vq, r, kD, piece * 8) : KvRaw8{};
      }
#pragma unroll
      for (int j = 0; j < kPieces; ++j) {
        const int i = tid + j * kThreads, s = i / (kD / 8), piece = i % (kD / 8);
        *reinterpret_cast<uint4*>(&sm.k[s][piece * 4]) = kv_dequant8_bf16<DT>(kraw[j], kscale);
        // V rows past the position are zeroed, as above.
        *reinterpret_cast<uint4*>(&sm.v[s][piece * 4]) =
            key0 + s <= pos ? kv_dequant8_bf16<DT>(vraw[j], vscale) : make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();
    // Scores: thread s = key s for the 16 heads.
    const int s = tid;
    float acc[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) acc[h] = 0.0f;
#pragma unroll 2
    for (int d8 = 0; d8 < kD / 8; ++d8) {
      const uint4 kw = *reinterpret_cast<const uint4*>(&sm.k[s][d8 * 4]);
      const float kf[8] = {lo(kw.x), hi(kw.x), lo(kw.y), hi(kw.y),
                           lo(kw.z), hi(kw.z), lo(kw.w), hi(kw.w)};
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        const float4 qa = *reinterpret_cast<const float4*>(&sm.q[h][d8 * 8]);
        const float4 qc = *reinterpret_cast<const float4*>(&sm.q[h][d8 * 8 + 4]);
        float x = acc[h];
        x = fmaf(qa.x, kf[0], x), x = fmaf(qa.y, kf[1], x), x = fmaf(qa.z, kf[2], x);
        x = fmaf(qa.w, kf[3], x), x = fmaf(qc.x, kf[4], x), x = fmaf(qc.y, kf[5], x);
        x = fmaf(qc.z, kf[6], x), x = fmaf(qc.w, kf[7], x);
        acc[h] = x;
      }
    }
    // The block's maxima (its first key, key0 <= pos, is valid: finite), the new running maxima.
    const bool valid = key0 + s <= pos;
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      acc[h] = valid ? acc[h] * p.scale : -INFINITY;
      const float m = warp_max(acc[h]);
      if (lane == 0) sm.red[warp][h] = m;
    }
    __syncthreads();
    float m_new[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      float m = sm.red[0][h];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) m = fmaxf(m, sm.red[w][h]);
      m_new[h] = fmaxf(m, sm.m[h]);
      acc[h] = expf(acc[h] - m_new[h]);  // invalid keys: exp(-inf) = 0
    }
#pragma unroll
    for (int h = 0; h < kGroup; h += 4)
      *reinterpret_cast<float4*>(&sm.pt[s][h]) =
          make_float4(acc[h], acc[h + 1], acc[h + 2], acc[h + 3]);
    __syncthreads();  // every read of red (maxima) and of the old m done
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const float l = warp_sum(acc[h]);
      if (lane == 0) sm.red[warp][h] = l;
    }
    __syncthreads();
    if (tid < kGroup) {
      float l = sm.red[0][tid];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) l += sm.red[w][tid];
      float mn = m_new[0];
#pragma unroll
      for (int h = 1; h < kGroup; ++h) mn = tid == h ? m_new[h] : mn;
      const float alpha = expf(sm.m[tid] - mn);  // the first block: exp(-inf) = 0
      sm.alpha[tid] = alpha;
      sm.l[tid] = fmaf(sm.l[tid], alpha, l);
      sm.m[tid] = mn;
    }
    __syncthreads();
    // P·V of the block on the rescaled accumulators.
    const int hq = warp * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float al = sm.alpha[hq + j];
#pragma unroll
      for (int e = 0; e < 4; ++e) a[j][e] *= al;
    }
#pragma unroll 4
    for (int t = 0; t < kS; ++t) {
      const uint2 vw = *reinterpret_cast<const uint2*>(&sm.v[t][lane * 2]);
      const float vf[4] = {lo(vw.x), hi(vw.x), lo(vw.y), hi(vw.y)};
      const float4 pw = *reinterpret_cast<const float4*>(&sm.pt[t][hq]);
      const float pj[4] = {pw.x, pw.y, pw.z, pw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[j][e] = fmaf(pj[j], vf[e], a[j][e]);
    }
  }
  __syncthreads();  // m, l final (also for a split without blocks)
  // This split's state of head h of the group: (max, sum) at ml_partial + state·2, o at
  // o_partial + state·kD, state = (b·H + g·16 + h)·max_splits + split.
  const int64_t slots = p.max_splits;
  const int64_t state0 = (b * p.num_heads + g * kGroup) * slots + split;
  if (tid < kGroup) {
    p.ml_partial[(state0 + tid * slots) * 2] = sm.m[tid];
    p.ml_partial[(state0 + tid * slots) * 2 + 1] = sm.l[tid];
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    *reinterpret_cast<float4*>(p.o_partial + (state0 + (warp * 4 + j) * slots) * kD + 4 * lane) =
        make_float4(a[j][0], a[j][1], a[j][2], a[j][3]);
}

// One CTA per (head, sequence) merges its `splits` partial states (of max_splits slots per head).
__global__ void __launch_bounds__(kThreads) dense_decode_combine_kernel(DenseDecodeParams p,
                                                                        int64_t splits) {
  pdl_launch_dependents();  // a following PDL GEMV (o_proj) may start streaming its weights
  pdl_wait();
  const int64_t bh = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const float2* ml = reinterpret_cast<const float2*>(p.ml_partial + bh * p.max_splits * 2);
  const float4* o = reinterpret_cast<const float4*>(p.o_partial + bh * p.max_splits * kD);
  decode_combine::combine_head(
      splits, [ml](int64_t i) { return ml[i]; },
      [o, lane](int64_t i) { return o[i * (kD / 4) + lane]; }, p.out + bh * kD);
}

template <KvCacheDtype DT>
Status launch_split(const DenseDecodeParams& p, dim3 grid, int64_t splits, CUstream_st* stream) {
  constexpr int kSmem = static_cast<int>(sizeof(Smem));
  constexpr auto kernel = dense_decode_split_kernel<DT>;
  M3_CUDA_RETURN_IF_ERROR(allow_dynamic_smem_once<kernel>(kSmem));
  M3_CUDA_RETURN_IF_ERROR(
      launch_kernel(p.pdl, kernel, grid, dim3(kThreads), kSmem, stream, p, splits));
  return Status::ok();
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

int64_t dense_decode_splits(int64_t batch, int64_t num_kv_heads, int64_t max_blocks,
                            int64_t max_splits) {
  // An 83-KB CTA: two per SM, so two waves are 4 CTAs per SM.
  const int64_t per_row = std::max<int64_t>(1, batch * num_kv_heads);
  const int64_t want = (4 * int64_t{sm_count()} + per_row - 1) / per_row;
  return std::clamp<int64_t>(want, 1, std::max<int64_t>(1, std::min(max_blocks, max_splits)));
}

Status launch_dense_decode(const DenseDecodeParams& p, CUstream_st* stream) {
  if (p.batch == 0) return Status::ok();
  const KvCacheView& c = p.cache;
  if (c.head_dim != kD || c.page_size != kS || c.num_kv_heads * kGroup != p.num_heads ||
      p.batch > 65535 || c.num_kv_heads > 65535 || p.max_blocks < 1 || p.max_splits < 1 ||
      p.max_splits > 65535)
    return invalid_argument("[cuda.dense_decode] needs D = 128, page 128, 16 query heads per KV "
                            "head, batch <= 65535, max_blocks >= 1, max_splits in [1, 65535]; got "
                            "D " + std::to_string(c.head_dim) + ", page " +
                            std::to_string(c.page_size) + ", H " + std::to_string(p.num_heads) +
                            ", Hkv " + std::to_string(c.num_kv_heads) + ", max_blocks " +
                            std::to_string(p.max_blocks) + ", max_splits " +
                            std::to_string(p.max_splits));
  const auto misaligned = [](const void* ptr, uintptr_t a) {
    return (reinterpret_cast<uintptr_t>(ptr) & (a - 1)) != 0;
  };
  if (misaligned(p.q, 16) || misaligned(c.k, 16) || misaligned(c.v, 16) ||
      misaligned(p.o_partial, 16) || misaligned(p.ml_partial, 8))
    return invalid_argument("[cuda.dense_decode] q, cache.k, cache.v and o_partial must be "
                            "16-byte aligned, ml_partial 8-byte aligned (16-byte loads)");
  if (c.quantised()) {
    if (const char* why = kv_quant_view_problem(c, true, false))
      return invalid_argument(std::string("[cuda.dense_decode] ") + why);
  }
  const int64_t splits = dense_decode_splits(p.batch, c.num_kv_heads, p.max_blocks, p.max_splits);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(c.num_kv_heads),
                  static_cast<unsigned>(p.batch));
  switch (c.dtype) {
    case KvCacheDtype::kFp8E4M3:
      M3_RETURN_IF_ERROR(launch_split<KvCacheDtype::kFp8E4M3>(p, grid, splits, stream));
      break;
    case KvCacheDtype::kFp4E2M1:
      M3_RETURN_IF_ERROR(launch_split<KvCacheDtype::kFp4E2M1>(p, grid, splits, stream));
      break;
    default:
      M3_RETURN_IF_ERROR(launch_split<KvCacheDtype::kBF16>(p, grid, splits, stream));
      break;
  }
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(true, dense_decode_combine_kernel,
                                        dim3(static_cast<unsigned>(p.batch * p.num_heads)),
                                        dim3(kThreads), 0, stream, p, splits));
  return Status::ok();
}

}  // namespace m3::cuda
