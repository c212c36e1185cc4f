#include "backend/cuda/kv/kv_quant_cache.h"

#include <string>

#include "backend/cuda/kv/kv_load.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/reduce.cuh"

namespace m3::cuda {
namespace {

constexpr int kMaxDim = 512;
constexpr int kDequantThreads = 256;

// Where row t goes: page -1 where nothing is written.
struct RowTarget {
  int64_t page = -1, offset = 0;
};

__device__ RowTarget row_target(const KvAppendQuantisedParams& p, int64_t t) {
  RowTarget r;
  const int64_t pos = p.positions[t], s = p.cache.page_size;
  if (pos < 0 || pos / s >= p.max_blocks) return r;
  const int64_t page = p.block_tables[t * p.max_blocks + pos / s];
  if (page < 0 || page >= p.cache.num_pages) return r;
  r.page = page;
  r.offset = pos % s;
  return r;
}

// Whether row t continues the run of row t - 1: the same page, the next row of it.
__device__ bool continues(const RowTarget& prev, const RowTarget& cur) {
  return cur.page >= 0 && prev.page == cur.page && prev.offset + 1 == cur.offset;
}

// One warp per (row, stream), stream = K head, V head or the index key; only the warp of a run's
// first row works, appending the run's rows in order with kv_append_row's arithmetic spread over
// its lanes (the scale kept in a register between the rows: no other warp touches the page-head).
__global__ void __launch_bounds__(32) kv_append_quantised_kernel(KvAppendQuantisedParams p) {
  __shared__ float x[kMaxDim];
  const KvCacheView& c = p.cache;
  const KvCacheDtype d = c.dtype;
  const int lane = threadIdx.x;
  const int64_t t0 = blockIdx.x, hkv = c.num_kv_heads, stream = blockIdx.y;
  const bool index = stream == 2 * hkv;
  const int64_t head = index ? 0 : stream % hkv;
  const int64_t heads = index ? 1 : hkv, dim = index ? c.index_head_dim : c.head_dim;
  const KvQuantStore& st = index ? c.iq : (stream < hkv ? c.kq : c.vq);
  const uint16_t* src = index ? p.idx_k : (stream < hkv ? p.k : p.v);
  RowTarget cur = row_target(p, t0);
  if (cur.page < 0 || (t0 > 0 && continues(row_target(p, t0 - 1), cur))) return;
  const KvPageHead ph = kv_page_head(d, st, cur.page, c.page_size, heads, head, dim);
  float s = cur.offset == 0 ? 0.0f : *ph.scale;  // row 0 starts the page afresh
  for (int64_t t = t0;;) {
    const uint16_t* row = src + (t * heads + head) * dim;
    float a = 0.0f;
    for (int64_t i = lane; i < dim; i += 32) {
      x[i] = bf16_to_f32(row[i]);
      a = fmaxf(a, fabsf(x[i]));
    }
    a = warp_max(a);
    __syncwarp();  // x complete
    const float need = kv_page_scale_for_amax(d, a);
    if (need > s) {
      if (s > 0.0f) {  // re-encode rows [0, offset) under the larger scale (kv_rescale_row)
        const float ratio = need / s;
        if (d == KvCacheDtype::kFp8E4M3) {
          for (int64_t e = lane; e < cur.offset * dim; e += 32) {
            uint8_t* code = ph.codes + (e / dim) * ph.code_stride + e % dim;
            *code = f32_to_e4m3(e4m3_to_f32(*code) / ratio);
          }
        } else {
          const int64_t nb = dim / kKvFp4BlockSize;
          for (int64_t e = lane; e < cur.offset * nb; e += 32) {
            uint8_t* bs = ph.block_scales + (e / nb) * ph.block_scale_stride + e % nb;
            *bs = f32_to_e4m3(e4m3_to_f32(*bs) / ratio);
          }
        }
      }
      s = need;
    }
    uint8_t* codes = ph.codes + cur.offset * ph.code_stride;
    if (d == KvCacheDtype::kFp4E2M1) {
      uint8_t* bs = ph.block_scales + cur.offset * ph.block_scale_stride;
      for (int64_t b = lane; b < dim / kKvFp4BlockSize; b += 32)
        kv_encode_row(d, x + b * kKvFp4BlockSize, kKvFp4BlockSize, s,
                      codes + b * kKvFp4BlockSize / 2, bs + b);
    } else {
      for (int64_t i = lane; i < dim; i += 32) kv_encode_row(d, x + i, 1, s, codes + i, nullptr);
    }
    __syncwarp();  // the row's codes and x are done before the next row rescales or reloads
    if (++t >= p.t) break;
    const RowTarget next = row_target(p, t);
    if (!continues(cur, next)) break;
    cur = next;
  }
  if (lane == 0) *ph.scale = s;
}

// One CTA per (block, tensor): tensor 0 = K, 1 = V, 2 = the index keys; 8 elements per piece.
__global__ void __launch_bounds__(kDequantThreads)
    kv_dequantise_pages_kernel(KvCacheView src, KvCacheView dst, const int32_t* block_table) {
  const int64_t page = block_table[blockIdx.x];
  if (page < 0 || page >= src.num_pages) return;
  const int tensor = static_cast<int>(blockIdx.y);
  const bool index = tensor == 2;
  if (index && !(src.has_index_keys() && dst.idx_k != nullptr)) return;
  const KvQuantStore& st = index ? src.iq : (tensor == 0 ? src.kq : src.vq);
  uint16_t* out = index ? dst.idx_k : (tensor == 0 ? dst.k : dst.v);
  const int64_t heads = index ? 1 : src.num_kv_heads;
  const int64_t dim = index ? src.index_head_dim : src.head_dim;
  const int64_t page_elems = src.page_size * heads * dim;
  for (int64_t q = threadIdx.x; q < page_elems / 8; q += kDequantThreads) {
    const int64_t e = 8 * q, row = e / dim, head = row % heads;
    const float scale = kv_page_scale(st, page, heads, head);
    *reinterpret_cast<uint4*>(out + page * page_elems + e) =
        kv_load8_bf16(src.dtype, st, page * src.page_size * heads + row, dim, e % dim, scale);
  }
}

Status bad(const std::string& what) { return invalid_argument("[cuda.kv_quant_cache] " + what); }

Status check_dims(const KvCacheView& c) {
  if (!c.quantised()) return bad("the cache is not quantised (fp8_e4m3 or fp4_e2m1)");
  for (int64_t dim : {c.head_dim, c.index_head_dim})
    if (dim <= 0 || dim % kKvFp4BlockSize != 0 || dim > kMaxDim)
      return bad("head dims must be positive multiples of 16 up to 512, got " +
                 std::to_string(dim));
  if (c.page_size < 1 || c.num_kv_heads < 1 || c.num_pages < 0)
    return bad("needs page_size >= 1, num_kv_heads >= 1, num_pages >= 0");
  if (c.kq.codes == nullptr || c.vq.codes == nullptr || c.kq.page_scales == nullptr ||
      c.vq.page_scales == nullptr ||
      (c.dtype == KvCacheDtype::kFp4E2M1 &&
       (c.kq.block_scales == nullptr || c.vq.block_scales == nullptr)))
    return bad("null K / V codes or scales");
  return Status::ok();
}

}  // namespace

Status launch_kv_append_quantised(const KvAppendQuantisedParams& p, CUstream_st* stream) {
  M3_RETURN_IF_ERROR(check_dims(p.cache));
  if (p.t < 0 || p.max_blocks < 0) return bad("negative token count or max_blocks");
  if (p.t == 0) return Status::ok();
  if (p.t > 0x7FFFFFFF) return bad("too many rows: " + std::to_string(p.t));
  if (p.k == nullptr || p.v == nullptr || p.positions == nullptr ||
      (p.max_blocks > 0 && p.block_tables == nullptr))
    return bad("null k, v, positions or block_tables");
  const bool index = p.idx_k != nullptr;
  if (index && !p.cache.has_index_keys()) return bad("index keys given, the layer caches none");
  const unsigned streams = static_cast<unsigned>(2 * p.cache.num_kv_heads + (index ? 1 : 0));
  kv_append_quantised_kernel<<<dim3(static_cast<unsigned>(p.t), streams), 32, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(kv_append_quantised_kernel);
  return Status::ok();
}

Status launch_kv_dequantise_pages(const KvCacheView& src, const KvCacheView& dst,
                                  const int32_t* block_table, int64_t num_blocks,
                                  CUstream_st* stream) {
  M3_RETURN_IF_ERROR(check_dims(src));
  if (dst.quantised() || dst.k == nullptr || dst.v == nullptr)
    return bad("the destination must be a bf16 cache with K and V");
  if (dst.num_pages != src.num_pages || dst.page_size != src.page_size ||
      dst.num_kv_heads != src.num_kv_heads || dst.head_dim != src.head_dim ||
      (dst.idx_k != nullptr && dst.index_head_dim != src.index_head_dim))
    return bad("source and destination shapes differ");
  if ((reinterpret_cast<uintptr_t>(dst.k) | reinterpret_cast<uintptr_t>(dst.v) |
       reinterpret_cast<uintptr_t>(dst.idx_k)) % 16 != 0)
    return bad("destination K / V / index keys must be 16-byte aligned");
  if (num_blocks < 0 || num_blocks > 0x7FFFFFFF) return bad("num_blocks out of range");
  if (num_blocks == 0) return Status::ok();
  if (block_table == nullptr) return bad("null block_table");
  kv_dequantise_pages_kernel<<<dim3(static_cast<unsigned>(num_blocks), 3), kDequantThreads, 0,
                               stream>>>(src, dst, block_table);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(kv_dequantise_pages_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
