// Raising a kernel's dynamic shared-memory limit (kernels that need more than the default 48 KB)
// once per device and kernel: a cudaFuncSetAttribute on every launch cost microseconds of host
// time in the decode loop.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace m3::cuda {

template <auto Kernel>
cudaError_t allow_dynamic_smem_once(int bytes) {
  static uint64_t done = 0;  // one bit per device (devices past 64: set on every call)
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (__atomic_load_n(&done, __ATOMIC_ACQUIRE) & bit) != 0) return cudaSuccess;
  if (const cudaError_t e =
          cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      e != cudaSuccess)
    return e;
  __atomic_fetch_or(&done, bit, __ATOMIC_RELEASE);
  return cudaSuccess;
}

}  // namespace m3::cuda
