#include "backend/cuda/norm/add_rms_norm.h"

#include <cuda_fp16.h>

#include "backend/cuda/norm/add_rms_norm_device.cuh"
#include "backend/cuda/runtime/cluster.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

using namespace norm;

// 1024 threads, at most 2 float4 each: every load of a row (residual, delta or its partial
// sources, weight) is issued before the first reduction, so a row costs about one memory latency
// plus the reductions (batch 1 runs one CTA; it was ~5 us with 256 threads and serial loads).
constexpr int kThreads = 1024;
constexpr int kMaxVecPerThread = 2;  // hidden <= 1024 · 2 · 4 = 8192

// One block per token; each thread keeps its float4 pieces of the row in registers between the
// sum of squares and the scaling, so the row is read once.
__global__ void __launch_bounds__(kThreads) add_rms_norm_kernel(AddRmsNormParams p) {
  pdl_launch_dependents();  // a following PDL GEMV may start streaming its weights
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int64_t nv = p.hidden / 4;
  float4* r = reinterpret_cast<float4*>(p.residual + t * p.hidden);
  const float4* d = p.delta ? reinterpret_cast<const float4*>(p.delta + t * p.hidden) : nullptr;
  const bool has_delta = d != nullptr || p.delta_partial != nullptr || p.moe_contrib != nullptr;
  float4 v[kMaxVecPerThread];
  uint2 wv[kMaxVecPerThread];
  const uint2* w = reinterpret_cast<const uint2*>(p.weight);
  // The weight depends on no kernel: requested before the wait for the previous one (a no-op
  // without the programmatic launch attribute).
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < nv) wv[j] = w[i];
  }
  pdl_wait();
  // Every load of the row first (the residual store would otherwise order the second piece's
  // loads after the first piece's: one more memory latency per row).
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < nv) v[j] = row_piece(p, r, d, has_delta, t, i, nv);
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < nv) {
      const float4 x = v[j];
      if (has_delta) r[i] = x;
      ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss))));
    }
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.hidden) + p.eps);
  uint2* o = reinterpret_cast<uint2*>(p.out + t * p.hidden);
  uint2 ob[kMaxVecPerThread];  // the bf16 outputs, kept for the f16 copy
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < nv) {
      ob[j] = norm_piece(v[j], inv, wv[j]);
      o[i] = ob[j];
      m = abs_max_bf16x4(ob[j], m);
    }
  }
  if (p.out_f16 == nullptr) return;
  m = block_max(m, red);
  const int sh = f16_row_shift(m);
  const float s = ldexpf(1.0f, sh);
  if (threadIdx.x == 0) p.out_inv_scale[t] = ldexpf(1.0f, -sh);
  uint2* of = reinterpret_cast<uint2*>(p.out_f16 + t * p.hidden);
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < nv) of[i] = f16_piece(ob[j], s);
  }
}

// ---- Small batches: a cluster of kClusterCtas CTAs per row (thread-block cluster, sm_90), CTA
// `rank` owning float4 pieces [rank · per, (rank + 1) · per) of the row, one per thread, so that
// a row's 24-144 KB (residual, delta or the MoE contributions) are read through 8 SMs instead of
// one. The CTAs' sums of squares and f16 row maxima are exchanged through distributed shared
// memory: each CTA stores its partial into slot `rank` of every CTA of the cluster, then one
// cluster barrier, then every CTA sums the slots in rank order (the same total everywhere).
// H200: 8-layer batch-1 steps ~0.5 % shorter; inside the model a
// norm's duration is set mostly by the next GEMV's weight stream, which starts beside it.
constexpr int kClusterThreads = 256;  // hidden <= 8 · 256 · 4 = 8192

__global__ void __launch_bounds__(kClusterThreads) add_rms_norm_cluster_kernel(AddRmsNormParams p) {
  pdl_launch_dependents();
  // Phase 0 of the cluster barrier: every CTA of the cluster has started (its shared memory may
  // be written remotely) by the time anyone waits on it.
  cluster_arrive_relaxed();
  __shared__ float red[32];
  __shared__ float part_ss[kClusterCtas], part_max[kClusterCtas];
  const uint32_t rank = cluster_ctarank();
  const int64_t t = blockIdx.x / kClusterCtas;
  const int64_t nv = p.hidden / 4, per = nv / kClusterCtas;
  const int64_t i = rank * per + threadIdx.x;
  const bool mine = threadIdx.x < per;
  float4* r = reinterpret_cast<float4*>(p.residual + t * p.hidden);
  const float4* d = p.delta ? reinterpret_cast<const float4*>(p.delta + t * p.hidden) : nullptr;
  const bool has_delta = d != nullptr || p.delta_partial != nullptr || p.moe_contrib != nullptr;
  const uint2 wv = mine ? reinterpret_cast<const uint2*>(p.weight)[i] : make_uint2(0, 0);
  pdl_wait();
  float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (mine) x = row_piece(p, r, d, has_delta, t, i, nv);
  if (mine && has_delta) r[i] = x;
  float ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, x.w * x.w)));
  ss = block_sum(ss, red);
  cluster_wait();  // phase 0
  if (threadIdx.x < kClusterCtas) st_shared_cluster(&part_ss[rank], threadIdx.x, ss);
  cluster_arrive_release();
  cluster_wait();  // phase 1: every partial sum is here
  float total = 0.0f;
#pragma unroll
  for (int c = 0; c < kClusterCtas; ++c) total += part_ss[c];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(p.hidden) + p.eps);
  uint2 ob = make_uint2(0, 0);
  float m = 0.0f;
  if (mine) {
    ob = norm_piece(x, inv, wv);
    reinterpret_cast<uint2*>(p.out + t * p.hidden)[i] = ob;
    m = abs_max_bf16x4(ob, m);
  }
  if (p.out_f16 == nullptr) return;  // uniform over the cluster: no more remote accesses
  m = block_max(m, red);
  if (threadIdx.x < kClusterCtas) st_shared_cluster(&part_max[rank], threadIdx.x, m);
  cluster_arrive_release();
  cluster_wait();  // phase 2: every partial maximum is here
#pragma unroll
  for (int c = 0; c < kClusterCtas; ++c) m = fmaxf(m, part_max[c]);
  const int sh = f16_row_shift(m);
  if (rank == 0 && threadIdx.x == 0) p.out_inv_scale[t] = ldexpf(1.0f, -sh);
  if (mine) reinterpret_cast<uint2*>(p.out_f16 + t * p.hidden)[i] = f16_piece(ob, ldexpf(1.0f, sh));
}

}  // namespace

Status launch_add_rms_norm(const AddRmsNormParams& p, CUstream_st* stream) {
  if (p.t == 0) return Status::ok();
  if (p.hidden % 4 != 0 || p.hidden > int64_t{kThreads} * kMaxVecPerThread * 4)
    return invalid_argument("[cuda.add_rms_norm] hidden " + std::to_string(p.hidden) +
                            " must be a multiple of 4 and at most 8192");
  if ((p.out_f16 == nullptr) != (p.out_inv_scale == nullptr))
    return invalid_argument("[cuda.add_rms_norm] out_f16 and out_inv_scale go together");
  const int sources = (p.delta != nullptr) + (p.delta_partial != nullptr) + (p.moe_contrib != nullptr);
  if (sources > 1)
    return invalid_argument("[cuda.add_rms_norm] at most one of delta, delta_partial, moe_contrib");
  if (p.delta_partial != nullptr && p.delta_slices < 1)
    return invalid_argument("[cuda.add_rms_norm] delta_partial needs delta_slices >= 1");
  if (p.moe_contrib != nullptr && (p.moe_weights == nullptr || p.moe_top_k < 1))
    return invalid_argument("[cuda.add_rms_norm] moe_contrib needs moe_weights and moe_top_k >= 1");
  const bool cluster = p.cluster_rows >= p.t && p.hidden % (4 * kClusterCtas) == 0 &&
                       p.hidden / (4 * kClusterCtas) <= kClusterThreads;
  if (!cluster) {
    M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, add_rms_norm_kernel,
                                          dim3(static_cast<unsigned>(p.t)), dim3(kThreads), 0,
                                          stream, p));
    return Status::ok();
  }
  M3_CUDA_RETURN_IF_ERROR(launch_cluster_kernel(
      p.pdl, add_rms_norm_cluster_kernel, dim3(static_cast<unsigned>(p.t * kClusterCtas)),
      dim3(kClusterThreads), 0, kClusterCtas, stream, p));
  return Status::ok();
}

}  // namespace m3::cuda
