// Tensor-core block-sparse / dense causal paged attention for a prefill chunk over shared-memory
// tiles (PrefillAttentionKernel::kTiled of launch_prefill_attention, see sparse_prefill.h).
//
// Why: kTensorCore (sparse_prefill_mma.cu) gives each (token, KV group) its own warp that reads
// its K / V fragments straight from the paged cache, so a block shared by neighbouring tokens
// (the init and local blocks, and most of the top-k: consecutive tokens score blocks alike) is
// read once per token, and the mma waits on L2. Here one CTA takes kTile consecutive tokens of
// one KV group (kTile warps, warp w = token t0 + w, its 16 query heads = the 16 mma rows), and
// walks the union of the blocks the tile's tokens selected, in ascending order. Each block is
// loaded as two 64-key halves (one pipeline stage each: K and V, 2 x 64 x 128 bf16) with
// cp.async into a double buffer, and every warp whose token selected the block (and whose
// position reaches the half) computes from shared memory exactly what kTensorCore computes from
// the cache: S = Q·K^T (ldmatrix fragments), scale, causal mask, online softmax in float32, P
// rounded to bf16 for both O += P·V (ldmatrix.trans fragments) and the sum l. The error model of
// kTensorCore holds unchanged; only the order of the blocks differs (ascending here, selection
// order there), hence rounding-level differences between the two.
//
// The union is computed in the prologue on the device: the tile's selections (kTile x top_k ids,
// those past the token's block, past num_blocks or negative dropped) set bits of a bitmap over
// the blocks 0..b_max of the tile; a warp scan of the bitmap's popcounts gives each block its
// rank, the ranks give the sorted list, and each selection ORs its token's bit into the mask of
// its rank (duplicates count once, as in kTensorCore). Dense rows: the union is 0..b_max, token
// w uses block b iff b <= b_q(w).
//
// Where the tile's tokens share few blocks (a union of more than tiled_union_limit blocks, by
// default 4·top_k: fewer than two tokens per block on average), most warps would wait at each
// stage for the one or two that use it, so each warp instead walks its own blocks of the union
// with fragments from the cache, as kTensorCore does; the order and arithmetic are the same, so
// the output is the same either way (the tests check both paths against each other).
//
// NaN safety: rows of a page past the tile's last position may hold anything (an unwritten page
// tail), so they are zero-filled instead of loaded (cp.async with source size 0); a key past a
// token's position has its score replaced by -inf before use and its P is exactly 0; the V rows
// it meets are either zeros or written rows of the chunk (finite), so 0 · v adds nothing.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/attention/mma_bf16.cuh"
#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/runtime/cp_async.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/dynamic_smem.cuh"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kD = 128, kGroup = 16;
constexpr int kTile = 8;                 // tokens per CTA = warps per CTA
constexpr int kThreads = 32 * kTile;
constexpr int kHalf = 64;                // keys per pipeline stage
constexpr int kPitch = kD + 8;           // bf16 per smem row: 272 bytes, so the 8 row addresses
                                         // of an ldmatrix fall on distinct 16-byte bank groups
constexpr int kMaxTopK = 128;
constexpr int kMaxSmem = 227 * 1024;     // sm_90 opt-in limit per CTA

struct Stage {
  uint16_t k[kHalf][kPitch];
  uint16_t v[kHalf][kPitch];
};
constexpr int kStageBytes = static_cast<int>(sizeof(Stage));  // 34816
static_assert(kStageBytes % 16 == 0, "stages stay 16-byte aligned");
// Fixed part after the two stages: positions of the tile's tokens, the union's size.
constexpr int kHeaderInts = kTile + 4;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float bf16_round(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// Online-softmax state of one warp: O for its 16 rows (heads), max m and sum l of rows gi, gi+8.
struct WarpState {
  float o[16][4];
  float m_lo, m_hi, l_lo, l_hi;
};

// One half (64 keys from key `base` on) of a block for one warp's token at `pos` (base <= pos):
// S = Q·K^T, scale, causal mask, online softmax, O += P·V with P rounded to bf16.
// frags.k(np, ks, b): B registers of key tiles 2np, 2np+1 (keys of the half) for k-step ks;
// frags.v(kk, dp, b): B registers of dim tiles 2dp, 2dp+1 for key step kk (16 keys).
template <class Frags>
__device__ __forceinline__ void attend_half(WarpState& w, const uint32_t (&qa)[8][4],
                                            int64_t base, int64_t pos, float scale, int ci,
                                            const Frags& frags) {
  float s[8][4];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
  for (int np = 0; np < 4; ++np) {
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      uint32_t b[4];
      frags.k(np, ks, b);
      mma_bf16(s[2 * np], qa[ks], b[0], b[1]);
      mma_bf16(s[2 * np + 1], qa[ks], b[2], b[3]);
    }
  }
  // Scale, causal mask (one token: the same for all 16 rows), row max of the half.
  float bm_lo = -INFINITY, bm_hi = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool ok = base + nt * 8 + 2 * ci + e <= pos;
      s[nt][e] = ok ? s[nt][e] * scale : -INFINITY;
      s[nt][2 + e] = ok ? s[nt][2 + e] * scale : -INFINITY;
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
  const float mn_lo = fmaxf(w.m_lo, bm_lo), mn_hi = fmaxf(w.m_hi, bm_hi);
  const float f_lo = expf(w.m_lo - mn_lo), f_hi = expf(w.m_hi - mn_hi);  // 0 the first time
  w.m_lo = mn_lo, w.m_hi = mn_hi;
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
  w.l_lo = w.l_lo * f_lo + ps_lo;
  w.l_hi = w.l_hi * f_hi + ps_hi;
#pragma unroll
  for (int dt = 0; dt < 16; ++dt) {
    w.o[dt][0] *= f_lo, w.o[dt][1] *= f_lo;
    w.o[dt][2] *= f_hi, w.o[dt][3] *= f_hi;
  }
  // O += P·V: 4 key steps of 16; P from the S accumulators (exact: already bf16 values).
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t pa[4];
    pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int dp = 0; dp < 8; ++dp) {
      uint32_t b[4];
      frags.v(kk, dp, b);
      mma_bf16(w.o[2 * dp], pa, b[0], b[1]);
      mma_bf16(w.o[2 * dp + 1], pa, b[2], b[3]);
    }
  }
}

// Fragments from a shared-memory stage (ldmatrix; rows padded, conflict-free). K: matrices
// (keys +0 / +8 of the pair) x (dims +0 / +8 of the k-step); V (.trans): (keys +0 / +8 of the
// step) x (dims +0 / +8 of the pair of dim tiles).
struct SmemFrags {
  uint32_t k_addr, v_addr;  // this lane's row addresses for np = ks = 0 and kk = dp = 0
  __device__ void k(int np, int ks, uint32_t (&b)[4]) const {
    ldmatrix_x4(k_addr + np * 16 * kPitch * 2 + ks * 32, b);
  }
  __device__ void v(int kk, int dp, uint32_t (&b)[4]) const {
    ldmatrix_x4_trans(v_addr + kk * 16 * kPitch * 2 + dp * 32, b);
  }
};

// Fragments straight from the paged cache (the per-warp path of a tile with a large union, as
// kTensorCore): K as 32-bit pairs along D; V as 16-bit values, rows past the token's position
// not read (an unwritten page tail may hold NaN; such rows contribute zeros, as the zero-filled
// stage rows do).
struct GlobalFrags {
  const uint16_t* kbase;  // key row j of the half: kbase + j·stride (this warp's group)
  const uint16_t* vbase;
  int64_t stride, base, pos;
  int gi, ci;
  __device__ void k(int np, int ks, uint32_t (&b)[4]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint16_t* krow = kbase + ((2 * np + h) * 8 + gi) * stride + ks * 16 + 2 * ci;
      b[2 * h] = __ldg(reinterpret_cast<const unsigned int*>(krow));
      b[2 * h + 1] = __ldg(reinterpret_cast<const unsigned int*>(krow + 8));
    }
  }
  __device__ void v(int kk, int dp, uint32_t (&b)[4]) const {
    const int key0 = kk * 16 + 2 * ci;
    const uint16_t* v0 = vbase + key0 * stride;
    const bool r0 = base + key0 <= pos, r1 = base + key0 + 1 <= pos,
               r8 = base + key0 + 8 <= pos, r9 = base + key0 + 9 <= pos;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int d = (2 * dp + h) * 8 + gi;
      const uint32_t e0 = r0 ? __ldg(v0 + d) : 0u, e1 = r1 ? __ldg(v0 + stride + d) : 0u;
      const uint32_t e8 = r8 ? __ldg(v0 + 8 * stride + d) : 0u,
                     e9 = r9 ? __ldg(v0 + 9 * stride + d) : 0u;
      b[2 * h] = e0 | (e1 << 16);
      b[2 * h + 1] = e8 | (e9 << 16);
    }
  }
};

struct TiledParams {
  const uint16_t* q;           // [T, H, D]
  KvCacheView cache;
  const int32_t* positions;    // [T]
  const int32_t* block_table;  // [num_blocks]
  const int32_t* selected;     // [T, Hkv, top_k] (sparse) or nullptr (dense: blocks 0..b_q)
  int64_t t, num_heads, num_blocks, top_k;
  int bitmap_words;            // sparse: words of the block bitmap ((num_blocks + 31) / 32)
  int union_limit;             // sparse: a larger union takes the per-warp path
  float scale;
  uint16_t* out;               // [T, H, D]
};

// Dynamic shared memory: Stage[2] | header ints | bitmap[W] | word_prefix[W] | blocks[C] |
// masks[C], C = kTile · top_k (sparse; W = C = 0 for dense).
__host__ __device__ constexpr int64_t tiled_smem_bytes(int64_t words, int64_t cap) {
  return 2 * int64_t{kStageBytes} + 4 * (kHeaderInts + 2 * words + 2 * cap);
}

// PER_WARP: the instance for the tiles whose union exceeds union_limit (the other tiles return
// after the prologue), so that each path gets its own register allocation (together in one
// kernel they spill).
template <bool PER_WARP>
__global__ void __launch_bounds__(kThreads, 1) prefill_attention_tiled_kernel(TiledParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  Stage* stages = reinterpret_cast<Stage*>(smem);
  int32_t* s_pos = reinterpret_cast<int32_t*>(smem + 2 * kStageBytes);
  int32_t* s_count = s_pos + kTile;
  uint32_t* s_bits = reinterpret_cast<uint32_t*>(s_pos + kHeaderInts);
  int32_t* s_wpre = reinterpret_cast<int32_t*>(s_bits + p.bitmap_words);
  const int64_t cap = p.selected != nullptr ? kTile * p.top_k : 0;
  int32_t* s_blocks = s_wpre + p.bitmap_words;
  uint32_t* s_mask = reinterpret_cast<uint32_t*>(s_blocks + cap);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gi = lane >> 2, ci = lane & 3;
  // The last tiles first: the longest (most causal blocks) start in the first wave.
  const int64_t t0 = int64_t{gridDim.x - 1 - blockIdx.x} * kTile, t = t0 + warp;
  const int64_t grp = blockIdx.y;
  const KvCacheView& c = p.cache;
  const int64_t hkv = c.num_kv_heads;
  const bool dense = p.selected == nullptr;

  if (tid < kTile) s_pos[tid] = t0 + tid < p.t ? p.positions[t0 + tid] : -1;
  if (!dense) {
    for (int i = tid; i < p.bitmap_words; i += kThreads) s_bits[i] = 0u;
    for (int64_t i = tid; i < cap; i += kThreads) s_mask[i] = 0u;
  }
  __syncthreads();
  int pos_max = -1;
#pragma unroll
  for (int w = 0; w < kTile; ++w) pos_max = max(pos_max, s_pos[w]);
  const int64_t pos = s_pos[warp];  // -1 for a token past the chunk: it uses no block
  const int64_t qb = pos >= 0 ? pos / kS : -1;

  // The union of the tile's selections (sparse), or 0..b_max (dense).
  int n_union;
  if (dense) {
    n_union = pos_max / kS + 1;  // token t0 exists, so pos_max >= 0
  } else {
    // Candidate i = (token w = i / top_k, slot i % top_k); -1 where dropped.
    auto candidate = [&](int64_t i) -> int64_t {
      const int w = static_cast<int>(i / p.top_k);
      const int64_t pw = s_pos[w];
      if (pw < 0) return -1;
      const int64_t b = p.selected[((t0 + w) * hkv + grp) * p.top_k + i % p.top_k];
      return (b < 0 || b > pw / kS || b >= p.num_blocks) ? -1 : b;
    };
    for (int64_t i = tid; i < cap; i += kThreads) {
      const int64_t b = candidate(i);
      if (b >= 0) atomicOr(&s_bits[b >> 5], 1u << (b & 31));
    }
    __syncthreads();
    // Exclusive prefix of the words' popcounts (warp 0: lane l scans a contiguous run of words).
    if (warp == 0) {
      const int per = (p.bitmap_words + 31) / 32;
      const int w0 = min(lane * per, p.bitmap_words), w1 = min(w0 + per, p.bitmap_words);
      int run = 0;
      for (int w = w0; w < w1; ++w) run += __popc(s_bits[w]);
      int incl = run;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
      }
      int acc = incl - run;
      for (int w = w0; w < w1; ++w) {
        s_wpre[w] = acc;
        acc += __popc(s_bits[w]);
      }
      if (lane == 31) s_count[0] = incl;
    }
    __syncthreads();
    n_union = s_count[0];
    for (int64_t i = tid; i < cap; i += kThreads) {
      const int64_t b = candidate(i);
      if (b < 0) continue;
      const uint32_t word = s_bits[b >> 5];
      const int rank = s_wpre[b >> 5] + __popc(word & ((1u << (b & 31)) - 1u));
      s_blocks[rank] = static_cast<int32_t>(b);  // every duplicate writes the same value
      atomicOr(&s_mask[rank], 1u << (i / p.top_k));
    }
    __syncthreads();
  }

  if ((!dense && n_union > p.union_limit) != PER_WARP) return;  // uniform over the CTA

  // Q fragments for the 8 k-steps (dims), rows = heads of the group.
  uint32_t qa[8][4];
  {
    const int64_t tq = t < p.t ? t : t0;  // a token past the chunk loads a valid row, unused
    const uint16_t* qrow = p.q + (tq * p.num_heads + grp * kGroup) * kD;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const int d0 = ks * 16 + 2 * ci;
      qa[ks][0] = *reinterpret_cast<const uint32_t*>(qrow + gi * kD + d0);
      qa[ks][1] = *reinterpret_cast<const uint32_t*>(qrow + (gi + 8) * kD + d0);
      qa[ks][2] = *reinterpret_cast<const uint32_t*>(qrow + gi * kD + d0 + 8);
      qa[ks][3] = *reinterpret_cast<const uint32_t*>(qrow + (gi + 8) * kD + d0 + 8);
    }
  }

  // Stage i = half (i & 1) of union block i >> 1. Its page, or -1 where nothing is loaded
  // (a missing page, or a half entirely past the tile's last position).
  const int n_stage = 2 * n_union;
  auto stage_page = [&](int i, int64_t* blk_out) -> int64_t {
    const int64_t blk = dense ? (i >> 1) : s_blocks[i >> 1];
    *blk_out = blk;
    if (blk >= p.num_blocks || blk * kS + (i & 1) * kHalf > pos_max) return -1;
    const int64_t page = p.block_table[blk];
    return (page < 0 || page >= c.num_pages) ? -1 : page;
  };
  auto load = [&](int i) {
    if (i >= n_stage) return;
    int64_t blk;
    const int64_t page = stage_page(i, &blk);
    if (page < 0) return;
    Stage& st = stages[i & 1];
    const int64_t key0 = blk * kS + (i & 1) * kHalf;
    // 2 (K, V) x 64 rows x 16 chunks of 16 bytes.
    for (int chunk = tid; chunk < 2 * kHalf * 16; chunk += kThreads) {
      const int is_v = chunk / (kHalf * 16), r = (chunk / 16) % kHalf, ch = chunk % 16;
      const uint16_t* base = is_v ? c.v : c.k;
      const bool ok = key0 + r <= pos_max;
      const uint16_t* src =
          ok ? base + ((page * kS + (i & 1) * kHalf + r) * hkv + grp) * kD + ch * 8 : base;
      uint16_t* dst = is_v ? &st.v[r][ch * 8] : &st.k[r][ch * 8];
      cp_async16(smem_u32(dst), src, ok ? 16 : 0);
    }
  };

  WarpState ws;
#pragma unroll
  for (int i = 0; i < 16; ++i) ws.o[i][0] = ws.o[i][1] = ws.o[i][2] = ws.o[i][3] = 0.0f;
  ws.m_lo = ws.m_hi = -INFINITY;
  ws.l_lo = ws.l_hi = 0.0f;

  if constexpr (PER_WARP) {
    // Few blocks shared: staging every block of the union would leave most warps idle at each
    // stage. Each warp walks its own blocks (the same ascending order, the same arithmetic, so
    // the same bits) with fragments from the cache.
    for (int u = 0; u < n_union; ++u) {
      if (((s_mask[u] >> warp) & 1u) == 0u) continue;
      const int64_t blk = s_blocks[u];
      const int64_t page = p.block_table[blk];
      if (page < 0 || page >= c.num_pages) continue;
      for (int half = 0; half < 2; ++half) {
        const int64_t base = blk * kS + half * kHalf;
        if (base > pos) break;
        const int64_t stride = hkv * kD;
        const int64_t row0 = (page * kS + half * kHalf) * hkv + grp;
        const GlobalFrags f{c.k + row0 * kD, c.v + row0 * kD, stride, base, pos, gi, ci};
        attend_half(ws, qa, base, pos, p.scale, ci, f);
      }
    }
  } else {
    const int mat = lane >> 3, mrow = lane & 7;
    load(0);
    cp_async_commit();
    for (int i = 0; i < n_stage; ++i) {
      load(i + 1);
      cp_async_commit();
      cp_async_wait<1>();  // stage i's group has landed (this thread's copies)
      __syncthreads();     // ... and every thread's
      int64_t blk;
      const int64_t page = stage_page(i, &blk);
      const int64_t base = blk * kS + (i & 1) * kHalf;
      const bool selected_here = dense ? blk <= qb : ((s_mask[i >> 1] >> warp) & 1u) != 0u;
      if (page >= 0 && selected_here && base <= pos) {
        const Stage& st = stages[i & 1];
        const SmemFrags f{smem_u32(&st.k[(mat >> 1) * 8 + mrow][(mat & 1) * 8]),
                          smem_u32(&st.v[(mat & 1) * 8 + mrow][(mat >> 1) * 8])};
        attend_half(ws, qa, base, pos, p.scale, ci, f);
      }
      __syncthreads();  // every warp is done with stage i's buffer before load(i + 2) refills it
    }
    cp_async_wait<0>();
  }

  if (t >= p.t) return;
  // Normalise and store bf16 (rows gi and gi + 8 of the group).
  const float inv_lo = ws.l_lo > 0.0f ? 1.0f / ws.l_lo : 0.0f;
  const float inv_hi = ws.l_hi > 0.0f ? 1.0f / ws.l_hi : 0.0f;
  uint16_t* out_lo = p.out + (t * p.num_heads + grp * kGroup + gi) * kD;
  uint16_t* out_hi = out_lo + 8 * kD;
#pragma unroll
  for (int dt = 0; dt < 16; ++dt) {
    const int d = dt * 8 + 2 * ci;
    *reinterpret_cast<uint32_t*>(out_lo + d) =
        pack_bf16(ws.o[dt][0] * inv_lo, ws.o[dt][1] * inv_lo);
    *reinterpret_cast<uint32_t*>(out_hi + d) =
        pack_bf16(ws.o[dt][2] * inv_hi, ws.o[dt][3] * inv_hi);
  }
}

}  // namespace

Status launch_prefill_attention_tiled(const PrefillAttentionParams& p, const int32_t* selected,
                                      int64_t top_k, CUstream_st* stream) {
  if (p.t == 0) return Status::ok();
  const KvCacheView& c = p.cache;
  if (c.head_dim != kD || c.page_size != kS || c.num_kv_heads * kGroup != p.num_heads)
    return invalid_argument("[cuda.prefill_attention_tiled] needs D = 128, page 128 and 16 "
                            "query heads per KV head; got D " + std::to_string(c.head_dim) +
                            ", page " + std::to_string(c.page_size) + ", H " +
                            std::to_string(p.num_heads) + ", Hkv " +
                            std::to_string(c.num_kv_heads));
  if (selected != nullptr && (top_k <= 0 || top_k > kMaxTopK))
    return invalid_argument("[cuda.prefill_attention_tiled] needs 0 < top_k <= 128, got " +
                            std::to_string(top_k));
  if ((p.t + kTile - 1) / kTile > INT32_MAX || c.num_kv_heads > 65535)
    return invalid_argument("[cuda.prefill_attention_tiled] chunk too large");
  const int64_t words = selected != nullptr ? (p.num_blocks + 31) / 32 : 0;
  const int64_t cap = selected != nullptr ? kTile * top_k : 0;
  const int64_t smem = tiled_smem_bytes(words, cap);
  if (smem > kMaxSmem)
    return invalid_argument("[cuda.prefill_attention_tiled] block table too long (" +
                            std::to_string(p.num_blocks) + " blocks)");
  M3_CUDA_RETURN_IF_ERROR(
      allow_dynamic_smem_once<prefill_attention_tiled_kernel<false>>(kMaxSmem));
  M3_CUDA_RETURN_IF_ERROR(
      allow_dynamic_smem_once<prefill_attention_tiled_kernel<true>>(kMaxSmem));
  const int64_t limit = p.tiled_union_limit >= 0 ? p.tiled_union_limit : 4 * top_k;
  TiledParams tp{p.q,         c,
                 p.positions, p.block_table,
                 selected,    p.t,
                 p.num_heads, p.num_blocks,
                 top_k,       static_cast<int>(words),
                 static_cast<int>(std::min<int64_t>(limit, INT32_MAX)), p.scale,
                 p.out};
  dim3 grid(static_cast<unsigned>((p.t + kTile - 1) / kTile),
            static_cast<unsigned>(c.num_kv_heads));
  // The staged tiles, then (where a union can exceed the limit) the per-warp ones. A CTA of the
  // other kind returns after the prologue (a few hundred bytes of selections).
  prefill_attention_tiled_kernel<false>
      <<<grid, kThreads, static_cast<size_t>(smem), stream>>>(tp);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(prefill_attention_tiled_kernel<false>);
  if (selected != nullptr && limit < cap) {
    prefill_attention_tiled_kernel<true>
        <<<grid, kThreads, static_cast<size_t>(smem), stream>>>(tp);
    M3_CUDA_RETURN_IF_LAUNCH_ERROR(prefill_attention_tiled_kernel<true>);
  }
  return Status::ok();
}

}  // namespace m3::cuda
