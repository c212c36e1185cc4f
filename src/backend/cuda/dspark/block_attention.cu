#include "backend/cuda/dspark/block_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

constexpr int kThreads = 256;  // 16 x 16 threads: row groups x key (or dimension) lanes
constexpr int kTileKeys = kDSparkAttentionTileKeys;

// One sequence's inputs: seqs[z] in a batched launch, else the parameters' own fields.
struct SeqInputs {
  const void* cache_k;
  const void* cache_v;
  const int32_t* block_table;
  int64_t num_blocks, anchor_pos;
};

__device__ inline SeqInputs seq_inputs(const DSparkBlockAttentionParams& p, int z) {
  if (p.seqs != nullptr) {
    const DSparkBlockAttentionSeq& s = p.seqs[z];
    return {s.cache_k_bf16, s.cache_v_bf16, s.block_table, s.num_blocks, s.anchor_pos};
  }
  if (p.q_bf16 != nullptr)
    return {p.cache_k_bf16, p.cache_v_bf16, p.block_table, p.num_blocks, p.anchor_pos};
  return {p.cache_k, p.cache_v, p.block_table, p.num_blocks, p.anchor_pos};
}

// Slot 0's context (the most any slot sees): positions [first, anchor) with
// first = max(0, anchor - window + 1). Keys 0 .. n_ctx - 1 are those positions, keys n_ctx ..
// n_ctx + B - 1 the block's.
__host__ __device__ inline int64_t context_keys(int64_t anchor_pos, int64_t window) {
  return anchor_pos < window - 1 ? anchor_pos : window - 1;
}

template <typename T>
__device__ inline float widen(T x) {
  if constexpr (sizeof(T) == 2) {
    return bf16_to_f32(x);
  } else {
    return x;
  }
}

// N (a multiple of 4) consecutive floats of shared memory, 16-byte aligned, in float4 loads.
template <int N>
__device__ inline void load_rows(const float* from, float* to) {
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    const float4 x = *reinterpret_cast<const float4*>(from + i);
    to[i] = x.x;
    to[i + 1] = x.y;
    to[i + 2] = x.z;
    to[i + 3] = x.w;
  }
}

// One CTA: rows_per_cta query rows of KV head g (row r = slot x G + h for query head g x G + h)
// against one split of the keys, tile by tile in shared memory: scores on the CUDA cores (each
// K element read once from memory and kRows times from shared memory), an online softmax per row
// (float32, max subtraction), and the weighted value sums; the unnormalised sums, maxima and
// sums go to the workspace for combine_kernel.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) split_kernel(DSparkBlockAttentionParams p,
                                                         DSparkAttentionSplits lay, float* workspace) {
  constexpr int kRows = dspark_attention_rows_per_cta(D);
  constexpr int kRowsPerThread = kRows / 16;  // 8 or 4
  constexpr int kDimsPerThread = D / 16;
  constexpr int kLdK = D + 1;                 // odd: lanes reading one column of 16 rows hit 16 banks
  constexpr int kLdQ = kRows + 4;             // float4-aligned rows, 4 banks apart
  constexpr int kLdP = kRows + 4;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte cache load
  extern __shared__ float4 smem4[];
  float* qt = reinterpret_cast<float*>(smem4);  // [D][kLdQ]: q transposed
  float* ks = qt + D * kLdQ;                    // [kTileKeys][kLdK]
  float* vs = ks + kTileKeys * kLdK;            // [kTileKeys][kLdK]
  float* pt = vs + kTileKeys * kLdK;            // [kTileKeys][kLdP]: scores, then weights
  float* row_m = pt + kTileKeys * kLdP;         // [kRows] running max
  float* row_l = row_m + kRows;                 // [kRows] running sum
  float* row_alpha = row_l + kRows;             // [kRows] this tile's rescale of the sums
  auto* row_first = reinterpret_cast<int32_t*>(row_alpha + kRows);  // [kRows] first visible position
  int32_t* key_src = row_first + kRows;   // [kTileKeys] cache row, -1 nothing, -2 - b block key b
  int32_t* key_pos = key_src + kTileKeys;  // [kTileKeys] position (INT32_MAX block, INT32_MIN none)

  const int tid = static_cast<int>(threadIdx.x);
  const int z = static_cast<int>(blockIdx.z);
  const int64_t split = blockIdx.x;
  const int64_t g = blockIdx.y / lay.chunks, chunk = blockIdx.y % lay.chunks;
  const int64_t hkv = p.num_kv_heads, group = p.num_heads / hkv;
  const SeqInputs in = seq_inputs(p, z);
  const int64_t n_ctx = context_keys(in.anchor_pos, p.window);
  const int64_t first = in.anchor_pos - n_ctx;
  const int64_t n_keys = n_ctx + p.block;
  const int64_t key_begin = split * lay.keys_per_split;
  if (key_begin >= n_keys) return;  // the whole CTA: combine_kernel skips this split too
  const int64_t key_end = min(key_begin + lay.keys_per_split, n_keys);
  const int64_t row0 = static_cast<int64_t>(z) * p.block;  // this sequence's block rows
  const int64_t ld_v = p.ld_block_v > 0 ? p.ld_block_v : hkv * D;
  const T* cache_k = static_cast<const T*>(in.cache_k);
  const T* cache_v = static_cast<const T*>(in.cache_v);
  const T* q = sizeof(T) == 2 ? reinterpret_cast<const T*>(p.q_bf16) : reinterpret_cast<const T*>(p.q);
  const T* block_k = sizeof(T) == 2 ? reinterpret_cast<const T*>(p.block_k_bf16)
                                    : reinterpret_cast<const T*>(p.block_k);

  // The chunk's q rows (zeros past the last row) and each row's first visible context position.
  for (int64_t e = tid; e < kRows * D; e += kThreads) {
    const int64_t r = e / D, d = e % D, rr = chunk * kRows + r;
    float v = 0.0f;
    if (rr < lay.rows) {
      const int64_t slot = rr / group, n = g * group + rr % group;
      v = widen(q[((row0 + slot) * p.num_heads + n) * D + d]);
    }
    qt[d * kLdQ + r] = v;
  }
  for (int r = tid; r < kRows; r += kThreads) {
    const int64_t rr = chunk * kRows + r;
    // Slot k sees context positions j >= anchor + k - window + 1; a row past the last sees only
    // the block (and has q = 0).
    row_first[r] = rr < lay.rows ? static_cast<int32_t>(in.anchor_pos + rr / group - p.window + 1)
                                 : INT32_MAX;
    row_m[r] = -INFINITY;
    row_l[r] = 0.0f;
  }

  const int ty = tid / 16, tx = tid % 16;
  float acc[kRowsPerThread][kDimsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) acc[r][j] = 0.0f;

  for (int64_t tile = key_begin; tile < key_end; tile += kTileKeys) {
    // Where each key of the tile comes from (once per key, not per element).
    if (tid < kTileKeys) {
      const int64_t kk = tile + tid;
      int32_t src = -1, pos = INT32_MIN;  // no row: seen by no query
      if (kk < key_end && kk < n_ctx) {
        const int64_t at = first + kk, blk = at / p.page_size;
        const int32_t page = blk < in.num_blocks ? in.block_table[blk] : -1;
        if (page >= 0 && page < p.num_pages) {
          src = static_cast<int32_t>(static_cast<int64_t>(page) * p.page_size + at % p.page_size);
          pos = static_cast<int32_t>(at);
        }
      } else if (kk < key_end) {
        src = -2 - static_cast<int32_t>(kk - n_ctx);
        pos = INT32_MAX;
      }
      key_src[tid] = src;
      key_pos[tid] = pos;
    }
    __syncthreads();

    // K and V to shared memory in float32: cache rows in 16-byte loads, the block's rows (V as
    // the float32 projection, rounded to bf16 in the bf16 variant as a cache write would store
    // it), zeros for keys without a row (their weight is 0, and 0 x garbage could be NaN).
    constexpr int kVecsPerRow = D / kVec;
    for (int e = tid; e < kTileKeys * kVecsPerRow; e += kThreads) {
      const int key = e / kVecsPerRow, d0 = (e % kVecsPerRow) * kVec;
      const int32_t src = key_src[key];
      float kf[kVec], vf[kVec];
      if (src >= 0) {
        const int64_t off = (static_cast<int64_t>(src) * hkv + g) * D + d0;
        const uint4 kraw = *reinterpret_cast<const uint4*>(cache_k + off);
        const uint4 vraw = *reinterpret_cast<const uint4*>(cache_v + off);
        const T* kx = reinterpret_cast<const T*>(&kraw);
        const T* vx = reinterpret_cast<const T*>(&vraw);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          kf[i] = widen(kx[i]);
          vf[i] = widen(vx[i]);
        }
      } else if (src == -1) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) kf[i] = vf[i] = 0.0f;
      } else {
        const int64_t b = -2 - src;
        const T* kr = block_k + ((row0 + b) * hkv + g) * D + d0;
        const float* vr = p.block_v + (row0 + b) * ld_v + g * D + d0;
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          kf[i] = widen(kr[i]);
          vf[i] = sizeof(T) == 2 ? bf16_to_f32(f32_to_bf16(vr[i])) : vr[i];
        }
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        ks[key * kLdK + d0 + i] = kf[i];
        vs[key * kLdK + d0 + i] = vf[i];
      }
    }
    __syncthreads();

    // Scores: thread (ty, tx) takes rows ty x R .. + R - 1 and keys tx + 16 i, the dot over d in
    // order (q from its transposed rows in float4s, K a column read by 16 lanes in 16 banks).
    {
      float s[kRowsPerThread][4];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[r][i] = 0.0f;
#pragma unroll 4
      for (int d = 0; d < D; ++d) {
        float qv[kRowsPerThread];
        load_rows<kRowsPerThread>(qt + d * kLdQ + ty * kRowsPerThread, qv);
        float kv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) kv[i] = ks[(tx + 16 * i) * kLdK + d];
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[r][i] = fmaf(qv[r], kv[i], s[r][i]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = tx + 16 * i;
        const int32_t pos = key_pos[key];
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) {
          const int row = ty * kRowsPerThread + r;
          pt[key * kLdP + row] = pos >= row_first[row] ? s[r][i] * p.scale : -INFINITY;
        }
      }
    }
    __syncthreads();

    // Online softmax, one thread per row: the tile's max, the weights exp(s - m), the rescale
    // of what was summed before. A row that has seen no key yet keeps m = -inf and weights 0.
    if (tid < kRows) {
      float mt = -INFINITY;
      for (int k = 0; k < kTileKeys; ++k) mt = fmaxf(mt, pt[k * kLdP + tid]);
      const float m_old = row_m[tid], m_new = fmaxf(m_old, mt);
      const float alpha = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
      float sum = 0.0f;
      for (int k = 0; k < kTileKeys; ++k) {
        const float s = pt[k * kLdP + tid];
        const float w = s == -INFINITY ? 0.0f : expf(s - m_new);
        pt[k * kLdP + tid] = w;
        sum += w;
      }
      row_m[tid] = m_new;
      row_l[tid] = row_l[tid] * alpha + sum;
      row_alpha[tid] = alpha;
    }
    __syncthreads();

    // Values: thread (ty, tx) keeps rows ty x R .. and dimensions tx + 16 j.
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const float a = row_alpha[ty * kRowsPerThread + r];
#pragma unroll
      for (int j = 0; j < kDimsPerThread; ++j) acc[r][j] *= a;
    }
#pragma unroll 2
    for (int k = 0; k < kTileKeys; ++k) {
      float w[kRowsPerThread];
      load_rows<kRowsPerThread>(pt + k * kLdP + ty * kRowsPerThread, w);
      float v[kDimsPerThread];
#pragma unroll
      for (int j = 0; j < kDimsPerThread; ++j) v[j] = vs[k * kLdK + tx + 16 * j];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
        for (int j = 0; j < kDimsPerThread; ++j) acc[r][j] = fmaf(w[r], v[j], acc[r][j]);
    }
    __syncthreads();  // the next tile overwrites the keys, values and weights
  }

  const int64_t part = ((static_cast<int64_t>(z) * hkv + g) * lay.chunks + chunk) * lay.splits + split;
  // The partial: the unnormalised output rows [kRows][D], then each row's running max and sum.
  float* out = workspace + part * lay.partial_floats;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j)
      out[(ty * kRowsPerThread + r) * D + tx + 16 * j] = acc[r][j];
  for (int r = tid; r < kRows; r += kThreads) {
    out[kRows * D + 2 * r] = row_m[r];
    out[kRows * D + 2 * r + 1] = row_l[r];
  }
}

// One CTA per (query row, KV head) of a sequence, one thread per dimension: the splits that
// held keys, merged in split order with the global max: out = Σ_s e^(m_s - M) O_s / Σ_s e^(m_s - M) l_s.
template <typename T>
__global__ void combine_kernel(DSparkBlockAttentionParams p, DSparkAttentionSplits lay,
                               const float* workspace) {
  const int z = static_cast<int>(blockIdx.y);
  const int64_t D = p.head_dim, kRows = dspark_attention_rows_per_cta(D);
  const int64_t g = blockIdx.x / lay.rows, rr = blockIdx.x % lay.rows;
  const int64_t d = threadIdx.x;
  const int64_t anchor = p.seqs != nullptr ? p.seqs[z].anchor_pos : p.anchor_pos;
  const int64_t n_keys = context_keys(anchor, p.window) + p.block;
  const int64_t held = (n_keys + lay.keys_per_split - 1) / lay.keys_per_split;
  const int64_t chunk = rr / kRows, r = rr % kRows;
  const int64_t base = ((static_cast<int64_t>(z) * p.num_kv_heads + g) * lay.chunks + chunk) * lay.splits;
  const int64_t stride = lay.partial_floats;
  float m = -INFINITY;
  for (int64_t s = 0; s < held; ++s) m = fmaxf(m, workspace[(base + s) * stride + kRows * D + 2 * r]);
  float l = 0.0f, o = 0.0f;
  for (int64_t s = 0; s < held; ++s) {
    const float* part = workspace + (base + s) * stride;
    const float ms = part[kRows * D + 2 * r];
    if (ms == -INFINITY) continue;  // the row saw no key in this split
    const float f = expf(ms - m);
    l += f * part[kRows * D + 2 * r + 1];
    o += f * part[r * D + d];
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t slot = rr / group, n = g * group + rr % group;
  const int64_t at = ((static_cast<int64_t>(z) * p.block + slot) * p.num_heads + n) * D + d;
  // The block's keys are always visible, so l > 0.
  if constexpr (sizeof(T) == 2) {
    p.out_bf16[at] = f32_to_bf16(o / l);
  } else {
    p.out[at] = o / l;
  }
}

int64_t split_smem_bytes(int64_t head_dim) {
  const int64_t rows = dspark_attention_rows_per_cta(head_dim);
  const int64_t floats = head_dim * (rows + 4) + 2 * kTileKeys * (head_dim + 1) + kTileKeys * (rows + 4) + 3 * rows;
  return floats * 4 + (rows + 2 * kTileKeys) * 4;
}

template <typename T, int D>
Status launch_typed(const DSparkBlockAttentionParams& p, const DSparkAttentionSplits& lay, CUstream_st* stream) {
  const int64_t smem = split_smem_bytes(D);
  M3_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(split_kernel<T, D>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem)));
  const unsigned seqs = static_cast<unsigned>(p.seqs != nullptr ? p.num_seqs : 1);
  const dim3 grid(static_cast<unsigned>(lay.splits),
                  static_cast<unsigned>(p.num_kv_heads * lay.chunks), seqs);
  split_kernel<T, D><<<grid, kThreads, static_cast<size_t>(smem), stream>>>(p, lay, p.workspace);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR((split_kernel<T, D>));
  const dim3 cgrid(static_cast<unsigned>(p.num_kv_heads * lay.rows), seqs);
  combine_kernel<T><<<cgrid, static_cast<unsigned>(D), 0, stream>>>(p, lay, p.workspace);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(combine_kernel<T>);
  return Status::ok();
}

template <typename T>
Status launch_for_head_dim(const DSparkBlockAttentionParams& p, const DSparkAttentionSplits& lay,
                           CUstream_st* stream) {
  switch (p.head_dim) {
    case 16: return launch_typed<T, 16>(p, lay, stream);
    case 32: return launch_typed<T, 32>(p, lay, stream);
    case 64: return launch_typed<T, 64>(p, lay, stream);
    case 128: return launch_typed<T, 128>(p, lay, stream);
    default: return launch_typed<T, 256>(p, lay, stream);
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

Status launch_dspark_block_attention(const DSparkBlockAttentionParams& p, CUstream_st* stream) {
  const std::string who = "[cuda.dspark.block_attention] ";
  const bool bf16 = p.q_bf16 != nullptr;
  if (p.block <= 0 || p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0)
    return invalid_argument(who + "block, heads and KV heads must be positive, heads a multiple "
                                  "of KV heads");
  if (p.head_dim != 16 && p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128 &&
      p.head_dim != 256)
    return invalid_argument(who + "head_dim " + std::to_string(p.head_dim) +
                            " is not one of 16, 32, 64, 128, 256");
  if (p.window < p.block || p.anchor_pos < 0 || p.page_size <= 0)
    return invalid_argument(who + "window below the block, a negative anchor position or page size");
  if (p.num_pages > INT32_MAX / p.page_size)
    return invalid_argument(who + std::to_string(p.num_pages) + " pages of " +
                            std::to_string(p.page_size) + " positions: cache rows past int32");
  // Positions are int32 in the kernel (the window's first position and the block's last).
  if (p.window > kDSparkAttentionMaxWindow || p.anchor_pos > INT32_MAX / 2)
    return invalid_argument(who + "anchor position " + std::to_string(p.anchor_pos) +
                            " or window " + std::to_string(p.window) + " past int32 positions");
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
  if (p.workspace == nullptr)
    return invalid_argument(who + "no workspace (dspark_block_attention_workspace_floats floats)");
  // The kernel reads cache rows in 16-byte loads (a row is head_dim elements, a multiple of 16 B).
  if (!batched && (bf16 ? !aligned16(p.cache_k_bf16) || !aligned16(p.cache_v_bf16)
                        : !aligned16(p.cache_k) || !aligned16(p.cache_v)))
    return invalid_argument(who + "the context cache must be 16-byte aligned");
  const DSparkAttentionSplits lay = dspark_attention_splits(p);
  return bf16 ? launch_for_head_dim<uint16_t>(p, lay, stream)
              : launch_for_head_dim<float>(p, lay, stream);
}

}  // namespace m3::cuda
