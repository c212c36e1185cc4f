#include "backend/cuda/rope/attention_inputs.h"

#include <string>

#include "backend/cuda/kv/kv_slot.cuh"
#include "backend/cuda/rope/qk_norm_rope.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"

namespace m3::cuda {
namespace {

constexpr int kWarps = 4;  // per CTA: M3.1-Flash decode (77 warps per token) fills 20 CTAs at T = 1
constexpr int kD = qk_norm::kHeadDim;

// The head kinds of a token, in warp order.
enum Seg : int { kSegQ = 0, kSegK = 1, kSegIq = 2, kSegIk = 3, kSegV = 4, kNumSegs = 5 };

struct Args {
  AttentionInputsParams p;
  int64_t seg_end[kNumSegs];  // cumulative heads per token: segment s owns [end[s-1], end[s])
  int64_t seg_off[kNumSegs];  // float offset of the segment in a token row
  float inv_freq[qk_norm::kMaxHalfFreq];  // qk_norm::build_inv_freq
};

// v[j] = the projection value at src[32 j] (lane's dims): plane 0 as is for S = 1, else the
// split-K epilogue's sum 0 + p_0 + p_1 + ... + p_{S-1} (slice order; the four dims are
// independent sums, interleaved only so that their loads are in flight together).
__device__ __forceinline__ void load_head(const float* src, int64_t num_slices, int64_t plane,
                                          float (&v)[4]) {
  if (num_slices == 1) {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = src[32 * j];
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = 0.0f;
#pragma unroll 4
  for (int64_t s = 0; s < num_slices; ++s) {
    float x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = src[s * plane + 32 * j];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __fadd_rn(v[j], x[j]);
  }
}

// One warp per (token, head); row = token · heads_per_token + head.
__global__ void __launch_bounds__(kWarps * 32) attention_inputs_kernel(Args a) {
  __shared__ float y[kWarps][kD];
  const AttentionInputsParams& p = a.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t per_token = a.seg_end[kNumSegs - 1];
  const int64_t row = blockIdx.x * int64_t{kWarps} + warp;
  if (row >= p.t * per_token) return;
  const int64_t tok = row / per_token;
  int64_t h = row % per_token;
  int sg = 0;
  while (h >= a.seg_end[sg]) ++sg;
  if (sg > 0) h -= a.seg_end[sg - 1];  // head within segment sg
  // The position and the block table are inputs of the step (no kernel writes them): the
  // position -> table -> slot chain runs before the wait, under the GEMV this kernel follows, so
  // that after it only the projection's loads are on the critical path.
  const int32_t pos = p.positions[tok];
  const KvCacheView& c = p.cache;
  // Cache rows written by this warp's head kind (K, V: Hkv·D per slot; index key: Dix).
  // A quantised cache is written afterwards from k_out / v_out / ik_out
  // (launch_kv_append_quantised): a page-head's rows are encoded under one scale, in order.
  int64_t slot = -1;
  if (!c.quantised() && (sg == kSegK || sg == kSegV || (sg == kSegIk && c.idx_k != nullptr)))
    slot = kv_cache_slot(c, p.block_tables, p.max_blocks, tok, pos);
  // The norm weight's factors and the rotation's sin / cos (a weight load and a double-precision
  // sincos per dim) depend only on the layer and the position: computed under the GEMV too, not
  // after the projection's loads.
  const uint16_t* weight = sg == kSegQ    ? p.q_norm
                           : sg == kSegK  ? p.k_norm
                           : sg == kSegIq ? p.iq_norm
                                          : p.ik_norm;
  qk_norm::HeadFactors f;
  if (sg != kSegV)
    qk_norm::head_factors(weight, static_cast<float>(pos), a.inv_freq, p.rotary_dim, p.rot_width,
                          lane, f);
  pdl_wait();  // everything below reads the GEMV's output or writes what later kernels read
  // Dependents (the indexer's scoring, or the split attention) may be scheduled from here on,
  // not before: launched at this kernel's start they would sit resident beside the q/k/v GEMV's
  // stream, and what they do before their own wait (loading the index keys of earlier
  // positions) is better done under this kernel's few microseconds than under that stream.
  pdl_launch_dependents();

  float v[4];
  load_head(p.partial + tok * p.ld + a.seg_off[sg] + h * kD + lane, p.num_slices, p.t * p.ld, v);
  if (sg == kSegV) {
    uint16_t* dst[2] = {slot < 0 ? nullptr : c.v + slot * (c.num_kv_heads * kD) + h * kD + lane,
                        p.v_out == nullptr ? nullptr
                                           : p.v_out + (tok * p.num_kv_heads + h) * kD + lane};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (dst[i] == nullptr) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) dst[i][32 * j] = f32_to_bf16(v[j]);
    }
    return;
  }
  uint16_t o[4];
  qk_norm::norm_rope_finish(v, f, p.eps, p.rot_width, y[warp], lane, o);
  uint16_t* dst[2] = {nullptr, nullptr};
  switch (sg) {
    case kSegQ:
      dst[0] = p.q_out + (tok * p.num_q_heads + h) * kD;
      break;
    case kSegIq:
      dst[0] = p.iq_out + (tok * p.num_index_heads + h) * kD;
      break;
    case kSegK:
      if (p.k_out != nullptr) dst[0] = p.k_out + (tok * p.num_kv_heads + h) * kD;
      if (slot >= 0) dst[1] = c.k + slot * (c.num_kv_heads * kD) + h * kD;
      break;
    default:  // kSegIk
      if (p.ik_out != nullptr) dst[0] = p.ik_out + tok * kD;
      if (slot >= 0) dst[1] = c.idx_k + slot * kD;
      break;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (dst[i] == nullptr) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) dst[i][lane + 32 * j] = o[j];
  }
}

Status bad(const std::string& what) {
  return invalid_argument("[cuda.attention_inputs] " + what);
}

}  // namespace

Status launch_attention_inputs(const AttentionInputsParams& p, CUstream_st* stream) {
  const bool indexer = p.num_index_heads > 0;
  if (p.t < 0) return bad("negative token count " + std::to_string(p.t));
  if (p.num_slices < 1) return bad("num_slices must be >= 1, got " + std::to_string(p.num_slices));
  if (p.head_dim != kD || (indexer && p.index_head_dim != kD))
    return bad("needs head_dim = index_head_dim = 128, got " + std::to_string(p.head_dim) + " / " +
               std::to_string(p.index_head_dim));
  if (p.num_q_heads < 1 || p.num_kv_heads < 1 || p.num_index_heads < 0)
    return bad("needs >= 1 q and kv heads and >= 0 index heads");
  if (p.rot_width % 2 != 0 || p.rot_width < 0 || p.rot_width > kD || p.rotary_dim % 2 != 0 ||
      p.rotary_dim <= 0 || p.rotary_dim / 2 > qk_norm::kMaxHalfFreq)
    return bad("needs even rotary widths, rot_width <= 128, 0 < rotary_dim <= 128");
  // Every segment inside a token row.
  struct SegCheck {
    const char* name;
    int64_t off, len;
  };
  const SegCheck segs[] = {{"q", p.off_q, p.num_q_heads * kD},
                           {"k", p.off_k, p.num_kv_heads * kD},
                           {"v", p.off_v, p.num_kv_heads * kD},
                           {"index q", p.off_iq, indexer ? p.num_index_heads * kD : 0},
                           {"index k", p.off_ik, indexer ? kD : 0}};
  for (const SegCheck& s : segs)
    if (s.len > 0 && (s.off < 0 || s.off + s.len > p.ld))
      return bad(std::string(s.name) + " segment [" + std::to_string(s.off) + ", " +
                 std::to_string(s.off + s.len) + ") outside the row of ld = " +
                 std::to_string(p.ld));
  const KvCacheView& c = p.cache;
  if (c.num_kv_heads != p.num_kv_heads || c.head_dim != p.head_dim)
    return bad("cache has " + std::to_string(c.num_kv_heads) + " x " + std::to_string(c.head_dim) +
               " KV heads, the projection " + std::to_string(p.num_kv_heads) + " x " +
               std::to_string(p.head_dim));
  if (indexer && c.idx_k != nullptr && c.index_head_dim != p.index_head_dim)
    return bad("cache index_head_dim " + std::to_string(c.index_head_dim) + " != " +
               std::to_string(p.index_head_dim));
  if (c.page_size < 1 || c.num_pages < 0) return bad("cache needs page_size >= 1, num_pages >= 0");
  if (p.max_blocks < 0) return bad("negative max_blocks");
  if (p.t == 0) return Status::ok();
  if (p.partial == nullptr || p.positions == nullptr || p.q_out == nullptr || p.q_norm == nullptr ||
      p.k_norm == nullptr || (!c.quantised() && (c.k == nullptr || c.v == nullptr)) ||
      (p.max_blocks > 0 && p.block_tables == nullptr))
    return bad("null partial, positions, q_out, q/k norm weight, cache K/V or block_tables");
  if (c.quantised() && (p.k_out == nullptr || p.v_out == nullptr ||
                        (indexer && c.has_index_keys() && p.ik_out == nullptr)))
    return bad("a quantised cache needs k_out, v_out and (with index keys) ik_out: its rows are "
               "appended from them by launch_kv_append_quantised");
  if (indexer && (p.iq_out == nullptr || p.iq_norm == nullptr || p.ik_norm == nullptr))
    return bad("null iq_out or index q/k norm weight");

  Args a{};
  a.p = p;
  const int64_t ix = indexer ? 1 : 0;
  const int64_t heads[kNumSegs] = {p.num_q_heads, p.num_kv_heads, p.num_index_heads * ix, ix,
                                   p.num_kv_heads};
  const int64_t offs[kNumSegs] = {p.off_q, p.off_k, p.off_iq, p.off_ik, p.off_v};
  int64_t per_token = 0;
  for (int s = 0; s < kNumSegs; ++s) {
    per_token += heads[s];
    a.seg_end[s] = per_token;
    a.seg_off[s] = offs[s];
  }
  qk_norm::build_inv_freq(p.theta, p.rotary_dim, a.inv_freq);
  const int64_t blocks = (p.t * per_token + kWarps - 1) / kWarps;
  if (blocks > 0x7FFFFFFF) return bad("too many tokens: " + std::to_string(p.t));
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, attention_inputs_kernel,
                                        dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0,
                                        stream, a));
  return Status::ok();
}

}  // namespace m3::cuda
