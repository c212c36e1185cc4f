#include "backend/cuda/dspark/block_attention.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxDimsPerLane = kThreads / 32;  // head_dim divides kThreads

// Keys of the slot that sees the most context (slot 0): its window's context plus the block.
__host__ __device__ inline int64_t max_keys(const DSparkBlockAttentionParams& p,
                                            int64_t anchor_pos) {
  const int64_t ctx = anchor_pos < p.window - 1 ? anchor_pos : p.window - 1;
  return (ctx > 0 ? ctx : 0) + p.block;
}

// What a launch sizes its shared memory for: the anchor's, or a full window when batched.
inline int64_t launch_max_keys(const DSparkBlockAttentionParams& p) {
  return max_keys(p, p.seqs != nullptr ? p.window : p.anchor_pos);
}

// Tree reduction over the CTA in `red` [kThreads]; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      const float o = red[threadIdx.x + s];
      red[threadIdx.x] = kMax ? fmaxf(red[threadIdx.x], o) : red[threadIdx.x] + o;
    }
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

template <bool kBf16>
__device__ inline float load_q(const DSparkBlockAttentionParams& p, int64_t i) {
  if constexpr (kBf16) {
    return bf16_to_f32(p.q_bf16[i]);
  } else {
    return p.q[i];
  }
}

// The cache row (page · S + pos % S) of context position `pos`, or -1 when its page is not held.
// Computed once per key per CTA into shared memory (the 64-bit division and the block-table load
// per key and per thread of the value loop cost more than the attention itself).
__device__ inline int32_t context_row(const DSparkBlockAttentionParams& p,
                                      const int32_t* block_table, int64_t num_blocks,
                                      int64_t pos) {
  const int64_t blk = pos / p.page_size;
  const int32_t page = blk < num_blocks ? block_table[blk] : -1;
  if (page < 0 || page >= p.num_pages) return -1;
  return static_cast<int32_t>(static_cast<int64_t>(page) * p.page_size + pos % p.page_size);
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) dspark_block_attention_kernel(
    DSparkBlockAttentionParams p) {
  extern __shared__ float smem[];
  const int64_t slot = blockIdx.y, n = blockIdx.x;
  const int64_t D = p.head_dim, H = p.num_heads, hkv = p.num_kv_heads;
  const int64_t g = n / (H / hkv);
  // This CTA's sequence: seqs[z] when batched (its block rows from z·B on), else the fields.
  const DSparkBlockAttentionSeq* sq = p.seqs != nullptr ? p.seqs + blockIdx.z : nullptr;
  const int64_t anchor_pos = sq != nullptr ? sq->anchor_pos : p.anchor_pos;
  const int32_t* block_table = sq != nullptr ? sq->block_table : p.block_table;
  const int64_t num_blocks = sq != nullptr ? sq->num_blocks : p.num_blocks;
  const uint16_t* cache_k_bf16 = sq != nullptr ? sq->cache_k_bf16 : p.cache_k_bf16;
  const uint16_t* cache_v_bf16 = sq != nullptr ? sq->cache_v_bf16 : p.cache_v_bf16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.z) * p.block;
  const int64_t q_pos = anchor_pos + slot;
  const int64_t first = q_pos - p.window + 1 > 0 ? q_pos - p.window + 1 : 0;
  const int64_t n_ctx = anchor_pos > first ? anchor_pos - first : 0;
  const int64_t n_keys = n_ctx + p.block;
  float* qs = smem;                      // [D]
  float* scores = qs + D;                // [max_keys]
  float* red = scores + max_keys(p, anchor_pos);  // [kThreads]
  auto* rows = reinterpret_cast<int32_t*>(red + kThreads);  // [n_ctx] context_row of key j
  const int64_t ld_v = p.ld_block_v > 0 ? p.ld_block_v : hkv * D;

  for (int64_t i = threadIdx.x; i < D; i += kThreads) qs[i] = load_q<kBf16>(p, ((row0 + slot) * H + n) * D + i);
  for (int64_t j = threadIdx.x; j < n_ctx; j += kThreads) rows[j] = context_row(p, block_table, num_blocks, first + j);
  __syncthreads();

  // Scores: one warp per key, the lanes over the dimensions (D <= 256: at most 8 per lane, the
  // loop unrolled so a key's loads are all in flight at once; the same sum order as a plain
  // loop over i = lane, lane + 32, ...). Two keys per iteration for more loads in flight.
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll 2
  for (int64_t j = warp; j < n_keys; j += kWarps) {
    float dot = 0.0f;
    bool held = true;
    if (j < n_ctx) {
      const int32_t row = rows[j];
      held = row >= 0;
      if (held) {
        const int64_t off = (static_cast<int64_t>(row) * hkv + g) * D;
#pragma unroll
        for (int e = 0; e < kMaxDimsPerLane; ++e) {
          const int64_t i = lane + 32 * e;
          if (i < D) {
            const float kv = kBf16 ? bf16_to_f32(cache_k_bf16[off + i]) : p.cache_k[off + i];
            dot += qs[i] * kv;
          }
        }
      }
    } else {
      const int64_t off = ((row0 + j - n_ctx) * hkv + g) * D;
#pragma unroll
      for (int e = 0; e < kMaxDimsPerLane; ++e) {
        const int64_t i = lane + 32 * e;
        if (i < D) {
          const float kv = kBf16 ? bf16_to_f32(p.block_k_bf16[off + i]) : p.block_k[off + i];
          dot += qs[i] * kv;
        }
      }
    }
    for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) scores[j] = held ? dot * p.scale : -INFINITY;
  }
  __syncthreads();

  // Softmax in float32 with max subtraction (the block keys are always there, so mx is finite).
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n_keys; j += kThreads) mx = fmaxf(mx, scores[j]);
  mx = block_reduce<true>(mx, red);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n_keys; j += kThreads) {
    const float e = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum, red);
  for (int64_t j = threadIdx.x; j < n_keys; j += kThreads) scores[j] /= sum;
  __syncthreads();

  // Values: one warp per key as for the scores, lane on the dimensions lane + 32·e (a warp reads
  // the key's whole row, coalesced, per iteration; a thread walks n_keys / 8 keys, not n_keys /
  // (256 / D)); each warp's partial sums to shared memory, summed over the warps in a fixed
  // order.
  float* vpart = reinterpret_cast<float*>(rows + max_keys(p, anchor_pos));  // [kWarps, D]
  float acc[kMaxDimsPerLane];
#pragma unroll
  for (int e = 0; e < kMaxDimsPerLane; ++e) acc[e] = 0.0f;
#pragma unroll 2
  for (int64_t j = warp; j < n_keys; j += kWarps) {
    const float w = scores[j];
    if (w == 0.0f) continue;  // the same key for the whole warp
    if (j < n_ctx) {
      const int64_t off = (static_cast<int64_t>(rows[j]) * hkv + g) * D;
#pragma unroll
      for (int e = 0; e < kMaxDimsPerLane; ++e) {
        const int64_t i = lane + 32 * e;
        if (i < D) {
          const float v = kBf16 ? bf16_to_f32(cache_v_bf16[off + i]) : p.cache_v[off + i];
          acc[e] += w * v;
        }
      }
    } else {
      const float* vrow = p.block_v + (row0 + j - n_ctx) * ld_v + g * D;
#pragma unroll
      for (int e = 0; e < kMaxDimsPerLane; ++e) {
        const int64_t i = lane + 32 * e;
        if (i < D) {
          const float raw = vrow[i];
          // bf16: what a cache write would store.
          const float v = kBf16 ? bf16_to_f32(f32_to_bf16(raw)) : raw;
          acc[e] += w * v;
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kMaxDimsPerLane; ++e) {
    const int64_t i = lane + 32 * e;
    if (i < D) vpart[warp * D + i] = acc[e];
  }
  __syncthreads();
  if (threadIdx.x < D) {
    const int64_t d = threadIdx.x;
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += vpart[w * D + d];
    const int64_t at = ((row0 + slot) * H + n) * D + d;
    if constexpr (kBf16) {
      p.out_bf16[at] = f32_to_bf16(o);
    } else {
      p.out[at] = o;
    }
  }
}

}  // namespace

int64_t dspark_block_attention_smem_bytes(const DSparkBlockAttentionParams& p) {
  // q, the scores, the reduction buffer (float32), the context rows (int32; max_keys bounds
  // the context keys too) and the warps' partial value sums (float32).
  return (p.head_dim + launch_max_keys(p) + kThreads + kWarps * p.head_dim) *
             static_cast<int64_t>(sizeof(float)) +
         launch_max_keys(p) * static_cast<int64_t>(sizeof(int32_t));
}

Status launch_dspark_block_attention(const DSparkBlockAttentionParams& p, CUstream_st* stream) {
  const std::string who = "[cuda.dspark.block_attention] ";
  const bool bf16 = p.q_bf16 != nullptr;
  if (p.block <= 0 || p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0)
    return invalid_argument(who + "block, heads and KV heads must be positive, heads a multiple "
                                  "of KV heads");
  if (p.head_dim <= 0 || kThreads % p.head_dim != 0)
    return invalid_argument(who + "head_dim " + std::to_string(p.head_dim) +
                            " must divide 256");
  if (p.window < p.block || p.anchor_pos < 0 || p.page_size <= 0)
    return invalid_argument(who + "window below the block, a negative anchor position or page size");
  if (p.num_pages > INT32_MAX / p.page_size)
    return invalid_argument(who + std::to_string(p.num_pages) + " pages of " +
                            std::to_string(p.page_size) + " positions: cache rows past int32");
  const bool batched = p.seqs != nullptr;
  if (batched && (!bf16 || p.num_seqs < 1 || p.num_seqs > 65535))
    return invalid_argument(who + "a batched launch takes the bf16 variant and 1..65535 "
                                  "sequences, got " + std::to_string(p.num_seqs));
  if (p.block_v == nullptr || (!batched && p.num_blocks > 0 && p.block_table == nullptr) ||
      (bf16 ? (p.block_k_bf16 == nullptr || p.out_bf16 == nullptr ||
               (!batched && (p.cache_k_bf16 == nullptr || p.cache_v_bf16 == nullptr)))
            : (p.q == nullptr || p.block_k == nullptr || p.cache_k == nullptr ||
               p.cache_v == nullptr || p.out == nullptr)))
    return invalid_argument(who + "a tensor of the " + (bf16 ? "bf16" : "float32") +
                            " variant is missing");
  const int64_t smem = dspark_block_attention_smem_bytes(p);
  if (smem > 227 * 1024)
    return invalid_argument(who + "window " + std::to_string(p.window) +
                            " needs " + std::to_string(smem) +
                            " bytes of shared memory per CTA, above the 227 KB of one SM");
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.block),
                  static_cast<unsigned>(batched ? p.num_seqs : 1));
  if (bf16) {
    M3_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(dspark_block_attention_kernel<true>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem)));
    dspark_block_attention_kernel<true><<<grid, kThreads, static_cast<size_t>(smem), stream>>>(p);
    M3_CUDA_RETURN_IF_LAUNCH_ERROR(dspark_block_attention_kernel<true>);
  } else {
    M3_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(dspark_block_attention_kernel<false>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem)));
    dspark_block_attention_kernel<false><<<grid, kThreads, static_cast<size_t>(smem), stream>>>(p);
    M3_CUDA_RETURN_IF_LAUNCH_ERROR(dspark_block_attention_kernel<false>);
  }
  return Status::ok();
}

}  // namespace m3::cuda
