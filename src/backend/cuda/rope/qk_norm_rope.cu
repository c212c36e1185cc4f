#include "backend/cuda/rope/qk_norm_rope.h"

#include <string>

#include "backend/cuda/rope/qk_norm_rope.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

struct Args {
  QkNormRopeParams seg[kQkNormMaxSegments];
  int64_t row_end[kQkNormMaxSegments];  // cumulative t·h: segment s owns rows [end[s-1], end[s])
  int num_segs;
  float inv_freq[qk_norm::kMaxHalfFreq];  // qk_norm::build_inv_freq
};

// One warp per row (token, head) of a segment; the per-head arithmetic is qk_norm::norm_rope_head
// (qk_norm_rope.cuh, shared with the fused attention_inputs kernel).
__global__ void qk_norm_rope_kernel(Args a) {
  __shared__ float y[8][qk_norm::kHeadDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t row = blockIdx.x * int64_t{8} + warp;  // over all segments
  if (row >= a.row_end[a.num_segs - 1]) return;
  int sg = 0;
  while (row >= a.row_end[sg]) ++sg;
  if (sg > 0) row -= a.row_end[sg - 1];  // t·H + h within segment sg
  const QkNormRopeParams& p = a.seg[sg];
  const int64_t ld = p.ld_x > 0 ? p.ld_x : p.h * 128;
  const float* x = p.x + (row / p.h) * ld + (row % p.h) * 128;
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = x[lane + 32 * j];
  const float pos = static_cast<float>(p.positions[row / p.h]);
  uint16_t o[4];
  qk_norm::norm_rope_head(v, p.weight, p.eps, pos, a.inv_freq, p.rotary_dim, p.rot_width, y[warp],
                          lane, o);
  uint16_t* out = p.out + row * 128;
#pragma unroll
  for (int j = 0; j < 4; ++j) out[lane + 32 * j] = o[j];
}

}  // namespace

Status launch_qk_norm_rope_multi(const QkNormRopeParams* segs, int num_segs,
                                 CUstream_st* stream) {
  if (num_segs < 1 || num_segs > kQkNormMaxSegments)
    return invalid_argument("[cuda.qk_norm_rope] 1 to 4 segments, got " + std::to_string(num_segs));
  const QkNormRopeParams& p = segs[0];
  if (p.d != 128 || p.rot_width % 2 != 0 || p.rot_width > p.d || p.rotary_dim % 2 != 0 ||
      p.rotary_dim <= 0 || p.rotary_dim / 2 > 64)
    return invalid_argument("[cuda.qk_norm_rope] needs D = 128 and even rotary widths <= 128");
  Args a{};
  int64_t rows = 0;
  for (int i = 0; i < num_segs; ++i) {
    if (segs[i].d != p.d)
      return invalid_argument("[cuda.qk_norm_rope] segments need the same head dim");
    a.seg[i] = segs[i];
    a.seg[i].t = p.t;  // shared by every segment (see the header)
    a.seg[i].positions = p.positions;
    a.seg[i].rotary_dim = p.rotary_dim;
    a.seg[i].rot_width = p.rot_width;
    a.seg[i].eps = p.eps;
    a.seg[i].theta = p.theta;
    rows += p.t * segs[i].h;
    a.row_end[i] = rows;
  }
  a.num_segs = num_segs;
  if (rows == 0) return Status::ok();
  qk_norm::build_inv_freq(p.theta, p.rotary_dim, a.inv_freq);
  qk_norm_rope_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(a);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(qk_norm_rope_kernel);
  return Status::ok();
}

Status launch_qk_norm_rope(const QkNormRopeParams& p, CUstream_st* stream) {
  return launch_qk_norm_rope_multi(&p, 1, stream);
}

}  // namespace m3::cuda
