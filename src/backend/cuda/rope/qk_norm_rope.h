// Per-head Gemma RMSNorm followed by partial half-split RoPE, fused, for q, k and the index
// q/k heads of the bf16 real-shape path (m3-architecture.md §2.3, §3.2):
//   y = x / sqrt(mean(x^2) + eps) · (1 + w)   over each head's D dims (float32)
//   rotate dims [0, rot_width) by the position's angles (table f[i] = theta^(-2i/rotary_dim),
//   dim d < rot_width uses f[d mod rotary_dim/2], partner d ± rot_width/2), the rest pass through
//   out = bf16(y)
// One warp per (token, head); D == 128 (checked). This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct QkNormRopeParams {
  const float* x = nullptr;          // [T, H, D] float32 (projection output), token stride ld_x
  int64_t ld_x = 0;                  // elements between tokens; 0 = H·D
  const uint16_t* weight = nullptr;  // [D] bf16 Gemma weight
  const int32_t* positions = nullptr;  // [T]
  uint16_t* out = nullptr;           // [T, H, D] bf16
  int64_t t = 0, h = 0, d = 128;
  int64_t rotary_dim = 64, rot_width = 64;  // even, rot_width <= D, rotary_dim / 2 <= 64
  float eps = 1e-6f;
  double theta = 5e6;
};

Status launch_qk_norm_rope(const QkNormRopeParams& p, CUstream_st* stream);

// Several head groups of the same tokens in one launch (decode: q, k, index q and index k of the
// fused projection are four launches otherwise). Every segment uses segs[0]'s t, positions, d,
// rotary_dim, rot_width, eps and theta; x, ld_x, weight, out and h are per segment. The result
// equals one launch_qk_norm_rope per segment bit for bit (the same kernel; a segment is picked by
// the row index). At most kQkNormMaxSegments segments.
constexpr int kQkNormMaxSegments = 4;
Status launch_qk_norm_rope_multi(const QkNormRopeParams* segs, int num_segs, CUstream_st* stream);

}  // namespace m3::cuda
