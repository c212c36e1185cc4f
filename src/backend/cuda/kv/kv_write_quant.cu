// Writes T new tokens of one sequence into a bf16 / fp8_e4m3 / fp4_e2m1 paged cache (the float32
// backend's cache under --kv-cache-dtype; quant/kv_quant.h holds the formats). The result is the
// CPU's kv_write bit for bit: the same page-head scale rule (the smallest power of two holding the
// rows so far, reset by row 0), the same re-encoding of earlier rows when it grows, the same
// round-to-nearest-even conversions (core/dtype.h, shared with the CPU).
//
// One block per page-head stream: (tensor, head) with tensor K, V or the index keys. The block
// walks the T tokens in order, since token i + 1 may land in the page token i just wrote and must
// see its scale; the rows of one token are handled by the block's threads together.
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/reduce.cuh"

namespace m3::cuda {
namespace {

constexpr int kThreads = 128;

// Appends `row` of a page-head from `x` (dim floats); the block's threads together, as
// kv_append_row does alone.
__device__ void append_row(KvCacheDtype d, const KvPageHead& ph, int64_t row, const float* x,
                           int64_t dim, float* smem) {
  float a = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) a = fmaxf(a, fabsf(x[i]));
  const float amax = block_max(a, smem);  // every thread gets it
  const bool scaled = kv_has_page_scale(d);
  const float old_s = scaled && row > 0 ? *ph.scale : 0.0f;
  const float need = scaled ? kv_page_scale_for_amax(d, amax) : 0.0f;
  const float s = need > old_s ? need : old_s;
  __syncthreads();  // every thread has read the old scale before thread 0 replaces it
  if (scaled && old_s > 0.0f && s > old_s) {
    const float ratio = s / old_s;
    if (d == KvCacheDtype::kFp8E4M3) {
      for (int64_t e = threadIdx.x; e < row * dim; e += blockDim.x) {
        uint8_t* c = ph.codes + (e / dim) * ph.code_stride + e % dim;
        *c = f32_to_e4m3(e4m3_to_f32(*c) / ratio);
      }
    } else {
      const int64_t nb = dim / kKvFp4BlockSize;
      for (int64_t e = threadIdx.x; e < row * nb; e += blockDim.x) {
        uint8_t* c = ph.block_scales + (e / nb) * ph.block_scale_stride + e % nb;
        *c = f32_to_e4m3(e4m3_to_f32(*c) / ratio);
      }
    }
  }
  uint8_t* codes = ph.codes + row * ph.code_stride;
  if (d == KvCacheDtype::kFp4E2M1) {
    uint8_t* bs = ph.block_scales + row * ph.block_scale_stride;
    for (int64_t b = threadIdx.x; b < dim / kKvFp4BlockSize; b += blockDim.x)
      kv_encode_row(d, x + b * kKvFp4BlockSize, kKvFp4BlockSize, s,
                    codes + b * kKvFp4BlockSize / 2, bs + b);
  } else {
    const int64_t eb = kv_row_code_bytes(d, 1);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      kv_encode_row(d, x + i, 1, s, codes + i * eb, nullptr);
  }
  if (scaled && threadIdx.x == 0) *ph.scale = s;
  __syncthreads();  // the next token's row may read this page-head's scale and rows
}

__global__ void kv_write_quant_kernel(KvWriteParams p) {
  __shared__ float smem[32];
  const KvLayerView& c = p.cache;
  const int64_t hkv = c.num_kv_heads;
  const int64_t stream = blockIdx.x;  // K heads, then V heads, then the index keys
  const bool index = stream == 2 * hkv;
  const int64_t head = index ? 0 : stream % hkv;
  const KvQuantStore& st = index ? c.iq : (stream < hkv ? c.kq : c.vq);
  const int64_t heads = index ? 1 : hkv, dim = index ? c.index_head_dim : c.head_dim;
  const float* src = index ? p.idx_k : (stream < hkv ? p.k : p.v);
  for (int64_t i = 0; i < p.t; ++i) {
    const int64_t pos = p.positions[i];
    const int64_t blk = pos / c.page_size;
    if (pos < 0 || blk >= p.num_blocks) continue;  // uniform over the block
    const int64_t page = p.block_table[blk];
    if (page < 0 || page >= c.num_pages) continue;
    const KvPageHead ph = kv_page_head(c.dtype, st, page, c.page_size, heads, head, dim);
    append_row(c.dtype, ph, pos % c.page_size, src + (i * heads + head) * dim, dim, smem);
  }
}

}  // namespace

Status launch_kv_write_quantised(const KvWriteParams& p, cudaStream_t s) {
  const KvLayerView& c = p.cache;
  if (c.head_dim % kKvFp4BlockSize != 0 || c.index_head_dim % kKvFp4BlockSize != 0)
    return invalid_argument("[cuda.kv_write] head dims must be multiples of 16");
  const bool index = p.idx_k != nullptr;
  if (index && c.iq.codes == nullptr)
    return invalid_argument("[cuda.kv_write] layer has no index-key cache");
  const unsigned streams = static_cast<unsigned>(2 * c.num_kv_heads + (index ? 1 : 0));
  kv_write_quant_kernel<<<streams, kThreads, 0, s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(kv_write_quant_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
