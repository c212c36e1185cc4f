// Kernels of the vision tower on the GPU (model/minimax_m3/cuda/cuda_vision_tower.h): the parts
// that are not GEMMs (those go through PrefillGemm, cuBLASLt bf16 with float32 accumulation).
// Activations that feed a GEMM are bf16; the residual stream, norms, softmax and RoPE are float32.
// This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

// LayerNorm over rows of x: y = (x - mean) / sqrt(var + eps) · w + b (two passes, float32, as the
// CPU tower). Writes y_f32 and / or y_bf16 (either may be null).
struct VisionLayerNormParams {
  const float* x = nullptr;  // [rows, dim]
  const float* w = nullptr;  // [dim]
  const float* b = nullptr;  // [dim]
  float* y_f32 = nullptr;    // [rows, dim] or null (may equal x)
  uint16_t* y_bf16 = nullptr;  // [rows, dim] bf16 bits or null
  int64_t rows = 0, dim = 0;
  float eps = 1e-5f;
};
Status launch_vision_layer_norm(const VisionLayerNormParams& p, CUstream_st* stream);

// out[r, c] = bf16(act(y[r, c] + bias[c])), act = exact (erf) GELU or identity.
Status launch_vision_bias_act_bf16(const float* y, const float* bias, int64_t rows, int64_t cols,
                                   bool gelu, uint16_t* out, CUstream_st* stream);

// x[r, c] += bias[c] (float32, in place).
Status launch_vision_add_bias(float* x, const float* bias, int64_t rows, int64_t cols,
                              CUstream_st* stream);

// From the q|k|v GEMM's float32 output: + bias, 3-D RoPE on q and k (rotate_half over the first
// 2·rope_half dims of each head, the rest passing through), then bf16 q [N, H] and each image's
// K [heads, keys_padded, D] and V^T [heads, D, keys_padded] at its kv_offset.
struct VisionQkvParams {
  const float* qkv = nullptr;      // [N, 3H] (q | k | v)
  const float* bias = nullptr;     // [3H]
  const float* rope_cos = nullptr;  // [N, rope_half]
  const float* rope_sin = nullptr;  // [N, rope_half]
  const int32_t* patch_image = nullptr;  // [N]
  const int64_t* image_start = nullptr;  // [images]: first patch row
  const int64_t* image_keys = nullptr;   // [images]: keys_padded
  const int64_t* image_kv = nullptr;     // [images]: kv_offset
  uint16_t* q = nullptr;   // [N, H] bf16 bits
  uint16_t* k = nullptr;   // per image [heads, keys_padded, D]
  uint16_t* vt = nullptr;  // per image [heads, D, keys_padded]
  int64_t n = 0, heads = 0, head_dim = 0, rope_half = 0;
};
Status launch_vision_qkv(const VisionQkvParams& p, CUstream_st* stream);

// Row softmax of scale · s[r, :cols] to bf16 p[r, :cols]; p[r, cols:ld] = 0 (padding keys).
Status launch_vision_softmax_bf16(const float* s, int64_t rows, int64_t cols, int64_t ld,
                                  float scale, uint16_t* p, CUstream_st* stream);

}  // namespace m3::cuda
