#include "backend/cuda/dummy/dummy_weights.h"

#include <cuda_runtime.h>

#include "backend/cuda/runtime/cuda_check.h"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Approximately normal: the sum of four uniforms in [-0.5, 0.5), rescaled to unit variance.
__device__ __forceinline__ float normalish(uint64_t h) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) s += float((h >> (16 * i)) & 0xFFFF) * (1.0f / 65536.0f) - 0.5f;
  return s * 1.7320508f;  // var of the sum = 4/12
}

__global__ void fill_kernel(void* dst, int64_t count, DummyKind kind, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = splitmix64(seed * 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(i));
    switch (kind) {
      case DummyKind::kBf16Normal:
        static_cast<uint16_t*>(dst)[i] = f32_to_bf16(normalish(h) * scale);
        break;
      case DummyKind::kF32Normal:
        static_cast<float*>(dst)[i] = normalish(h) * scale;
        break;
      case DummyKind::kE4m3Codes: {
        uint8_t c = static_cast<uint8_t>(h);
        if ((c & 0x7F) == 0x7F) c ^= 0x01;  // never NaN
        static_cast<uint8_t*>(dst)[i] = c;
        break;
      }
      case DummyKind::kE8m0Scales:
        static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(127 - 8 - (h % 4));
        break;
      case DummyKind::kE2m1Packed:
        static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(h);
        break;
      case DummyKind::kE4m3Scales:
        static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(0x30 + (h % 0x40));
        break;
    }
  }
}

}  // namespace

Status fill_dummy(void* dst, int64_t count, DummyKind kind, uint64_t seed, float scale,
                  CUstream_st* stream) {
  if (count <= 0) return Status::ok();
  const int64_t blocks = std::min<int64_t>((count + 255) / 256, 132 * 16);
  fill_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(dst, count, kind, seed, scale);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(fill_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
