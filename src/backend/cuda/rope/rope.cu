// Partial half-split RoPE (float32), in place. The inverse-frequency table is built on the host
// exactly as the CPU backend builds it, and angle/cos/sin/products use the same float operations
// (no FMA contraction), so results match the CPU to the last bit up to cos/sin rounding.
#include <cmath>

#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

constexpr int kMaxHalfFreq = 128;

struct RopeArgs {
  RopeParams p;
  float inv_freq[kMaxHalfFreq];
};

// One block per token; threads over (head, dim < rot_width/2) pairs.
__global__ void rope_kernel(RopeArgs a) {
  const RopeParams& p = a.p;
  const int64_t t = blockIdx.x;
  const int64_t half = p.rot_width / 2, half_freq = p.rotary_dim / 2;
  const float pos = static_cast<float>(p.positions[t]);
  for (int64_t i = threadIdx.x; i < p.h * half; i += blockDim.x) {
    const int64_t h = i / half, d = i % half;
    float* x = p.x + (t * p.h + h) * p.d;
    // Dim d and its partner d + half use frequencies f[d % hf] and f[(d + half) % hf].
    const float a0 = __fmul_rn(a.inv_freq[d % half_freq], pos);
    const float a1 = __fmul_rn(a.inv_freq[(d + half) % half_freq], pos);
    double s0, c0, s1, c1;
    sincos(static_cast<double>(a0), &s0, &c0);
    sincos(static_cast<double>(a1), &s1, &c1);
    const float x0 = x[d], x1 = x[d + half];
    x[d] = __fadd_rn(__fmul_rn(x0, static_cast<float>(c0)), __fmul_rn(-x1, static_cast<float>(s0)));
    x[d + half] = __fadd_rn(__fmul_rn(x1, static_cast<float>(c1)), __fmul_rn(x0, static_cast<float>(s1)));
  }
}

}  // namespace

Status launch_rope(const RopeParams& p, cudaStream_t s) {
  if (p.t == 0) return Status::ok();
  if (p.rot_width % 2 != 0 || p.rot_width > p.d || p.rotary_dim % 2 != 0 || p.rotary_dim <= 0 ||
      p.rotary_dim / 2 > kMaxHalfFreq)
    return invalid_argument("[cuda.rope] bad widths: rotary_dim " + std::to_string(p.rotary_dim) +
                            " rot_width " + std::to_string(p.rot_width) + " d " +
                            std::to_string(p.d));
  RopeArgs a{};
  a.p = p;
  for (int64_t i = 0; i < p.rotary_dim / 2; ++i) {
    float e = static_cast<float>(2 * i) / static_cast<float>(p.rotary_dim);
    a.inv_freq[i] = 1.0f / static_cast<float>(std::pow(p.theta, static_cast<double>(e)));
  }
  rope_kernel<<<static_cast<unsigned>(p.t), 128, 0, s>>>(a);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(rope_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
