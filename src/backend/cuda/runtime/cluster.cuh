// Thread-block cluster primitives (sm_90): the CTA's rank, stores into another CTA's shared
// memory (distributed shared memory) and the split cluster barrier. Used by the cluster norm
// (norm/add_rms_norm.cu) and the clustered decode attention (attention/sparse_decode_mma.cu).
#pragma once

#include <cstdint>

namespace m3::cuda {

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// Stores v at the address of `local` in the shared memory of cluster CTA `rank`.
__device__ __forceinline__ void st_shared_cluster(const float* local, uint32_t rank, float v) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}
// Stores the 8 bytes v at the address of `local` (8-byte aligned) in cluster CTA `rank`.
__device__ __forceinline__ void st_shared_cluster_u2(const void* local, uint32_t rank, uint2 v) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};" ::"r"(remote), "r"(v.x), "r"(v.y)
               : "memory");
}
// Stores the float4 v at the address of `local` (16-byte aligned) in cluster CTA `rank`.
__device__ __forceinline__ void st_shared_cluster_f4(const void* local, uint32_t rank, float4 v) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}

}  // namespace m3::cuda
