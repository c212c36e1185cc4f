// Block-sparse paged decode attention (bf16 cache, float32 math), split over the selected blocks:
// one CTA per (selected block, KV group, sequence) — or per quarter / half of a block's keys for
// small batches (key splits) — loads its K and V rows of the group once into shared memory and
// serves all 16 query heads of the group (scores, softmax statistics and the unnormalised P·V);
// a combine kernel merges the partial states per head.
#include "backend/cuda/attention/sparse_decode.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kD = 128, kGroup = 16, kThreads = 128;
constexpr int kKPitch = kD / 2 + 1;  // 32-bit words per K row in shared memory (+1: no conflicts)

// SPLITS CTAs share one selected block, each with kS / SPLITS of its keys (small batches: 64
// CTAs of 128 keys leave most of the GPU idle at batch 1; 4 splits give 256 shorter ones). The
// partial states are indexed by slot · SPLITS + part.
template <int SPLITS>
struct Smem {
  static constexpr int kKeys = kS / SPLITS;
  uint32_t k[kKeys][kKPitch];  // bf16 pairs
  uint32_t v[kKeys][kD / 2];   // bf16 pairs, read along D (conflict-free without padding)
  float q[kGroup][kD];
  float p[kGroup][kKeys];
};

__device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

template <int SPLITS>
__global__ void __launch_bounds__(kThreads) sparse_decode_split_kernel(SparseDecodeParams p) {
  constexpr int kKeys = kS / SPLITS;
  constexpr int kHeadsPerThread = kGroup * kKeys / kThreads;  // scores: 16, 8 or 4 heads
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<SPLITS>& sm = *reinterpret_cast<Smem<SPLITS>*>(smem_raw);
  const int slot = blockIdx.x / SPLITS, part = blockIdx.x % SPLITS, g = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const KvCacheBf16View& c = p.cache;
  const int64_t hkv = c.num_kv_heads;
  const int64_t pos = p.positions[b];
  const int64_t qb = pos / kS;
  const int32_t* sel = p.selected + (b * hkv + g) * p.top_k;
  const int32_t blk = sel[slot];
  const int64_t key0 = int64_t{blk} * kS + part * kKeys;  // position of this CTA's first key
  bool skip = blk < 0 || blk > qb || key0 > pos;  // key0 > pos: every key of the part is future
  for (int i = 0; i < slot && !skip; ++i) skip = sel[i] == blk;  // duplicates count once
  const int64_t row = b * (p.block_table_stride < 0 ? p.max_blocks : p.block_table_stride);
  const int64_t page = skip ? -1 : p.block_tables[row + blk];
  const int64_t slots = p.top_k * SPLITS, sidx = int64_t{slot} * SPLITS + part;
  float* mlp = p.ml_partial + ((b * p.num_heads + g * kGroup) * slots + sidx) * 2;
  float* op = p.o_partial + ((b * p.num_heads + g * kGroup) * slots + sidx) * kD;
  if (skip || page < 0 || page >= c.num_pages) {
    if (tid < kGroup) {
      mlp[tid * slots * 2] = -INFINITY;
      mlp[tid * slots * 2 + 1] = 0.0f;
    }
    return;
  }
  // Load this part's K and V rows of group g (256 B each, 16-byte pieces) and the 16 queries.
  const uint4* kg = reinterpret_cast<const uint4*>(c.k + ((page * kS + part * kKeys) * hkv + g) * kD);
  const uint4* vg = reinterpret_cast<const uint4*>(c.v + ((page * kS + part * kKeys) * hkv + g) * kD);
  const int64_t row_stride = hkv * kD / 8;  // uint4 per token row
  for (int i = tid; i < kKeys * (kD / 8); i += kThreads) {
    const int s = i / (kD / 8), piece = i % (kD / 8);
    const uint4 kv = __ldg(kg + s * row_stride + piece);
    // V rows past the query's position are zeroed: a page's unwritten tail may hold NaN bit
    // patterns, and their weight 0 would still give 0 · NaN = NaN.
    const uint4 vv = key0 + s <= pos ? __ldg(vg + s * row_stride + piece) : make_uint4(0, 0, 0, 0);
    sm.k[s][piece * 4 + 0] = kv.x, sm.k[s][piece * 4 + 1] = kv.y;
    sm.k[s][piece * 4 + 2] = kv.z, sm.k[s][piece * 4 + 3] = kv.w;
    *reinterpret_cast<uint4*>(&sm.v[s][piece * 4]) = vv;
  }
  const uint16_t* qg = p.q + (b * p.num_heads + g * kGroup) * kD;
  for (int i = tid; i < kGroup * kD; i += kThreads) sm.q[i / kD][i % kD] = bf16_to_f32(qg[i]);
  __syncthreads();

  // Scores: thread (s, hq) owns key s of the part for heads hq·H' .. hq·H' + H' - 1.
  {
    const int s = tid % kKeys, h0 = (tid / kKeys) * kHeadsPerThread;
    float acc[kHeadsPerThread];
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h) acc[h] = 0.0f;
    for (int d2 = 0; d2 < kD / 2; ++d2) {
      const uint32_t w = sm.k[s][d2];
      const float k0 = lo(w), k1 = hi(w);
#pragma unroll
      for (int h = 0; h < kHeadsPerThread; ++h)
        acc[h] = fmaf(sm.q[h0 + h][2 * d2 + 1], k1, fmaf(sm.q[h0 + h][2 * d2], k0, acc[h]));
    }
    const bool valid = key0 + s <= pos;
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h)
      sm.p[h0 + h][s] = valid ? acc[h] * p.scale : -INFINITY;
  }
  __syncthreads();
  // Softmax statistics: warp w handles heads 4w .. 4w+3 (each lane kKeys / 32 keys).
  constexpr int kPerLane = kKeys / 32;
  for (int h = warp * 4; h < warp * 4 + 4; ++h) {
    float v[kPerLane], m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) m = fmaxf(m, v[j] = sm.p[h][lane + 32 * j]);
    m = warp_max(m);  // the part's first key (key0 <= pos) is always valid: m is finite
    float l = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const float e = expf(v[j] - m);
      sm.p[h][lane + 32 * j] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) {
      mlp[h * slots * 2] = m;
      mlp[h * slots * 2 + 1] = l;
    }
  }
  __syncthreads();
  // Unnormalised P·V: thread d2 owns dims 2·d2, 2·d2+1 for heads in two halves (registers).
  for (int hh = 0; hh < kGroup; hh += 8) {
    const int d2 = tid & 63, h0 = hh + (tid >> 6) * 4;
    float a0[4] = {0, 0, 0, 0}, a1[4] = {0, 0, 0, 0};
    for (int s = 0; s < kKeys; ++s) {
      const uint32_t w = sm.v[s][d2];
      const float v0 = lo(w), v1 = hi(w);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float pj = sm.p[h0 + j][s];
        a0[j] = fmaf(pj, v0, a0[j]);
        a1[j] = fmaf(pj, v1, a1[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float* o = op + (h0 + j) * slots * kD;
      *reinterpret_cast<float2*>(o + 2 * d2) = make_float2(a0[j], a1[j]);
    }
  }
}

// One block per (head, sequence): merge the top_k · splits partial states, normalise, store bf16.
__global__ void sparse_decode_combine_kernel(SparseDecodeParams p, int64_t slots) {
  pdl_launch_dependents();  // a following PDL GEMV (o_proj) may start streaming its weights
  const int64_t bh = blockIdx.x;  // b·H + h
  const float* ml = p.ml_partial + bh * slots * 2;
  const float* o = p.o_partial + bh * slots * kD;
  float m = -INFINITY;
  for (int64_t i = 0; i < slots; ++i) m = fmaxf(m, ml[2 * i]);
  uint16_t* out = p.out + bh * kD;
  const int d = threadIdx.x;
  if (m == -INFINITY) {
    out[d] = 0;
    return;
  }
  float num = 0.0f, den = 0.0f;
  for (int64_t i = 0; i < slots; ++i) {
    if (ml[2 * i] == -INFINITY) continue;
    const float w = expf(ml[2 * i] - m);
    den = fmaf(ml[2 * i + 1], w, den);
    num = fmaf(o[i * kD + d], w, num);
  }
  out[d] = f32_to_bf16(num / den);
}

template <int SPLITS>
Status launch_split(const SparseDecodeParams& p, dim3 grid, CUstream_st* stream) {
  const int smem = static_cast<int>(sizeof(Smem<SPLITS>));
  M3_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      sparse_decode_split_kernel<SPLITS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  sparse_decode_split_kernel<SPLITS><<<grid, kThreads, smem, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(sparse_decode_split_kernel<SPLITS>);
  return Status::ok();
}

}  // namespace

Status launch_sparse_decode(const SparseDecodeParams& p, CUstream_st* stream) {
  if (p.batch == 0) return Status::ok();
  const KvCacheBf16View& c = p.cache;
  if (c.head_dim != kD || c.page_size != kS || c.num_kv_heads * kGroup != p.num_heads ||
      p.top_k <= 0 || p.top_k > 65535 || p.batch > 65535)
    return invalid_argument("[cuda.sparse_decode] needs D = 128, page 128, 16 query heads per KV "
                            "head, top_k in [1, 65535] (dense prefill rows select every block), "
                            "batch <= 65535; got D " + std::to_string(c.head_dim) +
                            ", page " + std::to_string(c.page_size) + ", H " +
                            std::to_string(p.num_heads) + ", Hkv " +
                            std::to_string(c.num_kv_heads));
  // Key splits: up to max_key_splits (the partial buffers' capacity), while the grid stays
  // within about one wave of two CTAs per SM.
  static int sms = 0;
  if (sms == 0) {
    int dev = 0;
    M3_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    M3_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  int splits = 1;
  const int64_t ctas = p.top_k * c.num_kv_heads * p.batch;
  if (p.force_key_splits) {
    if (p.max_key_splits != 1 && p.max_key_splits != 2 && p.max_key_splits != 4)
      return invalid_argument("[cuda.sparse_decode] key splits must be 1, 2 or 4");
    splits = static_cast<int>(p.max_key_splits);
  } else if (p.max_key_splits >= 4 && ctas * 4 <= 2 * sms) {
    splits = 4;
  } else if (p.max_key_splits >= 2 && ctas * 2 <= 2 * sms) {
    splits = 2;
  }
  dim3 grid(static_cast<unsigned>(p.top_k * splits), static_cast<unsigned>(c.num_kv_heads),
            static_cast<unsigned>(p.batch));
  if (splits == 4) {
    M3_RETURN_IF_ERROR(launch_split<4>(p, grid, stream));
  } else if (splits == 2) {
    M3_RETURN_IF_ERROR(launch_split<2>(p, grid, stream));
  } else {
    M3_RETURN_IF_ERROR(launch_split<1>(p, grid, stream));
  }
  sparse_decode_combine_kernel<<<static_cast<unsigned>(p.batch * p.num_heads), kD, 0, stream>>>(
      p, p.top_k * splits);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(sparse_decode_combine_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
