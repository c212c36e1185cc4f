// Paged causal GQA attention, dense or block-sparse (float32 correctness path), same contract as
// the CPU: query head n reads KV head n / (H / Hkv); allowed keys are j <= pos and, when a
// selection is given, j / S in the (deduplicated) selected blocks of index head n / (H / Hix).
// One block of 4 warps per (token, head); each warp runs an online softmax over its share of the
// keys (block by block, keys of a block strided over the warp's iterations), and the 4 partial
// states are merged at the end. Order of keys differs from the CPU; the op test's tolerance
// covers the rounding difference.
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/reduce.cuh"

namespace m3::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxD = 256;  // head_dim <= 256: each lane holds kMaxD / 32 output dims
constexpr int kPerLane = kMaxD / 32;

// Element i of KV head g of cached token row r of `page`: float32 in place, other dtypes
// dequantised (exact, the CPU's values).
__device__ __forceinline__ float kv_elem(const KvLayerView& c, const float* f32,
                                         const KvQuantStore& q, int64_t page, int64_t r,
                                         int64_t g, int64_t i) {
  if (c.dtype == KvCacheDtype::kFloat32)
    return f32[((page * c.page_size + r) * c.num_kv_heads + g) * c.head_dim + i];
  return kv_load_element(c.dtype, q, page, c.page_size, c.num_kv_heads, g, c.head_dim, r, i);
}

__global__ void paged_attention_kernel(PagedAttentionParams p) {
  const KvLayerView& c = p.cache;
  const int64_t tn = blockIdx.x;
  const int64_t t = tn / p.num_heads, n = tn % p.num_heads;
  const int64_t hkv = c.num_kv_heads, d = c.head_dim, bs = c.page_size;
  const int64_t g = n / (p.num_heads / hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t pos = p.positions[t];
  const int64_t qb = pos / bs;
  const float* q = p.q + tn * d;
  float qr[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) qr[i] = lane + 32 * i < d ? q[lane + 32 * i] : 0.0f;

  // Blocks to visit: the selection (skipping -1, blocks after qb and duplicates) or 0..qb.
  const int32_t* sel = nullptr;
  int64_t nsel = qb + 1;
  if (p.selected != nullptr) {
    sel = p.selected + (t * p.num_index_heads + n / (p.num_heads / p.num_index_heads)) * p.top_k;
    nsel = p.top_k;
  }
  float m = -INFINITY, l = 0.0f, acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  for (int64_t si = 0; si < nsel; ++si) {
    int64_t b = si;
    if (sel != nullptr) {
      b = sel[si];
      if (b < 0 || b > qb) continue;
      bool dup = false;
      for (int64_t sj = 0; sj < si; ++sj) dup |= sel[sj] == b;
      if (dup) continue;
    }
    if (b >= p.num_blocks) continue;
    const int64_t page = p.block_table[b];
    if (page < 0 || page >= c.num_pages) continue;
    const int64_t last = min(pos, (b + 1) * bs - 1);
    for (int64_t j = b * bs + warp; j <= last; j += kWarps) {
      const int64_t r = j % bs;
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + 32 * i < d) dot = fmaf(qr[i], kv_elem(c, c.k, c.kq, page, r, g, lane + 32 * i), dot);
      const float s = warp_sum(dot) * p.scale;
      const float m_new = fmaxf(m, s);
      const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
      const float pj = expf(s - m_new);
      l = l * corr + pj;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + 32 * i < d)
          acc[i] = acc[i] * corr + pj * kv_elem(c, c.v, c.vq, page, r, g, lane + 32 * i);
      m = m_new;
    }
  }
  // Merge the warps' states.
  __shared__ float s_m[kWarps], s_l[kWarps], s_acc[kWarps][kMaxD];
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (lane + 32 * i < d) s_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w]);
  float* o = p.out + tn * d;
  if (mx == -INFINITY) {  // no allowed key (cannot happen with a forced local block)
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = 0.0f;
    return;
  }
  float denom = 0.0f, wts[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    wts[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - mx);
    denom += s_l[w] * wts[w];
  }
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float num = 0.0f;
    for (int w = 0; w < kWarps; ++w) num += s_acc[w][i] * wts[w];
    o[i] = num / denom;
  }
}

}  // namespace

Status launch_paged_attention(const PagedAttentionParams& p, cudaStream_t s) {
  if (p.t == 0) return Status::ok();
  const KvLayerView& c = p.cache;
  if (c.head_dim > kMaxD || c.num_kv_heads <= 0 || p.num_heads % c.num_kv_heads != 0)
    return invalid_argument("[cuda.paged_attention] unsupported head_dim " +
                            std::to_string(c.head_dim) + " or head counts");
  if (p.selected != nullptr &&
      (p.num_index_heads <= 0 || p.num_heads % p.num_index_heads != 0))
    return invalid_argument("[cuda.paged_attention] heads not a multiple of index heads");
  paged_attention_kernel<<<static_cast<unsigned>(p.t * p.num_heads), 32 * kWarps, 0, s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(paged_attention_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
