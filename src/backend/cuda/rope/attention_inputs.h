// The attention inputs of T tokens from the fused qkv projection, in one launch (the decode
// path's critical section between the qkv GEMV and the indexer; m3-architecture.md §2.3, §3.2):
//   x    = the projection row of each token, summed over the GEMV's split-K slices
//   q    = bf16(RoPE(GemmaRMSNorm(x[q segment],  q_norm)))      -> q_out  [T, Hq,  D]
//   iq   = bf16(RoPE(GemmaRMSNorm(x[iq segment], iq_norm)))     -> iq_out [T, Hix, Dix]
//   k    = bf16(RoPE(GemmaRMSNorm(x[k segment],  k_norm)))      -> cache.k
//   v    = bf16(x[v segment])                                   -> cache.v
//   ik   = bf16(RoPE(GemmaRMSNorm(x[ik segment], ik_norm)))     -> cache.idx_k (1 head)
// written into token t's page slot block_tables[t · max_blocks + positions[t] / S] (t is the
// sequence: one token per row, as in kv_write_bf16; a -1 page, pos < 0 or a block past
// max_blocks writes no K / V / index key).
//
// Bit for bit what the three-launch sequence produces:
//   launch_quant_gemv_epilogue(kStoreF32, partial, num_slices, T, n = ld) -> f32 qkv [T, ld]
//   launch_qk_norm_rope_multi({q, k, iq, ik} segments of qkv)
//   launch_kv_write_bf16(k, v = qkv + off_v, idx_k)
// (the slice sum is the epilogue's: a = 0; a += partial[s] for s = 0 .. S-1; the norm and RoPE
// are the same device function, rope/qk_norm_rope.cuh; the slot is kv/kv_slot.cuh). With
// num_slices == 1 the buffer is read as is (the tensor-core GEMV's direct output, or a prefill
// GEMM's), i.e. exactly what qk_norm_rope / kv_write_bf16 read from it; a 1-slice split-K
// epilogue would differ from that only where its input is -0.0f (0.0f + -0.0f = +0.0f).
//
// One warp per (token, head) over q, k, index q, index k and v heads (Hq + 2 Hkv + Hix + 1 warps
// per token; M3.1-Flash: 64 + 8 + 4 + 1 = 77), 4 warps per CTA. This header includes no CUDA
// header.
#pragma once

#include <cstdint>

#include "backend/cuda/attention/sparse_decode.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct AttentionInputsParams {
  // The projection: num_slices planes of [T, ld] float32 (plane s at partial + s · T · ld).
  const float* partial = nullptr;
  int64_t num_slices = 1;           // S >= 1; 1 = a plain [T, ld] buffer, read as is
  int64_t ld = 0;                   // floats per token row of a plane (the GEMV's N)
  int64_t t = 0;                    // tokens (decode: sequences), T >= 0
  const int32_t* positions = nullptr;  // [T]
  // Segment offsets (floats into a token row) and head counts. q and k heads have head_dim,
  // index q / k heads index_head_dim; both must be 128. The index key has one head (none when
  // num_index_heads == 0, a layer without an indexer: iq_out, iq_norm, ik_norm then unused).
  int64_t off_q = 0, off_k = 0, off_v = 0, off_iq = 0, off_ik = 0;
  int64_t num_q_heads = 0, num_kv_heads = 0, num_index_heads = 0;
  int64_t head_dim = 128, index_head_dim = 128;
  // Gemma RMSNorm weights, bf16 [head_dim] / [index_head_dim] (y = x̂ · (1 + w)).
  const uint16_t* q_norm = nullptr;
  const uint16_t* k_norm = nullptr;
  const uint16_t* iq_norm = nullptr;
  const uint16_t* ik_norm = nullptr;
  // Partial half-split RoPE, as QkNormRopeParams: even, rot_width <= 128, 2 <= rotary_dim <= 128.
  int64_t rotary_dim = 64, rot_width = 64;
  float eps = 1e-6f;
  double theta = 5e6;
  // Outputs.
  uint16_t* q_out = nullptr;        // [T, Hq, D] bf16
  uint16_t* iq_out = nullptr;       // [T, Hix, Dix] bf16
  uint16_t* k_out = nullptr;        // optional [T, Hkv, D] bf16 (every token, page or not)
  uint16_t* ik_out = nullptr;       // optional [T, Dix] bf16
  uint16_t* v_out = nullptr;        // optional [T, Hkv, D] bf16
  // num_kv_heads / head_dim must match; idx_k nullptr = the index key is not cached (as
  // kv_write_bf16). A quantised cache (fp8_e4m3 / fp4_e2m1) is not written here: k_out, v_out
  // and (on a layer with index keys) ik_out are then required, and the caller appends them with
  // launch_kv_append_quantised (kv/kv_quant_cache.h).
  KvCacheView cache;
  const int32_t* block_tables = nullptr;  // [T, max_blocks] page ids, -1 = none
  int64_t max_blocks = 0;
  // Programmatic dependent launch (runtime/pdl.cuh): the kernel may start under the GEMV's tail
  // and waits for it before reading `partial`; positions and block_tables (inputs of the step,
  // which no kernel writes) are read before that wait. Results are the same either way.
  bool pdl = false;
};

// Checks the parameters (invalid_argument naming [cuda.attention_inputs]); T == 0 launches
// nothing.
Status launch_attention_inputs(const AttentionInputsParams& p, CUstream_st* stream);

}  // namespace m3::cuda
