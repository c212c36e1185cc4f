#include "read_probe.h"

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda_bench {
namespace {

__global__ void __launch_bounds__(256) read_probe_kernel(const uint4* p, int64_t n, uint32_t* sink) {
  const int64_t per = (n + gridDim.x - 1) / gridDim.x;
  const int64_t b = per * blockIdx.x, e = min(n, b + per);
  uint32_t acc = 0;
  int64_t i = b + threadIdx.x;
  for (; i + 3 * 256 < e; i += 4 * 256) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                   : "l"(p + i + u * 256));
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < e; i += 256) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  __shared__ uint32_t red[256];
  red[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0;
    for (int t = 0; t < 256; ++t) a ^= red[t];
    sink[blockIdx.x] = a;
  }
}

}  // namespace

Status launch_read_probe(const void* p, int64_t bytes, int ctas, uint32_t* sink,
                         CUstream_st* stream) {
  if (bytes <= 0 || bytes % 16 != 0 || (reinterpret_cast<uintptr_t>(p) & 15) != 0 || ctas < 1)
    return invalid_argument("[bench.read_probe] bytes must be a positive multiple of 16, aligned");
  read_probe_kernel<<<ctas, 256, 0, stream>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(read_probe_kernel);
  return Status::ok();
}

}  // namespace m3::cuda_bench
