// Tensor-core (mma.sync m16n8k16, bf16 in, float32 accumulate) block-sparse / dense causal paged
// attention for a prefill chunk (PrefillAttentionKernel::kTensorCore of launch_prefill_attention, see sparse_prefill.h).
//
// One warp owns one (token, KV group): its 16 query heads are exactly the 16 rows of the mma, so
// each K/V page row loaded serves all 16 heads. Per selected block (128 keys) the warp computes
// S = Q·K^T (8 k-steps x 8 key tiles, per half of 64 keys), masks keys past the token's
// position, updates the online-softmax state (running max m, sum l per head; float32), rounds
// P to bf16 and accumulates O += P·V (8 key steps x 16 dim tiles). Both l and O use the same bf16-rounded P,
// so the output is the exact weighted mean of V with weights perturbed by at most 2^-8
// relatively (the test's bound adds 2^-7·Σ w|v - o|). Fragments are loaded straight from the
// paged cache (L2-resident at prefill sizes): K as 32-bit pairs along D, V as 16-bit values.
// Four warps of a CTA take four consecutive tokens of the same group (shared L2 lines).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16): g = lane / 4, c = lane % 4;
//   A (16x16 row): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B (16x8 col):  b0 (k = 2c..2c+1, n = g), b1 (k = 2c+8.., n = g)
//   C (16x8):      c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/attention/mma_bf16.cuh"
#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kD = 128, kGroup = 16, kWarps = 4;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float bf16_round(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

struct MmaParams {
  const uint16_t* q;           // [T, H, D]
  KvCacheView cache;
  const int32_t* positions;    // [T]
  const int32_t* block_table;  // [num_blocks]
  const int32_t* selected;     // [T, Hkv, top_k] (sparse) or nullptr (dense: blocks 0..b_q)
  int64_t t, num_heads, num_blocks, top_k;
  float scale;
  uint16_t* out;               // [T, H, D]
};

__global__ void __launch_bounds__(kWarps * 32) prefill_attention_mma_kernel(MmaParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gi = lane >> 2, ci = lane & 3;
  const int64_t t = int64_t{blockIdx.x} * kWarps + warp;
  const int64_t grp = blockIdx.y;
  if (t >= p.t) return;
  const KvCacheView& c = p.cache;
  const int64_t hkv = c.num_kv_heads;
  const int64_t pos = p.positions[t];
  const int64_t qb = pos / kS;

  // Q fragments for the 8 k-steps (dims), rows = heads of the group.
  uint32_t qa[8][4];
  const uint16_t* qrow = p.q + (t * p.num_heads + grp * kGroup) * kD;
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const int d0 = ks * 16 + 2 * ci;
    qa[ks][0] = *reinterpret_cast<const uint32_t*>(qrow + gi * kD + d0);
    qa[ks][1] = *reinterpret_cast<const uint32_t*>(qrow + (gi + 8) * kD + d0);
    qa[ks][2] = *reinterpret_cast<const uint32_t*>(qrow + gi * kD + d0 + 8);
    qa[ks][3] = *reinterpret_cast<const uint32_t*>(qrow + (gi + 8) * kD + d0 + 8);
  }
  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // rows gi, gi + 8

  const int32_t* sel = p.selected != nullptr ? p.selected + (t * hkv + grp) * p.top_k : nullptr;
  const int64_t n_iter = sel != nullptr ? p.top_k : qb + 1;
  for (int64_t it = 0; it < n_iter; ++it) {
    int64_t blk;
    if (sel != nullptr) {
      blk = sel[it];
      bool skip = blk < 0 || blk > qb;
      for (int64_t j = 0; j < it && !skip; ++j) skip = sel[j] == blk;  // duplicates count once
      if (skip) continue;
    } else {
      blk = it;
    }
    if (blk >= p.num_blocks) continue;
    const int64_t page = p.block_table[blk];
    if (page < 0 || page >= c.num_pages) continue;
    const uint16_t* kbase = c.k + (page * kS * hkv + grp) * kD;  // key j row: + j·hkv·D
    const uint16_t* vbase = c.v + (page * kS * hkv + grp) * kD;
    const int64_t kstride = hkv * kD;

    // Two halves of 64 keys (registers: S of a half is 32 floats); a half entirely past the
    // token's position is skipped (the first half always holds key blk·S <= pos).
    for (int half = 0; half < 2; ++half) {
    const int64_t base = blk * kS + half * 64;
    if (base > pos) break;
    // S = Q·K^T for the 64 keys: 8 key tiles of 8.
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      const uint16_t* krow = kbase + (half * 64 + nt * 8 + gi) * kstride;
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const uint32_t b0 = __ldg(reinterpret_cast<const unsigned int*>(krow + ks * 16 + 2 * ci));
        const uint32_t b1 =
            __ldg(reinterpret_cast<const unsigned int*>(krow + ks * 16 + 8 + 2 * ci));
        mma_bf16(s[nt], qa[ks], b0, b1);
      }
    }
    // Scale, causal mask (same for all 16 rows: one token), row max of the half.
    float bm_lo = -INFINITY, bm_hi = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = base + nt * 8 + 2 * ci + e <= pos;
        s[nt][e] = ok ? s[nt][e] * p.scale : -INFINITY;
        s[nt][2 + e] = ok ? s[nt][2 + e] * p.scale : -INFINITY;
        bm_lo = fmaxf(bm_lo, s[nt][e]);
        bm_hi = fmaxf(bm_hi, s[nt][2 + e]);
      }
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      bm_lo = fmaxf(bm_lo, __shfl_xor_sync(0xffffffffu, bm_lo, off));
      bm_hi = fmaxf(bm_hi, __shfl_xor_sync(0xffffffffu, bm_hi, off));
    }
    // The half's first key is valid (base <= pos), so bm is finite.
    const float mn_lo = fmaxf(m_lo, bm_lo), mn_hi = fmaxf(m_hi, bm_hi);
    const float f_lo = expf(m_lo - mn_lo), f_hi = expf(m_hi - mn_hi);  // 0 on the first block
    m_lo = mn_lo, m_hi = mn_hi;
    float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[nt][e] = bf16_round(expf(s[nt][e] - mn_lo));
        s[nt][2 + e] = bf16_round(expf(s[nt][2 + e] - mn_hi));
        ps_lo += s[nt][e];
        ps_hi += s[nt][2 + e];
      }
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      ps_lo += __shfl_xor_sync(0xffffffffu, ps_lo, off);
      ps_hi += __shfl_xor_sync(0xffffffffu, ps_hi, off);
    }
    l_lo = l_lo * f_lo + ps_lo;
    l_hi = l_hi * f_hi + ps_hi;
#pragma unroll
    for (int dt = 0; dt < 16; ++dt) {
      o[dt][0] *= f_lo, o[dt][1] *= f_lo;
      o[dt][2] *= f_hi, o[dt][3] *= f_hi;
    }
    // O += P·V: 4 key steps of 16; P from the S accumulators (exact: already bf16 values).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      // keys 2c, 2c+1, 2c+8, 2c+9 of the step
      const uint16_t* v0 = vbase + (half * 64 + kk * 16 + 2 * ci) * kstride;
      const uint16_t* v1 = v0 + kstride;
      const uint16_t* v8 = v0 + 8 * kstride;
      const uint16_t* v9 = v0 + 9 * kstride;
      // Rows of keys past the token's position are never read: a page's unwritten tail may hold
      // NaN bit patterns, and 0 · NaN would poison O.
      const int64_t key0 = base + kk * 16 + 2 * ci;
      const bool r0 = key0 <= pos, r1 = key0 + 1 <= pos, r8 = key0 + 8 <= pos,
                 r9 = key0 + 9 <= pos;
#pragma unroll
      for (int dt = 0; dt < 16; ++dt) {
        const int d = dt * 8 + gi;
        const uint32_t e0 = r0 ? __ldg(v0 + d) : 0u, e1 = r1 ? __ldg(v1 + d) : 0u;
        const uint32_t e8 = r8 ? __ldg(v8 + d) : 0u, e9 = r9 ? __ldg(v9 + d) : 0u;
        mma_bf16(o[dt], pa, e0 | (e1 << 16), e8 | (e9 << 16));
      }
    }
    }  // half
  }
  // Normalise and store bf16 (rows gi and gi + 8 of the group).
  const float inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f;
  const float inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
  uint16_t* out_lo = p.out + (t * p.num_heads + grp * kGroup + gi) * kD;
  uint16_t* out_hi = out_lo + 8 * kD;
#pragma unroll
  for (int dt = 0; dt < 16; ++dt) {
    const int d = dt * 8 + 2 * ci;
    *reinterpret_cast<uint32_t*>(out_lo + d) = pack_bf16(o[dt][0] * inv_lo, o[dt][1] * inv_lo);
    *reinterpret_cast<uint32_t*>(out_hi + d) = pack_bf16(o[dt][2] * inv_hi, o[dt][3] * inv_hi);
  }
}

}  // namespace

Status launch_prefill_attention_mma(const PrefillAttentionParams& p, const int32_t* selected,
                                    int64_t top_k, CUstream_st* stream) {
  if (p.t == 0) return Status::ok();
  const KvCacheView& c = p.cache;
  if (c.head_dim != kD || c.page_size != kS || c.num_kv_heads * kGroup != p.num_heads)
    return invalid_argument("[cuda.prefill_attention_mma] needs D = 128, page 128 and 16 query "
                            "heads per KV head; got D " + std::to_string(c.head_dim) +
                            ", page " + std::to_string(c.page_size) + ", H " +
                            std::to_string(p.num_heads) + ", Hkv " +
                            std::to_string(c.num_kv_heads));
  if ((p.t + kWarps - 1) / kWarps > INT32_MAX || c.num_kv_heads > 65535)
    return invalid_argument("[cuda.prefill_attention_mma] chunk too large");
  MmaParams mp{p.q,       c,   p.positions, p.block_table, selected, p.t,
               p.num_heads, p.num_blocks, top_k, p.scale, p.out};
  dim3 grid(static_cast<unsigned>((p.t + kWarps - 1) / kWarps),
            static_cast<unsigned>(c.num_kv_heads));
  prefill_attention_mma_kernel<<<grid, kWarps * 32, 0, stream>>>(mp);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(prefill_attention_mma_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
