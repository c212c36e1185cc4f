// Programmatic dependent launch (Hopper, CUDA >= 12.3; also inside CUDA graphs): a kernel
// launched with `pdl` may start while the kernel before it on the stream is still running, once
// every CTA of that kernel has called pdl_launch_dependents() (or exited). It must call
// pdl_wait() before it reads anything the earlier kernels wrote or writes anything they read;
// pdl_wait() returns once they have completed and their memory is visible. Work that depends on
// neither (streaming weights into L2 or registers) can go before it: that is the point, the
// weight stream of a decode GEMV starts under the previous kernel's tail.
//
// Without the launch attribute both instructions are no-ops, so a kernel can carry them and be
// launched either way. Kernels that precede a PDL launch call pdl_launch_dependents() at their
// start; it only allows the dependent's CTAs to be scheduled (they then wait in pdl_wait()).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace m3::cuda {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// kernel<<<grid, block, smem, stream>>>(args...) in thread-block clusters of `cluster_x` CTAs
// along x (grid.x a multiple of it; 0: no cluster attribute), with the programmatic-serialisation
// attribute when `pdl` (the kernel must then call pdl_wait() as above). Returns the launch's
// error.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_cluster_kernel(bool pdl, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                                  size_t smem, unsigned cluster_x, cudaStream_t stream,
                                  Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_x > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The same without clusters: kernel<<<grid, block, smem, stream>>>(args...).
template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel(bool pdl, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                          size_t smem, cudaStream_t stream, Args&&... args) {
  return launch_cluster_kernel(pdl, kernel, grid, block, smem, 0u, stream,
                               std::forward<Args>(args)...);
}

}  // namespace m3::cuda
