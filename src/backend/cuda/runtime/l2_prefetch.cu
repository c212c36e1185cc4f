#include "backend/cuda/runtime/l2_prefetch.h"

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

constexpr int64_t kPiece = 64 * 1024;  // bytes per bulk prefetch instruction

// Thread i issues the bulk prefetches of pieces i, i + stride, ...
__global__ void l2_prefetch_kernel(const uint8_t* p, int64_t bytes) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i * kPiece < bytes; i += stride) {
    const int64_t off = i * kPiece;
    const uint32_t n = static_cast<uint32_t>(bytes - off < kPiece ? bytes - off : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
  }
}

}  // namespace

Status launch_l2_prefetch(const void* p, int64_t bytes, CUstream_st* stream) {
  if (p == nullptr || bytes <= 0) return Status::ok();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = (a + 15) & ~uintptr_t{15};
  const int64_t n = (bytes - static_cast<int64_t>(b - a)) & ~int64_t{15};
  if (n <= 0) return Status::ok();
  const int64_t pieces = (n + kPiece - 1) / kPiece;
  const unsigned blocks = static_cast<unsigned>(pieces < 128 * 32 ? (pieces + 31) / 32 : 128);
  l2_prefetch_kernel<<<blocks, 32, 0, stream>>>(reinterpret_cast<const uint8_t*>(b), n);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(l2_prefetch_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
